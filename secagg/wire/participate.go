package wire

import (
	"context"
	"crypto/ed25519"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/he"
	"github.com/scellis/scellis/secagg/transport"
)

// Input is what a site puts into a round, for ParticipateWith.
type Input struct {
	// Values is the input vector, encoded onto the ring by the client.
	Values []float64
	// Encoded, when not nil, is the input already on the round's grid
	// (secagg.Client.MaskEncoded), sent instead of Values: the path for
	// differential-privacy noise added on the integers. A threshold-he
	// round takes its integers here.
	Encoded []int64
	// Weight is the site's weight (weighted rounds).
	Weight float64
	// MinSurvivors, when > 0, makes the site refuse to mask or unmask
	// when fewer sites than that survive (its policy's min_cohort).
	MinSurvivors int
}

// Participate takes part in the secure aggregation round params, as the
// site whose identity key is id, against the Host at base (for example
// "https://agg-1.example.org:7400"; the host's paths are appended). It
// drives one secagg.Client through the phases — advertise, share keys,
// send input masked, sign the survivor set, unmask — with long polls, and retries transient
// failures (connection errors, 5xx, the round not open yet) until ctx ends.
// It returns nil once the host has accepted its unmasking; a diagnostic if
// the round failed (every waiting site receives the round's diagnostic,
// e.g. SC6002 when fewer than three sites advertised), if the site dropped
// out (SC6109), if the client refused something (the secagg diagnostic),
// or SC6108 wrapping ctx.Err() when ctx ended first.
//
// hc must authenticate the site with mutual TLS (identity.ClientTLSConfig
// with the site's identity) and pin the aggregator; its Timeout, if any,
// should exceed the host's long poll (20 s by default). The site's ID in
// the round is the member whose key is id's public key. input and weight
// are checked against the round (length, clip, weight range) before
// anything is sent.
//
// What leaves the site: its signed key advert, its Shamir shares encrypted
// to the other sites, its input masked (which the host cannot read alone),
// its signature of the survivor set it was shown (the consistency round),
// and its shares of the other sites' secrets for unmasking — each only as
// produced by the secagg.Client, which refuses to reveal both secrets of
// one site and answers one unmask request. A retry resends the same bytes;
// nothing is drawn anew.
//
// Contract with the privacy ledger (ARCHITECTURE law 6, charge before
// release): call Participate only AFTER the ledger entry paying for input
// is durable. The masked input leaves during the call, and the call cannot
// tell whether the aggregator's sum will use it, so the charge stands
// whatever Participate returns. Call it at most once per update and per
// round ID: sums of one update over two rounds with different sites
// reveal the difference.
func Participate(ctx context.Context, hc *http.Client, base string, params secagg.Params, id ed25519.PrivateKey, input []float64, weight float64) error {
	return ParticipateWith(ctx, hc, base, params, id, Input{Values: input, Weight: weight})
}

// ParticipateWith is Participate with the site's input and its own floor
// on the sites the sum may hold.
func ParticipateWith(ctx context.Context, hc *http.Client, base string, params secagg.Params, id ed25519.PrivateKey, in Input) error {
	if hc == nil {
		return errors.New("wire: Participate needs an *http.Client with the site's mutual TLS config")
	}
	return ParticipateOver(ctx, transport.HTTPS{Client: hc, Base: base}, params, id, in)
}

// ParticipateOver is ParticipateWith over any round transport: HTTPS to
// the host, or a data channel to its aggregator (transport.DataChannel).
func ParticipateOver(ctx context.Context, t transport.Transport, params secagg.Params, id ed25519.PrivateKey, in Input) error {
	return participateMasking(ctx, t, params, id, in.MinSurvivors, func(context.Context) (Input, error) { return in, nil }, true)
}

// ParticipateBeforeInput is ParticipateOver for a site whose input is not
// ready yet: it advertises and shares its keys at once — neither message
// carries anything of the input, only fresh keys and shares of them — and
// calls input only then, to mask what it returns. A silo starts it as soon
// as its policy accepted the round, and hands over its update from input
// once the ledger charge paying for it is durable (law 6), so that the key
// exchange runs while it trains and writes (issue 19). When input returns
// an error the site sends nothing more and returns that error: to the host
// it is a site that dropped out after sharing its keys (its masks with the
// others are removed at unmasking, as for any dropout). minSurvivors is
// Input.MinSurvivors; that of input's answer is ignored.
func ParticipateBeforeInput(ctx context.Context, t transport.Transport, params secagg.Params, id ed25519.PrivateKey, minSurvivors int, input func(context.Context) (Input, error)) error {
	return participateMasking(ctx, t, params, id, minSurvivors, input, false)
}

