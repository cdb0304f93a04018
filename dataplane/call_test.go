package dataplane

import (
	"context"
	"errors"
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
