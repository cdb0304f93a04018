package transport

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/scellis/scellis/diag"
)

// Session is one site's conversation with one round on its host: it posts
// the site's messages until the host accepts them and long-polls what each
// phase publishes, retrying transient failures with backoff, until its
// context ends.
type Session struct {
	T Transport
	// Round is the round's path on the host, ending in "/"
	// (…/v1/rounds/{round}/); Send and Fetch paths are relative to it.
	Round string
	// Subject names the round in diagnostics ("secure aggregation round
	// \"r-1\"").
	Subject string
}

// Polling and retry pacing.
const (
	minPoll    = 100 * time.Millisecond // least time between two long polls
	backoffMin = 50 * time.Millisecond
	backoffMax = 2 * time.Second
)

// Send posts one message until the host accepts it. Every try sends the
// same bytes, so the host recognises a retry of a message that arrived.
func (s *Session) Send(ctx context.Context, what, path string, body []byte) error {
	_, err := s.do(ctx, what, Request{Method: http.MethodPost, Path: s.Round + path, Body: body})
	return err
}

// Fetch long-polls path until its answer is ready and returns it (at most
// limit bytes, else SC6105).
func (s *Session) Fetch(ctx context.Context, what, path string, limit int64) ([]byte, error) {
	return s.do(ctx, what, Request{Method: http.MethodGet, Path: s.Round + path, Limit: limit})
}

// do runs one exchange with retries: transient failures back off and try
// again, a GET answered 204 polls again, anything else is the answer.
func (s *Session) do(ctx context.Context, what string, req Request) ([]byte, error) {
	backoff := backoffMin
	var lastErr error
	for {
		t0 := time.Now()
		out, retry, err := s.once(ctx, req)
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

// once runs one exchange. retry with a nil error means "not yet, poll
// again"; retry with an error means a transient failure.
func (s *Session) once(ctx context.Context, req Request) (out []byte, retry bool, err error) {
	resp, err := s.T.RoundTrip(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, true, err
		}
		return nil, Transient(err), err
	}
	get := req.Method == http.MethodGet
	switch {
	case resp.Status == http.StatusOK && get:
		if int64(len(resp.Body)) > req.Limit {
			return nil, false, diag.New(diag.SecAggMalformed, s.Subject, "%s %s answered more than %d bytes", req.Method, req.Path, req.Limit).
				WithHelp("the aggregator runs other round parameters or an incompatible version")
		}
		return resp.Body, false, nil
	case resp.Status == http.StatusNoContent:
		return nil, get, nil
	case !get && resp.Status/100 == 2:
		return nil, false, nil
	}
	var d struct{ Diagnostics diag.List }
	if json.Unmarshal(resp.Body, &d) != nil || len(d.Diagnostics) == 0 {
		err = fmt.Errorf("%s %s: %d %s: %s", req.Method, req.Path, resp.Status, http.StatusText(resp.Status), strings.TrimSpace(string(resp.Body)))
		return nil, resp.Status >= 500, err
	}
	err = d.Diagnostics
	switch code := d.Diagnostics[0].Code; {
	case code == diag.SecAggWireNoRound: // not opened yet
		return nil, true, err
	case code == diag.SecAggWireUnavailable: // the host closed: the round is lost
		return nil, false, err
	case resp.Status >= 500:
		return nil, true, err
	}
	return nil, false, err
}

// gaveUp is SC6108, wrapping ctx's error.
func (s *Session) gaveUp(ctx context.Context, what string, last error) error {
	d := diag.New(diag.SecAggWireGaveUp, s.Subject, "gave up waiting for the %s: %v", what, ctx.Err()).
		WithHelp("the round goes on without this site; check the link to the aggregator and that the site's deadline covers the round's phase deadlines")
	if last != nil {
		d.Message += fmt.Sprintf(" (last error: %v)", last)
	}
	return fmt.Errorf("%w: %w", d, ctx.Err())
}

// Transient reports whether a failed exchange is worth retrying: a
// connection refused, reset or timed out is; a TLS handshake the peer
// refused (this site's key is not a member, or the server is not the
// aggregator) or a bad URL is not.
func Transient(err error) bool {
	msg := err.Error()
	for _, fatal := range []string{"tls: ", "certificate", "x509", "identity: ", "unsupported protocol scheme", "no Host in request URL"} {
		if strings.Contains(msg, fatal) {
			return false
		}
	}
	return true
}

// Probe asks t whether the host has a round open: a GET of path (a long
// poll of the round's first phase) is refused at once where the round is
// not open (404) or the host is closed (503); where it is open, the host
// answers or holds the poll, which Probe cuts after wait. Use it over
// HTTPS: a data channel still connecting would look like a held poll.
func Probe(ctx context.Context, t Transport, path string, wait time.Duration) bool {
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	resp, err := t.RoundTrip(pctx, Request{Method: http.MethodGet, Path: path, Limit: MaxErrorLen})
	if err != nil {
		return pctx.Err() == context.DeadlineExceeded && ctx.Err() == nil // held: the round is here
	}
	return resp.Status != http.StatusNotFound && resp.Status != http.StatusServiceUnavailable
}
