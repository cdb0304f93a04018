package wire

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg/he"
)

// TestHostileRequests: what a federation member can send the threshold-he
// host besides the protocol — wrong media type, oversized, undecodable and
// non-canonical bodies, another site's message, a message of another
// round, a second different message, a site outside the round, unknown
// rounds and paths, a message before its phase, too many long polls — is
// refused with its status and code, and leaves the round as it was: the
// site's real advert is still accepted afterwards, and its retry too.
// Requests go straight to the handler as the member the data plane or
// TLS would have authenticated (identity.WithPeer).
func TestHostileRequests(t *testing.T) {
	f := newFixture(t)
	params := func(round string) he.Params {
		return f.heParams(round, 16, 1<<20, f.silos[:3]) // hospital-d is a member of the federation, not of the round
	}
	p := params("he-hostile")
	if err := f.host.OpenHE(p, Deadlines{Advertise: time.Hour, Share: time.Hour, Mask: time.Hour, Unmask: time.Hour}); err != nil {
		t.Fatal(err)
	}
	advert := func(p he.Params, site string) []byte {
		c, err := he.NewParty(p, site, f.ids[site].PrivateKey())
		if err != nil {
			t.Fatal(err)
		}
		a, err := c.Advertise()
		if err != nil {
			t.Fatal(err)
		}
		return must(t, a.Marshal)
	}
	base := hePathRounds + base64.RawURLEncoding.EncodeToString([]byte(p.Round)) + "/"
	do := func(ctx context.Context, as, method, path, ctype string, body []byte) *httptest.ResponseRecorder {
		r := httptest.NewRequestWithContext(identity.WithPeer(ctx, f.ids[as].Public()), method, path, bytes.NewReader(body))
		if ctype != "" {
			r.Header.Set("Content-Type", ctype)
		}
		w := httptest.NewRecorder()
		f.host.ServeHTTP(w, r)
		return w
	}
	mine := advert(p, "hospital-a")
	nonCanonical := append([]byte{0xb8, mine[0] & 0x1f}, mine[1:]...) // the same map, its length in a needless extra byte
	if mine[0]&0xe0 != 0xa0 {
		t.Fatalf("an advert does not start with a short map header: %x", mine[:1])
	}
	early := must(t, (&he.Shares{Round: p.Round, From: "hospital-a", Boxes: []he.Box{{To: "hospital-b", Sealed: []byte{1}}}}).Marshal)
	for _, tc := range []struct {
		name, as, method, path, ctype string
		body                          []byte
		status                        int
		code                          diag.Code
	}{
		{"wrong media type", "hospital-a", "POST", base + "advert", "text/plain", mine, 415, diag.SecAggWireBadRequest},
		{"oversized", "hospital-a", "POST", base + "advert", contentCBOR, make([]byte, 3<<10), 413, diag.SecAggWireBadRequest},
		{"not CBOR", "hospital-a", "POST", base + "advert", contentCBOR, []byte("{\"site\":\"hospital-a\"}"), 400, diag.SecAggMalformed},
		{"non-canonical CBOR", "hospital-a", "POST", base + "advert", contentCBOR, nonCanonical, 400, diag.SecAggMalformed},
		{"trailing bytes", "hospital-a", "POST", base + "advert", contentCBOR, append(bytes.Clone(mine), 0), 400, diag.SecAggMalformed},
		{"another site's advert", "hospital-b", "POST", base + "advert", contentCBOR, mine, 403, diag.SecAggWireForbidden},
		{"an advert of another round", "hospital-a", "POST", base + "advert", contentCBOR, advert(params("he-other"), "hospital-a"), 400, diag.SecAggWrongRound},
		{"a member outside the round", "hospital-d", "POST", base + "advert", contentCBOR, advert(params("he-hostile"), "hospital-a"), 403, diag.SecAggWireForbidden},
		{"outside the round, polling", "hospital-d", "GET", base + "keyset", "", nil, 403, diag.SecAggWireForbidden},
		{"shares before their phase", "hospital-a", "POST", base + "shares", contentCBOR, early, 409, diag.SecAggOutOfOrder},
		{"unknown round", "hospital-a", "POST", hePathRounds + "bm9wZQ/advert", contentCBOR, mine, 404, diag.SecAggWireNoRound},
		{"round not base64url", "hospital-a", "POST", hePathRounds + "%21%21/advert", contentCBOR, mine, 400, diag.SecAggWireBadRequest},
		{"no such endpoint", "hospital-a", "POST", base + "sum", contentCBOR, mine, 404, diag.SecAggWireBadRequest},
	} {
		w := do(context.Background(), tc.as, tc.method, tc.path, tc.ctype, tc.body)
		if got := codeOfBody(t, w); w.Code != tc.status || got != tc.code {
			t.Errorf("%s: got %d %s, want %d %s\n%s", tc.name, w.Code, got, tc.status, tc.code, w.Body)
		}
	}

	// The real advert, its retry, then a different one from the same site.
	for i, want := range []int{204, 204} {
		if w := do(context.Background(), "hospital-a", "POST", base+"advert", contentCBOR, mine); w.Code != want {
			t.Fatalf("advert, try %d: %d %s", i, w.Code, w.Body)
		}
	}
	if w := do(context.Background(), "hospital-a", "POST", base+"advert", contentCBOR, advert(p, "hospital-a")); w.Code != 409 || codeOfBody(t, w) != diag.SecAggDuplicate {
		t.Fatalf("a second, different advert: %d %s", w.Code, w.Body)
	}

	// Long polls: a site holds at most maxPolls; the next is refused.
	ctx, cancel := context.WithCancel(context.Background())
	held := make(chan struct{})
	for range maxPolls {
		go func() {
			defer func() { held <- struct{}{} }()
			do(ctx, "hospital-b", "GET", base+"keyset", "", nil)
		}()
	}
	f.host.Host.mu.Lock()
	rd := f.host.rounds[p.Round]
	f.host.Host.mu.Unlock()
	polls := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
			rd.mu.Lock()
			got := rd.polls["hospital-b"]
			rd.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d long polls held, want %d", got, n)
			}
		}
	}
	polls(maxPolls)
	if w := do(context.Background(), "hospital-b", "GET", base+"keyset", "", nil); w.Code != 429 || codeOfBody(t, w) != diag.SecAggWireBusy {
		t.Errorf("a long poll beyond the site's bound: %d %s", w.Code, w.Body)
	}
	cancel()
	for range maxPolls {
		<-held
	}
	polls(0) // the polls that ended gave their places back
}

func must(t *testing.T, f func() ([]byte, error)) []byte {
	t.Helper()
	b, err := f()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func codeOfBody(t *testing.T, w *httptest.ResponseRecorder) diag.Code {
	t.Helper()
	if w.Code/100 == 2 {
		return ""
	}
	var out struct{ Diagnostics []diag.Diagnostic }
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || len(out.Diagnostics) == 0 {
		t.Fatalf("a %d refusal without diagnostics: %q", w.Code, w.Body)
	}
	return out.Diagnostics[0].Code
}

var _ http.Handler = (*Host)(nil)

// hePathRounds is where the threshold-he rounds' endpoints are.
const hePathRounds = HEPrefix + "v1/rounds/"
