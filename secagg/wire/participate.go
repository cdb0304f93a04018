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
	"sync"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/transport"
)

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

// Input is what a site puts into a round, for ParticipateWith.
type Input struct {
	// Values is the input vector, encoded onto the ring by the client.
	Values []float64
	// Encoded, when not nil, is the input already on the round's grid
	// (secagg.Client.MaskEncoded), sent instead of Values: the path for
	// differential-privacy noise added on the integers.
	Encoded []int64
	// Weight is the site's weight (weighted rounds).
	Weight float64
	// MinSurvivors, when > 0, makes the site refuse to mask or unmask
	// when fewer sites than that survive (its policy's min_cohort).
	MinSurvivors int
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
	return participateSite(ctx, t, params, id, in.MinSurvivors, func(context.Context) (Input, error) { return in, nil }, true)
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
	return participateSite(ctx, t, params, id, minSurvivors, input, false)
}

// participateSite runs a site's part; inputFirst: input is called (and
// its answer checked) before anything is sent.
func participateSite(ctx context.Context, t transport.Transport, params secagg.Params, id ed25519.PrivateKey, minSurvivors int, input func(context.Context) (Input, error), inputFirst bool) error {
	site, err := siteOf(params, id)
	if err != nil {
		return err
	}
	c, err := secagg.NewClient(params, site, id)
	if err != nil {
		return err
	}
	c.RequireSurvivors(minSurvivors)
	var in Input
	check := func() error {
		if in.Encoded != nil {
			return c.CheckEncoded(in.Encoded, in.Weight)
		}
		return c.CheckInput(in.Values, in.Weight)
	}
	if inputFirst {
		if in, err = input(ctx); err != nil {
			return err
		}
		if err := check(); err != nil {
			return err
		}
	}
	s := newSession(t, params)

	a, err := c.Advertise()
	if err != nil {
		return err
	}
	if err := s.send(ctx, stageAdvert, a); err != nil {
		return err
	}
	b, err := s.fetch(ctx, "key set", "keyset", 2<<10+int64(s.n)<<10)
	if err != nil {
		return err
	}
	ks, err := secagg.ParseKeySet(b)
	if err != nil {
		return err
	}
	sh, err := c.ShareKeys(ks)
	if err != nil {
		return err
	}
	if err := s.send(ctx, stageShares, sh); err != nil {
		return err
	}
	if b, err = s.fetch(ctx, "share delivery", "deliveries/"+url.PathEscape(site), 2<<10+int64(s.n)*1536); err != nil {
		return err
	}
	d, err := secagg.ParseShareDelivery(b)
	if err != nil {
		return err
	}
	if !inputFirst {
		if in, err = input(ctx); err != nil {
			return err
		}
		if err := check(); err != nil {
			return err
		}
	}
	buf := maskBuf.take()
	var m *secagg.MaskedInput
	if in.Encoded != nil {
		m, err = c.MaskEncodedTo(buf, d, in.Encoded, in.Weight)
	} else {
		m, err = c.MaskInputTo(buf, d, in.Values, in.Weight)
	}
	if err != nil {
		maskBuf.give(buf)
		return err
	}
	err = s.send(ctx, stageMasked, m) // marshals m: its buffer is free after
	maskBuf.give(m.Masked)
	if err != nil {
		return err
	}
	if b, err = s.fetch(ctx, "survivor set", "survivors", 1<<10+int64(s.n)*192); err != nil {
		return err
	}
	set, err := secagg.ParseUnmaskRequest(b)
	if err != nil {
		return err
	}
	sig, err := c.SignSurvivors(set)
	if err != nil {
		return err
	}
	if err := s.send(ctx, stageSignature, sig); err != nil {
		return err
	}
	if b, err = s.fetch(ctx, "unmask request", "unmask", 1<<10+int64(s.n)*(192+224)); err != nil {
		return err
	}
	req, err := secagg.ParseUnmaskRequest(b)
	if err != nil {
		return err
	}
	u, err := c.Unmask(req)
	if err != nil {
		return err
	}
	return s.send(ctx, stageUnmasking, u)
}

// maskBuf keeps the last masked vector's buffer for the next round
// (secagg.Client.MaskInputTo), so a site masking a d-vector round after
// round neither allocates nor has the allocator zero 8·d bytes each time.
// One buffer is kept, the largest returned; a round running beside
// another takes none and allocates. What it holds was sent in the clear
// (a masked input), so keeping it exposes nothing.
var maskBuf bufSlot

type bufSlot struct {
	mu sync.Mutex
	b  []byte
}

// take returns the kept buffer (nil if none) and keeps none.
func (s *bufSlot) take() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.b
	s.b = nil
	return b
}

// give keeps b if it is larger than the buffer kept.
func (s *bufSlot) give(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cap(b) > cap(s.b) {
		s.b = b
	}
}

// FetchResult waits for the sum of the round params on the Host at base
// and returns it. Sites of the round and aggregators may fetch it, until
// the reducer takes it (then SC6103). The reducer on the host's own
// aggregator uses Host.Result or Host.Wait instead.
func FetchResult(ctx context.Context, hc *http.Client, base string, params secagg.Params) (*secagg.Result, error) {
	if hc == nil {
		return nil, errors.New("wire: FetchResult needs an *http.Client with mutual TLS")
	}
	s := newSession(transport.HTTPS{Client: hc, Base: base}, params)
	b, err := s.fetch(ctx, "result", "result", 4<<10+8*int64(params.Dim)+int64(s.n)*192)
	if err != nil {
		return nil, err
	}
	return parseResult(b)
}

// siteOf finds the member of p whose key is id's public key.
func siteOf(p secagg.Params, id ed25519.PrivateKey) (string, error) {
	if len(id) != ed25519.PrivateKeySize {
		return "", diag.New(diag.SecAggBadParams, fmt.Sprintf("secure aggregation round %q", p.Round), "the identity key is not an Ed25519 private key").
			WithHelp("pass the site's identity key")
	}
	pub := id.Public().(ed25519.PublicKey)
	for _, m := range p.Members {
		if subtle.ConstantTimeCompare(m.Key, pub) == 1 {
			return m.ID, nil
		}
	}
	return "", diag.New(diag.SecAggUnknownSite, fmt.Sprintf("secure aggregation round %q", p.Round), "this site's identity key is not among the round's members").
		WithHelp("the round was planned without this site; do not send anything")
}

// session is one site's conversation with a round on a Host, over the
// round transport shared with threshold-he (package transport).
type session struct {
	transport.Session
	n int
}

func newSession(t transport.Transport, p secagg.Params) *session {
	return &session{
		Session: transport.Session{T: t, Round: RoundPath(p.Round), Subject: fmt.Sprintf("secure aggregation round %q", p.Round)},
		n:       len(p.Members),
	}
}

// RoundPath is the path of round's endpoints on a Host, ending in "/".
func RoundPath(round string) string {
	return pathRounds + base64.RawURLEncoding.EncodeToString([]byte(round)) + "/"
}

var postPaths = [...]string{"advert", "shares", "masked", "signature", "unmasking"}

// send posts one message until the host accepts it.
func (s *session) send(ctx context.Context, st stage, m interface{ Marshal() ([]byte, error) }) error {
	b, err := m.Marshal()
	if err != nil {
		return err
	}
	return s.Send(ctx, st.String(), postPaths[st], b)
}

// fetch long-polls a GET until its answer is ready.
func (s *session) fetch(ctx context.Context, what, path string, limit int64) ([]byte, error) {
	return s.Fetch(ctx, what, path, limit)
}
