package wire

import (
	"context"
	"net/http"

	"github.com/scellis/scellis/diag"
)

// A scheme is one way of forming a round's secure sum, as the one round
// protocol of Host and the participants carries it: the messages a site
// posts (stages, in the order of the phases that take them), what the
// phases publish for the sites to fetch (gets), and the state machines
// behind both sides (roundState on the host, siteState on a site). All
// else — authentication, retries, long polls, deadlines, dropouts,
// aborts, tombstones, the transports — is the shared part's.
//
// masking (masking.go) is pairwise masking, or SecAgg+ over a sparse
// graph, as the round's secagg.Params choose; thresholdHE
// (thresholdhe.go) is threshold homomorphic encryption (package
// secagg/he).
type scheme struct {
	// name names the scheme in diagnostics: "threshold-he" (round %q).
	name string
	// prefix is the path the host serves the scheme's rounds under.
	prefix string
	// stages begin with the site's advert, its key shares and its
	// contribution (masked input, ciphertext); gets with the key set and
	// the site's delivery of the others' shares: the shared part of a
	// site's round (takePart).
	stages []stage
	gets   []get
	// linger keeps a round on the host for HostOptions.ResultTTL after it
	// ends even once its outcome is taken: its sites learn the outcome
	// from the round itself (threshold-he sites poll for decrypt requests
	// until the sum is open). Otherwise a round is forgotten as its
	// outcome is taken.
	linger bool
	// maxRounds is the bound on the scheme's rounds open at once.
	maxRounds func(HostOptions) int
	// conflicts are the state machine's refusals of a posted message that
	// conflict with what the round holds (409 with the refusal); late, the
	// refusals that mean the site is too late (409, SC6109) besides a
	// message whose phase has ended (see refusal).
	conflicts, late []diag.Code
}

// The stages and gets every scheme begins with, by index (takePart).
const (
	stageAdvert = iota
	stageShares
	stageContribution
)

const (
	getKeySet = iota
	getDelivery
)

// A stage is one kind of message a site posts, the same on both sides.
type stage struct {
	path string // under the round's path: "advert"
	what string // names it in diagnostics: "key advert"
	// phase is the state machine's phase that takes it.
	phase phaseRef
	// big marks a vector (a masked input, a ciphertext): its bodies in
	// memory at once are bounded by HostOptions.MaxInputsInFlight and
	// MaxInputBytesInFlight.
	big bool
	// lastWord: once the round is over, a resend of an accepted one is
	// still answered 204 (a site retrying the message whose answer was
	// lost learns it arrived).
	lastWord bool
	// limit bounds a posted body on a round of n sites and vector size
	// units (roundState.size).
	limit func(n, units int64) int64
	// parse parses a body and returns its sender and the call that adds it
	// to the round's state machine.
	parse func(st roundState, b []byte) (sender string, add func() error, err error)
}

// phaseRef is a state machine's phase (secagg.Phase, he.Phase).
type phaseRef struct {
	ord  int
	name string
}

func phaseOf[P interface {
	~int
	String() string
}](p P) phaseRef {
	return phaseRef{int(p), p.String()}
}

// A get is one thing a phase publishes, fetched with a long poll.
type get struct {
	// pattern is the path under the round's path; a "{site}" segment must
	// name the caller.
	pattern string
	what    string // names it in a site's diagnostics: "key set"
	// aggregators may fetch it too (besides the round's sites).
	aggregators bool
	// bound is the most bytes a site takes in the answer, on a round of n
	// sites and vector size units.
	bound func(n, units int64) int64
	// ready answers the GET once its phase has come, under the round's
	// lock; nil serves the document the phases published under pattern
	// (hostRound.serveDoc).
	ready func(c *call, r *http.Request) reply
}

// parseAdd builds a stage's parse from a message parser, the message's
// sender and the state machine's method that adds it.
func parseAdd[M any, S any](parse func([]byte) (M, error), from func(M) string, add func(S, M) error) func(roundState, []byte) (string, func() error, error) {
	return func(st roundState, b []byte) (string, func() error, error) {
		m, err := parse(b)
		if err != nil {
			return "", nil, err
		}
		return from(m), func() error { return add(st.machine().(S), m) }, nil
	}
}

// roundState is a scheme's side of one round on the host: its state
// machine (secagg.Server, he.Aggregator) and what the phases publish.
type roundState interface {
	// machine is the state machine the stages add messages to.
	machine() any
	// size is the round's sites and vector size, for the stages' limits.
	size() (n, units int64)
	// missing lists the sites the current phase still waits for.
	missing() []string
	// phase is the state machine's phase (its ordinal), and whether the
	// round failed.
	phase() (ph int, failed bool)
	// run ends the round's phases in order, each through r.phase, and
	// publishes what each ends with (hostRound.publish). Its error fails
	// the round.
	run(r *runner) error
	// endLocked drops what the phases published, once the round has
	// ended (under the round's lock).
	endLocked()
}

// siteState is a scheme's side of one round on a site: its state machine
// (secagg.Client, he.Party). Each method returns the canonical bytes of the
// message its phase sends.
type siteState interface {
	// check refuses an input the round cannot carry, before it is sent.
	check(in Input) error
	advert() ([]byte, error)
	share(keySet []byte) ([]byte, error)
	// contribute is the site's input, masked or encrypted, once it holds
	// its delivery of the others' key shares.
	contribute(delivery []byte, in Input) ([]byte, error)
	// conclude runs the phases after the contribution, to the site's end
	// of the round.
	conclude(ctx context.Context, s *session) error
}