// participateMasking runs a site's part in a masking round.
func participateMasking(ctx context.Context, t transport.Transport, p secagg.Params, id ed25519.PrivateKey, minSurvivors int, input func(context.Context) (Input, error), inputFirst bool) error {
	c, site, err := machineOf(&masking, p.Round, p.Members, id, minSurvivors, func(site string) (*secagg.Client, error) { return secagg.NewClient(p, site, id) })
	if err != nil {
		return err
	}
	s := newSession(t, &masking, p.Round, site, len(p.Members), maskUnits(p))
	return takePart(ctx, s, &maskSite{c}, input, inputFirst)
}

// ParticipateHE takes part in threshold-he round p as the site whose
// identity key is id, over round transport t (HTTPS to the host, or a data
// channel to its aggregator): advertise, share keys, send y encrypted
// under the collective key, and answer the decrypt requests that name this
// site, until the round has opened its sum (nil), failed (its diagnostic),
// or ctx ends (SC6108). minSurvivors > 0 makes the site refuse to encrypt
// or decrypt with fewer sites (its policy's min_cohort).
//
// As for masking: call it only AFTER the ledger entry paying for y is
// durable (the ciphertext leaves during the call), and at most once per
// update and round.
func ParticipateHE(ctx context.Context, t transport.Transport, p he.Params, id ed25519.PrivateKey, y []int64, minSurvivors int) error {
	c, site, err := machineOf(&thresholdHE, p.Round, p.Members, id, minSurvivors, func(site string) (*he.Party, error) { return he.NewParty(p, site, id) })
	if err != nil {
		return err
	}
	s := newSession(t, &thresholdHE, p.Round, site, len(p.Members), p.Ciphertexts())
	return takePart(ctx, s, &heSite{c: c, site: site}, func(context.Context) (Input, error) { return Input{Encoded: y}, nil }, true)
}

// FetchResult waits for the sum of the masking round params on the Host at
// base and returns it. Sites of the round and aggregators may fetch it,
// until the reducer takes it (then SC6103). The reducer on the host's own
// aggregator uses Host.Result or Host.Wait instead.
func FetchResult(ctx context.Context, hc *http.Client, base string, params secagg.Params) (*secagg.Result, error) {
	if hc == nil {
		return nil, errors.New("wire: FetchResult needs an *http.Client with mutual TLS")
	}
	s := newSession(transport.HTTPS{Client: hc, Base: base}, &masking, params.Round, "", len(params.Members), maskUnits(params))
	b, err := s.fetch(ctx, getResult, "")
	if err != nil {
		return nil, err
	}
	return parseResult(b)
}

// RoundPath is the path of a masking round's endpoints on a Host, ending
// in "/".
func RoundPath(round string) string { return roundPath(&masking, round) }

// takePart runs a site's part in a round, whatever its scheme: the
// exchange every scheme shares — send the advert, fetch the key set, send
// the key shares, fetch the site's delivery of the others', send the
// contribution (masked input, ciphertext) — and then the scheme's own end
// (siteState.conclude). input is called once, and its answer checked,
// before anything is sent (inputFirst) or once the delivery is in: the
// advert and key shares carry nothing of the input. When input fails the
// site sends nothing more and returns that error.
func takePart(ctx context.Context, s *session, st siteState, input func(context.Context) (Input, error), inputFirst bool) error {
	var in Input
	take := func() (err error) {
		if in, err = input(ctx); err != nil {
			return err
		}
		return st.check(in)
	}
	if inputFirst {
		if err := take(); err != nil {
			return err
		}
	}
	a, err := st.advert()
	if err != nil {
		return err
	}
	if err := s.send(ctx, stageAdvert, a); err != nil {
		return err
	}
	if r, ok := st.(revealer); ok {
		if err := r.reveal(ctx, s); err != nil {
			return err
		}
	}
	if err := s.answer(ctx, getKeySet, "", st.share, stageShares); err != nil {
		return err
	}
	err = s.answer(ctx, getDelivery, "", func(delivery []byte) ([]byte, error) {
		if !inputFirst {
			if err := take(); err != nil {
				return nil, err
			}
		}
		return st.contribute(delivery, in)
	}, stageContribution)
	if err != nil {
		return err
	}
	return st.conclude(ctx, s)
}

