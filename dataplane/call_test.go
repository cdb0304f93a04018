package dataplane

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// A call reaches the named service with the caller authenticated, its
// answer comes back and counts in the pair's bytes; an unknown service, a
// service's refusal and an answer over the caller's limit are errors.
func TestCall(t *testing.T) {
	fed, ids := testFed(t, "a", "b")
	box := &Mailbox{}
	a := startPeer(t, fed, ids, box, "a", nil)
	startPeer(t, fed, ids, box, "b", func(c *Config) {
		c.Services = map[string]Service{"hello": func(_ context.Context, peer identity.Member, req []byte) ([]byte, error) {
			if string(req) == "refuse" {
				return nil, errors.New("no, thanks")
			}
			return append([]byte(peer.Name+" said "), req...), nil
		}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := a.Call(ctx, "b", "hello", []byte("hi"), 100)
	if err != nil || string(out) != "a said hi" {
		t.Fatalf("call: %q, %v", out, err)
	}
	for _, c := range []struct {
		service, req string
		limit        int64
	}{{"absent", "hi", 100}, {"hello", "refuse", 100}, {"hello", "hi", 4}} {
		if _, err := a.Call(ctx, "b", c.service, []byte(c.req), c.limit); err == nil {
			t.Errorf("%s(%q) limit %d: no error", c.service, c.req, c.limit)
		} else if ds, ok := diag.As(err); !ok || ds[0].Code != diag.P2PTransfer {
			t.Errorf("%s(%q) limit %d: want SC7204, got %v", c.service, c.req, c.limit, err)
		}
	}
	if st := statsOf(a.Peer, "b"); st.Path != PathDirect || st.DirectBytes != int64(len("hi")+len("a said hi")) {
		t.Errorf("a's view of b: %+v", st)
	}
}

// A connection that was up and broke (the remote died: a killed host) is
// redialled in the background: calls meanwhile fail over at once with
// ErrNoPath, for the caller's fallback, instead of each waiting out a
// connection attempt to a member that may be gone for good (ConnectTimeout
// here is far longer than the test's own deadline, so a call that waited
// for the redial would fail the test with a timeout instead).
func TestBrokenConnectionRedialsInBackground(t *testing.T) {
	fed, ids := testFed(t, "a", "b")
	box := &Mailbox{}
	a := startPeer(t, fed, ids, box, "a", func(c *Config) { c.ConnectTimeout = 10 * time.Minute })
	echo := map[string]Service{"echo": func(_ context.Context, _ identity.Member, req []byte) ([]byte, error) { return req, nil }}
	b := startPeer(t, fed, ids, box, "b", func(c *Config) { c.Services = echo })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := a.Call(ctx, "b", "echo", []byte("hi"), 100); err != nil || string(out) != "hi" {
		t.Fatalf("call: %q, %v", out, err)
	}
	b.Close() // b's data channels close; b answers no more offers
	for {
		_, err := a.Call(ctx, "b", "echo", []byte("hi"), 100)
		if err == nil {
			continue // not noticed yet
		}
		if ctx.Err() != nil {
			t.Fatalf("a call waited for the redial: %v", err)
		}
		if errors.Is(err, ErrNoPath) && strings.Contains(err.Error(), "redialling in the background") {
			break
		}
		// The call that was in flight when the connection died fails
		// with the broken transfer: the next one meets the redial.
	}
	// While the redial runs, every call fails over at once.
	if _, err := a.Call(ctx, "b", "echo", []byte("hi"), 100); !errors.Is(err, ErrNoPath) {
		t.Fatalf("a call during the background redial: %v", err)
	}
}

// A transfer in flight when the remote dies without a goodbye (a killed
// host: no DTLS close, no SCTP shutdown) ends once ICE declares the
// connection gone — a few seconds — not at the transfer's stall deadline
// (a minute for a call): closing a detached channel whose association is
// dead does not wake a blocked read, so the transfer is aborted with a
// deadline in the past. Here b's service never answers, then b's ICE
// transport stops silently, as a killed process's would.
func TestTransferEndsWhenRemoteDiesSilently(t *testing.T) {
	fed, ids := testFed(t, "a", "b")
	box := &Mailbox{}
	a := startPeer(t, fed, ids, box, "a", nil)
	called := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	b := startPeer(t, fed, ids, box, "b", func(c *Config) {
		c.Services = map[string]Service{"hang": func(ctx context.Context, _ identity.Member, _ []byte) ([]byte, error) {
			called <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, errors.New("released")
		}}
	})
	// Well under the call's own read deadline (2 × stall): a call that
	// waited for it fails the test with this context's error instead.
	ctx, cancel := context.WithTimeout(context.Background(), stall)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := a.Call(ctx, "b", "hang", []byte("hi"), 100)
		errc <- err
	}()
	<-called
	var c *conn
	b.mu.Lock()
	for o := range b.open {
		if o.remote == "a" {
			c = o
		}
	}
	b.mu.Unlock()
	if c == nil {
		t.Fatal("b holds no connection to a")
	}
	c.mu.Lock()
	pc := c.pc
	c.mu.Unlock()
	if err := pc.SCTP().Transport().ICETransport().Stop(); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	if err == nil || ctx.Err() != nil {
		t.Fatalf("the call to a silently dead peer: %v (context: %v); want its end when ICE declared the connection gone", err, ctx.Err())
	}
}
