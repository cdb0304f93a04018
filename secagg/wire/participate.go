package wire

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg"
)

// Participate takes part in the secure aggregation round params, as the
// site whose identity key is id, against the Host at base (for example
// "https://agg-1.example.org:7400"; the host's paths are appended). It
// drives one secagg.Client through the phases — advertise, share keys,
// send input masked, unmask — with long polls, and retries transient
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
	input, weight := in.Values, in.Weight
	if hc == nil {
		return errors.New("wire: Participate needs an *http.Client with the site's mutual TLS config")
	}
	site, err := siteOf(params, id)
	if err != nil {
		return err
	}
	c, err := secagg.NewClient(params, site, id)
	if err != nil {
		return err
	}
	c.RequireSurvivors(in.MinSurvivors)
	check, maskIn := c.CheckInput, c.MaskInput
	if in.Encoded != nil {
		check = func([]float64, float64) error { return c.CheckEncoded(in.Encoded, weight) }
		maskIn = func(d *secagg.ShareDelivery, _ []float64, w float64) (*secagg.MaskedInput, error) {
			return c.MaskEncoded(d, in.Encoded, w)
		}
	}
	if err := check(input, weight); err != nil {
		return err
	}
	s := newSession(hc, base, params)

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
	m, err := maskIn(d, input, weight)
	if err != nil {
		return err
	}
	if err := s.send(ctx, stageMasked, m); err != nil {
		return err
	}
	if b, err = s.fetch(ctx, "unmask request", "unmask", 1<<10+int64(s.n)*192); err != nil {
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

// FetchResult waits for the sum of the round params on the Host at base
// and returns it. Sites of the round and aggregators may fetch it, until
// the reducer takes it (then SC6103). The reducer on the host's own
// aggregator uses Host.Result or Host.Wait instead.
func FetchResult(ctx context.Context, hc *http.Client, base string, params secagg.Params) (*secagg.Result, error) {
	if hc == nil {
		return nil, errors.New("wire: FetchResult needs an *http.Client with mutual TLS")
	}
	s := newSession(hc, base, params)
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

// session is one site's connection to a round on a Host.
type session struct {
	hc    *http.Client
	url   string // …/v1/rounds/{round}/
	round string
	n     int
	dim   int
}

func newSession(hc *http.Client, base string, p secagg.Params) *session {
	dim := p.Dim
	if p.Weighted {
		dim++
	}
	return &session{
		hc:    hc,
		url:   strings.TrimRight(base, "/") + pathRounds + base64.RawURLEncoding.EncodeToString([]byte(p.Round)) + "/",
		round: p.Round, n: len(p.Members), dim: dim,
	}
}

// Polling and retry pacing.
const (
	minPoll     = 100 * time.Millisecond // least time between two long polls
	backoffMin  = 50 * time.Millisecond
	backoffMax  = 2 * time.Second
	maxErrorLen = 64 << 10
)

var postPaths = [...]string{"advert", "shares", "masked", "unmasking"}

// send posts one message until the host accepts it. Every try sends the
// same bytes, so a retry of a message that arrived is recognised as such.
func (s *session) send(ctx context.Context, st stage, m interface{ Marshal() ([]byte, error) }) error {
	b, err := m.Marshal()
	if err != nil {
		return err
	}
	_, err = s.do(ctx, st.String(), http.MethodPost, postPaths[st], b, 0)
	return err
}

// fetch long-polls a GET until its answer is ready.
func (s *session) fetch(ctx context.Context, what, path string, limit int64) ([]byte, error) {
	return s.do(ctx, what, http.MethodGet, path, nil, limit)
}

// do runs one exchange with retries: transient failures back off and try
// again, a GET answered 204 polls again, anything else is the answer.
func (s *session) do(ctx context.Context, what, method, path string, body []byte, limit int64) ([]byte, error) {
	backoff := backoffMin
	var lastErr error
	for {
		t0 := time.Now()
		out, retry, err := s.once(ctx, method, path, body, limit)
		if !retry {
			return out, err
		}
		if ctx.Err() != nil {
			return nil, s.gaveUp(ctx, what, lastErr)
		}
		wait := minPoll - time.Since(t0) // a 204: poll again, but not in a hot loop
		if err != nil {
			lastErr = err
			wait = backoff + rand.N(backoff/2)
			backoff = min(2*backoff, backoffMax)
		} else {
			backoff = backoffMin
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, s.gaveUp(ctx, what, lastErr)
			}
		}
	}
}

// once runs one HTTP exchange. retry with a nil error means "not yet, poll
// again"; retry with an error means a transient failure.
func (s *session) once(ctx context.Context, method, path string, body []byte, limit int64) (out []byte, retry bool, err error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	if err != nil {
		return nil, false, err
	}
	if body != nil {
		req.Header.Set("Content-Type", contentCBOR)
	}
	req.Header.Set("Accept", contentCBOR)
	resp, err := s.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, true, err
		}
		return nil, transient(err), err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK && method == http.MethodGet:
		b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
		if err != nil {
			return nil, true, err // the connection broke mid-body
		}
		if int64(len(b)) > limit {
			return nil, false, diag.New(diag.SecAggMalformed, s.subject(), "%s %s answered more than %d bytes", method, path, limit).
				WithHelp("the aggregator runs other round parameters or an incompatible version")
		}
		return b, false, nil
	case resp.StatusCode == http.StatusNoContent:
		return nil, method == http.MethodGet, nil
	case method == http.MethodPost && resp.StatusCode/100 == 2:
		return nil, false, nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorLen))
	var d struct{ Diagnostics diag.List }
	if json.Unmarshal(b, &d) != nil || len(d.Diagnostics) == 0 {
		err = fmt.Errorf("wire: %s %s: %s: %s", method, resp.Request.URL.Path, resp.Status, bytes.TrimSpace(b))
		return nil, resp.StatusCode >= 500, err
	}
	err = d.Diagnostics
	switch code := d.Diagnostics[0].Code; {
	case code == diag.SecAggWireNoRound: // not opened yet
		return nil, true, err
	case code == diag.SecAggWireUnavailable: // the host closed: the round is lost
		return nil, false, err
	case resp.StatusCode >= 500:
		return nil, true, err
	}
	return nil, false, err
}

func (s *session) subject() string { return fmt.Sprintf("secure aggregation round %q", s.round) }

// gaveUp is SC6108, wrapping ctx's error.
func (s *session) gaveUp(ctx context.Context, what string, last error) error {
	d := diag.New(diag.SecAggWireGaveUp, s.subject(), "gave up waiting for the %s: %v", what, ctx.Err()).
		WithHelp("the round goes on without this site; check the link to the aggregator and that the site's deadline covers the round's phase deadlines")
	if last != nil {
		d.Message += fmt.Sprintf(" (last error: %v)", last)
	}
	return fmt.Errorf("%w: %w", d, ctx.Err())
}

// transient reports whether a failed HTTP exchange is worth retrying: a
// connection refused, reset or timed out is; a TLS handshake the peer
// refused (this site's key is not a member, or the server is not the
// aggregator) or a bad URL is not.
func transient(err error) bool {
	msg := err.Error()
	for _, fatal := range []string{"tls: ", "certificate", "x509", "identity: ", "unsupported protocol scheme", "no Host in request URL"} {
		if strings.Contains(msg, fatal) {
			return false
		}
	}
	return true
}
