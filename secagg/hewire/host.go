package hewire

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg/he"
	"github.com/scellis/scellis/secagg/wire"
)

// Prefix is the path the aggregator mounts a Host at.
const Prefix = "/secagg-he/"

// Errors of Wait besides a round's own diagnostic.
var (
	ErrUnknownRound = errors.New("hewire: no threshold-he round of that ID on this host")
	ErrOver         = errors.New("hewire: the threshold-he round is over and its outcome was taken")
)

// HostOptions tune a Host; the zero value is production.
type HostOptions struct {
	// LongPoll is how long a GET waits before answering 204 (default 20 s).
	LongPoll time.Duration
	// MaxRounds bounds the rounds open at once (default 16: each holds
	// ⌈Dim/8192⌉ ciphertexts of 256 KiB).
	MaxRounds int
}

// Host serves threshold-he rounds: an http.Handler for the paths under
// Prefix, to be served with identity.ServerTLSConfig. Each open round
// holds one he.Aggregator and a goroutine that ends each phase when every
// expected site has answered or the phase's deadline passes (wire's
// Deadlines: Advertise, Share, Mask for ciphertexts, Unmask for each
// decryption attempt). Safe for concurrent use. Lock order: Host.mu, then
// a round's mu.
type Host struct {
	fed  *identity.Federation
	opt  HostOptions
	mux  *http.ServeMux
	quit chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex
	rounds map[string]*hround
	over   map[string]time.Time
	closed bool
}

// NewHost returns a host that authenticates callers against fed.
func NewHost(fed *identity.Federation, opt HostOptions) *Host {
	if opt.LongPoll <= 0 {
		opt.LongPoll = 20 * time.Second
	}
	if opt.MaxRounds <= 0 {
		opt.MaxRounds = 16
	}
	h := &Host{fed: fed, opt: opt, quit: make(chan struct{}), rounds: map[string]*hround{}, over: map[string]time.Time{}}
	h.mux = h.routes()
	return h
}

// ServeHTTP serves the endpoints under Prefix.
func (h *Host) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// hround is one open round.
type hround struct {
	id     string
	p      he.Params
	digest []byte
	agg    *he.Aggregator
	dl     wire.Deadlines
	keys   map[string]ed25519.PublicKey
	kick   chan struct{}
	done   chan struct{}
	abort  chan string

	mu         sync.Mutex
	phase      he.Phase
	changed    chan struct{}
	keyset     []byte
	deliveries map[string][]byte
	req        []byte
	reqAttempt int
	decryptors map[string]bool
	res        *he.Result
	err        error
	taken      bool
	accepted   map[string][32]byte    // site/stage → digest of the accepted body
	posting    map[string]*sync.Mutex // site/stage → held while a post of it is added
	polls      map[string]int         // site → GETs it holds open
	// excused are sites known not to take part (they declined, or their
	// lease lapsed): a phase does not wait for them until its deadline.
	excused map[string]bool
}

// waiting reports whether the phase still waits for a site not excused.
func (rd *hround) waiting() bool {
	missing := rd.agg.Missing()
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for _, s := range missing {
		if !rd.excused[s] {
			return true
		}
	}
	return false
}

func (rd *hround) subject() string { return fmt.Sprintf("threshold-he round %q", rd.id) }

func (rd *hround) poke() {
	select {
	case rd.kick <- struct{}{}:
	default:
	}
}

func (rd *hround) publishLocked(ph he.Phase) {
	rd.phase = ph
	close(rd.changed)
	rd.changed = make(chan struct{})
}

// Open starts round p. Opening it again with equal params is a no-op;
// other params under its ID (SC6104) or an ID already run (SC6103) are
// refused. Members must be silos of the federation (SC6106).
func (h *Host) Open(p he.Params, dl wire.Deadlines) error {
	agg, err := he.NewAggregator(p)
	if err != nil {
		return err
	}
	digest, err := p.Digest()
	if err != nil {
		return err
	}
	def := wire.DefaultDeadlines()
	for _, f := range []struct{ v, d *time.Duration }{{&dl.Advertise, &def.Advertise}, {&dl.Share, &def.Share}, {&dl.Mask, &def.Mask}, {&dl.Unmask, &def.Unmask}} {
		if *f.v <= 0 {
			*f.v = *f.d
		}
	}
	subject := fmt.Sprintf("threshold-he round %q", p.Round)
	keys := map[string]ed25519.PublicKey{}
	var problems diag.List
	for _, m := range p.Members {
		fm, ok := h.fed.Member(m.ID)
		var pk identity.PublicKey
		copy(pk[:], m.Key)
		if !ok || fm.Role != identity.Silo || !fm.PublicKey.Equal(pk) {
			problems = append(problems, diag.New(diag.SecAggWireNotSilo, subject, "member %q is not a silo of federation %q with that key", m.ID, h.fed.Name).
				WithHelp("build the round's members from the federation file"))
		}
		keys[m.ID] = m.Key
	}
	if len(problems) > 0 {
		return problems
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return diag.New(diag.SecAggWireUnavailable, subject, "the threshold-he host is closed")
	}
	if rd, ok := h.rounds[p.Round]; ok {
		if string(rd.digest) == string(digest) {
			return nil
		}
		return diag.New(diag.SecAggWireConflict, subject, "the round is open with other parameters").
			WithHelp("use a fresh round ID for a new round")
	}
	if _, ok := h.over[p.Round]; ok {
		return diag.New(diag.SecAggWireRoundOver, subject, "the round ran already").
			WithHelp("a round ID runs once; open a new round ID")
	}
	if len(h.rounds) >= h.opt.MaxRounds {
		return diag.New(diag.SecAggWireUnavailable, subject, "%d rounds are open, the host's limit", len(h.rounds))
	}
	rd := &hround{id: p.Round, p: p, digest: digest, agg: agg, dl: dl, keys: keys,
		kick: make(chan struct{}, 1), done: make(chan struct{}), abort: make(chan string, 1),
		changed: make(chan struct{}), accepted: map[string][32]byte{}, posting: map[string]*sync.Mutex{}, polls: map[string]int{}, excused: map[string]bool{}}
	h.rounds[p.Round] = rd
	h.wg.Add(1)
	go h.drive(rd)
	return nil
}