// revealer is a site state with a phase between the key set and its key
// shares: masking's reveal of the graph's randomness (SecAgg+ on a sparse
// graph).
type revealer interface {
	reveal(ctx context.Context, s *session) error
}

// session is one site's conversation with a round on a Host, over a round
// transport (package transport): its posts and long polls, as its
// scheme's stages and gets say.
type session struct {
	transport.Session
	sch      *scheme
	site     string
	n, units int64 // the round's sites and vector size, for the answers' bounds
}

func newSession(t transport.Transport, sch *scheme, round, site string, n, units int) *session {
	return &session{
		Session: transport.Session{T: t, Round: roundPath(sch, round), Subject: fmt.Sprintf("%s round %q", sch.name, round)},
		sch:     sch, site: site, n: int64(n), units: int64(units),
	}
}

// send posts the message of the scheme's stage i until the host accepts
// it.
func (s *session) send(ctx context.Context, i int, body []byte) error {
	st := &s.sch.stages[i]
	return s.Send(ctx, st.what, st.path, body)
}

// fetch long-polls the scheme's get i (with query, if any) until its answer
// is ready.
func (s *session) fetch(ctx context.Context, i int, query string) ([]byte, error) {
	g := &s.sch.gets[i]
	path := strings.ReplaceAll(g.pattern, "{site}", url.PathEscape(s.site)) + query
	return s.Fetch(ctx, g.what, path, g.bound(s.n, s.units))
}

// answer fetches the scheme's get g (with query, if any), makes the
// site's reply to it with respond, and sends that as stage st.
func (s *session) answer(ctx context.Context, g int, query string, respond func([]byte) ([]byte, error), st int) error {
	b, err := s.fetch(ctx, g, query)
	if err != nil {
		return err
	}
	out, err := respond(b)
	if err != nil {
		return err
	}
	return s.send(ctx, st, out)
}

// respond is a site's reply to a message parsed by parse: its state
// machine's answer f, in canonical bytes.
func respond[M any, R marshaler](parse func([]byte) (M, error), f func(M) (R, error)) func([]byte) ([]byte, error) {
	return func(b []byte) ([]byte, error) {
		m, err := parse(b)
		if err != nil {
			return nil, err
		}
		return marshal(f(m))
	}
}

// roundPath is the path of a round's endpoints on a Host, ending in "/".
func roundPath(sch *scheme, round string) string {
	return sch.prefix + "v1/rounds/" + base64.RawURLEncoding.EncodeToString([]byte(round)) + "/"
}

// siteOf finds the member of a round whose key is id's public key.
func siteOf(sch *scheme, round string, members []secagg.Member, id ed25519.PrivateKey) (string, error) {
	subject := fmt.Sprintf("%s round %q", sch.name, round)
	if len(id) != ed25519.PrivateKeySize {
		return "", diag.New(diag.SecAggBadParams, subject, "the identity key is not an Ed25519 private key").
			WithHelp("pass the site's identity key")
	}
	pub := id.Public().(ed25519.PublicKey)
	for _, m := range members {
		if subtle.ConstantTimeCompare(m.Key, pub) == 1 {
			return m.ID, nil
		}
	}
	return "", diag.New(diag.SecAggUnknownSite, subject, "this site's identity key is not among the round's members").
		WithHelp("the round was planned without this site; do not send anything")
}

// machineOf finds this site among a round's members and builds its state
// machine (newMachine), which refuses sums of fewer than minSurvivors
// sites.
func machineOf[M interface{ RequireSurvivors(int) }](sch *scheme, round string, members []secagg.Member, id ed25519.PrivateKey, minSurvivors int, newMachine func(site string) (M, error)) (M, string, error) {
	var none M
	site, err := siteOf(sch, round, members, id)
	if err != nil {
		return none, "", err
	}
	m, err := newMachine(site)
	if err != nil {
		return none, "", err
	}
	m.RequireSurvivors(minSurvivors)
	return m, site, nil
}

// marshal is m's canonical bytes, or err.
func marshal[M marshaler](m M, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	return m.Marshal()
}
