package hewire

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
	"strconv"
	"strings"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg/he"
)

// Participate takes part in threshold-he round p as the site whose identity
// key is id, against the Host at base: advertise, share keys, send y
// encrypted under the collective key, and answer the decrypt requests that
// name this site, until the round has opened its sum (nil), failed (its
// diagnostic), or ctx ends (SC6108). minSurvivors > 0 makes the site refuse
// to encrypt or decrypt with fewer sites (its policy's min_cohort).
//
// As for masking: call it only AFTER the ledger entry paying for y is
// durable (the ciphertext leaves during the call), and at most once per
// update and round.
func Participate(ctx context.Context, hc *http.Client, base string, p he.Params, id ed25519.PrivateKey, y []int64, minSurvivors int) error {
	if hc == nil {
		return errors.New("hewire: Participate needs an *http.Client with the site's mutual TLS config")
	}
	site, err := siteOf(p, id)
	if err != nil {
		return err
	}
	c, err := he.NewParty(p, site, id)
	if err != nil {
		return err
	}
	c.RequireSurvivors(minSurvivors)
	if err := c.CheckInput(y); err != nil {
		return err
	}
	s := &session{hc: hc, round: p.Round, url: strings.TrimRight(base, "/") + pathRounds + base64.RawURLEncoding.EncodeToString([]byte(p.Round)) + "/"}
	poly := int64(he.PolyBytes())
	a, err := c.Advertise()
	if err != nil {
		return err
	}
	if err := s.send(ctx, "advert", a); err != nil {
		return err
	}
	b, err := s.fetch(ctx, "keyset", 4<<10+int64(len(p.Members))<<10)
	if err != nil {
		return err
	}
	ks, err := he.ParseKeySet(b)
	if err != nil {
		return err
	}
	sh, err := c.Share(ks)
	if err != nil {
		return err
	}
	if err := s.send(ctx, "shares", sh); err != nil {
		return err
	}
	if b, err = s.fetch(ctx, "delivery", 4<<10+int64(len(p.Members))*(2*poly+1024)); err != nil {
		return err
	}
	d, err := he.ParseDelivery(b)
	if err != nil {
		return err
	}
	ct, err := c.Encrypt(d, y)
	if err != nil {
		return err
	}
	if err := s.send(ctx, "ciphertext", ct); err != nil {
		return err
	}
	for from := 0; ; {
		b, err := s.fetch(ctx, "decrypt?from="+strconv.Itoa(from), 4<<10+int64(len(p.Members))*256+int64(p.Ciphertexts())*(poly+32))
		if ds, ok := diag.As(err); ok && ds[0].Code == diag.SecAggWireRoundOver {
			return nil // the sum is open
		}
		if err != nil {
			return err
		}
		req, err := he.ParseDecryptRequest(b)
		if err != nil {
			return err
		}
		from = req.Attempt + 1
		named := false
		for _, x := range req.Decryptors {
			named = named || x == site
		}
		if !named {
			continue
		}
		share, err := c.Decrypt(req)
		if err != nil {
			return err
		}
		if err := s.send(ctx, "decshare", share); err != nil {
			return err
		}
	}
}

func siteOf(p he.Params, id ed25519.PrivateKey) (string, error) {
	if len(id) == ed25519.PrivateKeySize {
		pub := id.Public().(ed25519.PublicKey)
		for _, m := range p.Members {
			if subtle.ConstantTimeCompare(m.Key, pub) == 1 {
				return m.ID, nil
			}
		}
	}
	return "", diag.New(diag.SecAggUnknownSite, fmt.Sprintf("threshold-he round %q", p.Round), "this site's identity key is not among the round's members").
		WithHelp("the round was planned without this site; do not send anything")
}

type session struct {
	hc    *http.Client
	url   string
	round string
}

func (s *session) send(ctx context.Context, path string, m interface{ Marshal() ([]byte, error) }) error {
	b, err := m.Marshal()
	if err != nil {
		return err
	}
	_, err = s.do(ctx, http.MethodPost, path, b, 0)
	return err
}

func (s *session) fetch(ctx context.Context, path string, limit int64) ([]byte, error) {
	return s.do(ctx, http.MethodGet, path, nil, limit)
}

// do runs one exchange, retrying connection failures, 5xx and "not open
// yet" with backoff, and polling again on 204 for a GET.
func (s *session) do(ctx context.Context, method, path string, body []byte, limit int64) ([]byte, error) {
	backoff := 50 * time.Millisecond
	var last error
	for {
		t0 := time.Now()
		out, retry, err := s.once(ctx, method, path, body, limit)
		if !retry {
			return out, err
		}
		wait := 100*time.Millisecond - time.Since(t0)
		if err != nil {
			last = err
			wait = backoff + rand.N(backoff/2)
			backoff = min(2*backoff, 2*time.Second)
		}
		t := time.NewTimer(max(wait, 0))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			d := diag.New(diag.SecAggWireGaveUp, fmt.Sprintf("threshold-he round %q", s.round), "gave up waiting on %s %s: %v", method, path, ctx.Err()).
				WithHelp("the round goes on without this site; check the link to the aggregator and the phase deadlines")
			if last != nil {
				d.Message += fmt.Sprintf(" (last error: %v)", last)
			}
			return nil, fmt.Errorf("%w: %w", d, ctx.Err())
		}
	}
}

func (s *session) once(ctx context.Context, method, path string, body []byte, limit int64) ([]byte, bool, error) {
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
	resp, err := s.hc.Do(req)
	if err != nil {
		msg := err.Error()
		fatal := strings.Contains(msg, "tls: ") || strings.Contains(msg, "certificate") || strings.Contains(msg, "x509")
		return nil, !fatal || ctx.Err() != nil, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK && method == http.MethodGet:
		b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
		if err != nil {
			return nil, true, err
		}
		if int64(len(b)) > limit {
			return nil, false, diag.New(diag.SecAggMalformed, fmt.Sprintf("threshold-he round %q", s.round), "%s answered more than %d bytes", path, limit)
		}
		return b, false, nil
	case resp.StatusCode == http.StatusNoContent:
		return nil, method == http.MethodGet, nil
	case method == http.MethodPost && resp.StatusCode/100 == 2:
		return nil, false, nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var d struct{ Diagnostics diag.List }
	if json.Unmarshal(b, &d) != nil || len(d.Diagnostics) == 0 {
		return nil, resp.StatusCode >= 500, fmt.Errorf("hewire: %s %s: %s", method, path, resp.Status)
	}
	code := d.Diagnostics[0].Code
	return nil, code == diag.SecAggWireNoRound || (resp.StatusCode >= 500 && code != diag.SecAggWireUnavailable), d.Diagnostics
}