// Wait waits for the round's outcome and takes it (once): the sum, or the
// diagnostic the round failed with.
func (h *Host) Wait(ctx context.Context, round string) (*he.Result, error) {
	h.mu.Lock()
	rd, ok := h.rounds[round]
	_, over := h.over[round]
	h.mu.Unlock()
	switch {
	case over:
		return nil, ErrOver
	case !ok:
		return nil, ErrUnknownRound
	}
	select {
	case <-rd.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	rd.mu.Lock()
	res, err, taken := rd.res, rd.err, rd.taken
	rd.taken = true
	rd.mu.Unlock()
	if taken {
		return nil, ErrOver
	}
	return res, err
}

// Excuse tells an open round that site will not take part: phases stop
// waiting for it. Unknown rounds are ignored.
func (h *Host) Excuse(round, site string) {
	h.mu.Lock()
	rd := h.rounds[round]
	h.mu.Unlock()
	if rd == nil {
		return
	}
	rd.mu.Lock()
	rd.excused[site] = true
	rd.mu.Unlock()
	rd.poke()
}

// Abort ends an open round at once without a result.
func (h *Host) Abort(round, reason string) {
	h.mu.Lock()
	rd := h.rounds[round]
	h.mu.Unlock()
	if rd != nil {
		select {
		case rd.abort <- reason:
		default:
		}
	}
}

// Close ends every open round (SC6107) and waits for their goroutines.
func (h *Host) Close() error {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.quit)
	}
	h.mu.Unlock()
	h.wg.Wait()
	return nil
}

// drive runs one round's phases and publishes its outcome.
func (h *Host) drive(rd *hround) {
	defer h.wg.Done()
	err := h.phases(rd)
	rd.mu.Lock()
	if err != nil {
		rd.err = err
		rd.publishLocked(he.PhaseFailed)
	} else {
		rd.publishLocked(he.PhaseDone)
	}
	rd.keyset, rd.deliveries, rd.req = nil, nil, nil
	rd.mu.Unlock()
	close(rd.done)
	// Keep the outcome for late sites and Wait for a while, then forget
	// the round but remember its ID.
	t := time.NewTimer(10 * time.Minute)
	select {
	case <-t.C:
	case <-h.quit:
	}
	t.Stop()
	h.mu.Lock()
	delete(h.rounds, rd.id)
	h.over[rd.id] = time.Now()
	for id, at := range h.over {
		if time.Since(at) > 24*time.Hour {
			delete(h.over, id)
		}
	}
	h.mu.Unlock()
}

func (h *Host) phases(rd *hround) error {
	if err := h.await(rd, rd.dl.Advertise); err != nil {
		return err
	}
	ks, err := rd.agg.EndAdvertise()
	if err != nil {
		return err
	}
	rd.mu.Lock()
	rd.keyset = mustMarshal(ks)
	rd.publishLocked(he.PhaseShare)
	rd.mu.Unlock()

	if err := h.await(rd, rd.dl.Share); err != nil {
		return err
	}
	dels, err := rd.agg.EndShare()
	if err != nil {
		return err
	}
	rd.mu.Lock()
	rd.keyset = nil
	rd.deliveries = map[string][]byte{}
	for _, d := range dels {
		rd.deliveries[d.To] = mustMarshal(d)
	}
	rd.publishLocked(he.PhaseEncrypt)
	rd.mu.Unlock()

	if err := h.await(rd, rd.dl.Mask); err != nil {
		return err
	}
	req, err := rd.agg.EndEncrypt()
	for {
		if err != nil {
			return err
		}
		rd.mu.Lock()
		rd.deliveries = nil
		rd.req, rd.reqAttempt = mustMarshal(req), req.Attempt
		rd.decryptors = map[string]bool{}
		for _, s := range req.Decryptors {
			rd.decryptors[s] = true
		}
		rd.publishLocked(he.PhaseDecrypt)
		rd.mu.Unlock()
		if err := h.await(rd, rd.dl.Unmask); err != nil {
			return err
		}
		var res *he.Result
		res, req, err = rd.agg.EndDecrypt()
		if res != nil {
			rd.mu.Lock()
			rd.res = res
			rd.mu.Unlock()
			return nil
		}
	}
}

// await waits until the phase has heard from every site it waits for, or
// for d; it fails when the host closes or the round is aborted.
func (h *Host) await(rd *hround, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	for rd.waiting() {
		select {
		case <-rd.kick:
		case <-t.C:
			return nil
		case <-h.quit:
			return diag.New(diag.SecAggWireUnavailable, rd.subject(), "the aggregator's threshold-he host closed during the round").
				WithHelp("the round ends without a result; run it again under a new round ID")
		case why := <-rd.abort:
			return diag.New(diag.SecAggWireUnavailable, rd.subject(), "the round was aborted: %s", why).
				WithHelp("the round ends without a result; the aggregator plans it again under a new round ID")
		}
	}
	return nil
}

func mustMarshal(m interface{ Marshal() ([]byte, error) }) []byte {
	b, err := m.Marshal()
	if err != nil {
		panic("hewire: canonical encoding of a message failed: " + err.Error())
	}
	return b
}

func digestOf(b []byte) [32]byte { return sha256.Sum256(b) }
