package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// mailboxCall posts or polls the mailbox handler as member as (the
// member TLS or the data plane would have authenticated).
func mailboxCall(h http.Handler, ids map[string]*identity.Identity, as, method, path string, body []byte) (int, diag.Code) {
	r := httptest.NewRequestWithContext(identity.WithPeer(context.Background(), ids[as].Public()), method, path, bytes.NewReader(body))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var out struct{ Diagnostics []diag.Diagnostic }
	if w.Code/100 != 2 && json.Unmarshal(w.Body.Bytes(), &out) == nil && len(out.Diagnostics) > 0 {
		return w.Code, out.Diagnostics[0].Code
	}
	return w.Code, ""
}

// TestMailboxHostileRequests: what a member can post to the signalling
// mailbox besides its own offers and answers — undecodable, oversized,
// with unknown fields or trailing data, another member's name, an unknown
// recipient or kind, more than the per-sender bound — is refused with its
// status and code; polls beyond MaxWaiting do not wait.
func TestMailboxHostileRequests(t *testing.T) {
	fed, ids := testFed(t, "a", "b", "c")
	box := &Mailbox{PerSender: 3, TTL: time.Hour}
	h := Handler(fed, box, nil)
	sig := func(from, to, kind string) []byte {
		b, _ := json.Marshal(Signal{Session: "s", From: from, To: to, Kind: kind, SDP: "v=0"})
		return b
	}
	for _, tc := range []struct {
		name, as string
		body     []byte
		status   int
		code     diag.Code
	}{
		{"not JSON", "a", []byte("\x00\x01"), 400, diag.P2PSignalRefused},
		{"unknown field", "a", []byte(`{"from":"a","to":"b","kind":"offer","admin":true}`), 400, diag.P2PSignalRefused},
		{"trailing data", "a", append(sig("a", "b", KindOffer), []byte(` {"from":"a"}`)...), 400, diag.P2PSignalRefused},
		{"oversized body", "a", []byte(`{"sdp":"` + strings.Repeat("x", 2*MaxSignalBytes) + `"}`), 413, diag.P2PMailboxFull},
		{"oversized signal", "a", []byte(`{"from":"a","to":"b","kind":"offer","sdp":"` + strings.Repeat("x", MaxSignalBytes) + `"}`), 413, diag.P2PMailboxFull},
		{"another sender's name", "a", sig("c", "b", KindOffer), 403, diag.P2PSignalRefused},
		{"unknown recipient", "a", sig("a", "mallory", KindOffer), 400, diag.P2PSignalRefused},
		{"unknown kind", "a", sig("a", "b", "candidate"), 403, diag.P2PSignalRefused},
		{"an offer", "a", sig("a", "b", KindOffer), 202, ""},
		{"an answer", "a", sig("a", "c", KindAnswer), 202, ""},
		{"a replayed offer, still unread", "a", sig("a", "b", KindOffer), 202, ""},
		{"beyond the per-sender bound", "a", sig("a", "c", KindOffer), 429, diag.P2PMailboxFull},
		{"another sender meanwhile", "b", sig("b", "c", KindOffer), 202, ""},
	} {
		if status, code := mailboxCall(h, ids, tc.as, "POST", Prefix+"signal", tc.body); status != tc.status || code != tc.code {
			t.Errorf("%s: got %d %s, want %d %s", tc.name, status, code, tc.status, tc.code)
		}
	}
	if got := box.Take(context.Background(), "b", 0); len(got) != 2 {
		t.Errorf("b read %d signals, want 2", len(got))
	}

	// Polls: MaxWaiting of b's wait; the next answers at once.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	for range MaxWaiting {
		go func() {
			defer func() { done <- struct{}{} }()
			box.Take(ctx, "b", time.Hour)
		}()
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		box.mu.Lock()
		n := box.waiting["b"]
		box.mu.Unlock()
		if n == MaxWaiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d polls waiting, want %d", n, MaxWaiting)
		}
	}
	if got := box.Take(context.Background(), "b", time.Hour); got != nil {
		t.Errorf("a poll beyond the bound read %v", got)
	}
	cancel()
	for range MaxWaiting {
		<-done
	}
	box.mu.Lock()
	defer box.mu.Unlock()
	if n := box.waiting["b"]; n != 0 {
		t.Errorf("%d polls still counted after they ended", n)
	}
}

// FuzzMailboxPost: whatever a member posts, the handler answers with a
// status it documents, never panics, and the mailbox never holds more
// than its bounds, nor a signal that does not name its sender.
func FuzzMailboxPost(f *testing.F) {
	fed, ids := testFed(f, "a", "b")
	for _, s := range []string{
		`{"session":"s","from":"a","to":"b","kind":"offer","sdp":"v=0","fingerprint":"sha-256 AB","sig":"AAAA"}`,
		`{"from":"a","to":"b","kind":"answer"}`,
		`{"from":"b","to":"a","kind":"offer"}`,
		`{"from":"a","to":"b","kind":"offer"} x`,
		`[]`, `null`, `{"sig":"!!"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		box := &Mailbox{PerPair: 2, PerRecipient: 3, PerSender: 2, TTL: time.Hour}
		h := Handler(fed, box, nil)
		for range 3 {
			switch status, _ := mailboxCall(h, ids, "a", "POST", Prefix+"signal", body); status {
			case 202, 400, 403, 413, 429:
			default:
				t.Fatalf("status %d", status)
			}
		}
		if n := box.Pending(); n > 2 {
			t.Fatalf("%d signals held from one sender, bound 2", n)
		}
		for _, s := range box.Take(context.Background(), "b", 0) {
			if s.From != "a" || (s.Kind != KindOffer && s.Kind != KindAnswer) {
				t.Fatalf("the mailbox holds %+v", s)
			}
		}
	})
}

// A peer answers an offer once (the same session relayed again is a
// replay) and holds at most maxAnswering offers of one member at once.
func TestPeerTakesOffersOnceAndBounded(t *testing.T) {
	p := &Peer{}
	offer := func(from, session string) Signal { return Signal{From: from, Session: session, Kind: KindOffer} }
	if !p.takeOffer(offer("a", "s0")) || p.takeOffer(offer("a", "s0")) {
		t.Fatal("an offer was not taken once and only once")
	}
	for i := 1; i < maxAnswering; i++ {
		if !p.takeOffer(offer("a", fmt.Sprint("s", i))) {
			t.Fatalf("offer %d of a refused under the bound", i)
		}
	}
	if p.takeOffer(offer("a", "late")) {
		t.Fatalf("a %dth offer of a being answered at once was taken", maxAnswering+1)
	}
	if !p.takeOffer(offer("b", "s0")) {
		t.Fatal("b's offer was refused for a's")
	}
	p.doneOffer("a")
	if !p.takeOffer(offer("a", "late")) {
		t.Fatal("an offer after one was answered was refused")
	}
}
