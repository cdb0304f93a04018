package dataplane

import (
	"context"
	"time"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// Service answers one Call from a connected member: peer is the member,
// authenticated by the DTLS fingerprint it signed; req the request's
// bytes. The answer's bytes go back to the caller; an error is sent back
// as the refusal's text. ctx ends when the caller goes away.
type Service func(ctx context.Context, peer identity.Member, req []byte) ([]byte, error)

// A call is one data channel: the caller sends a request message naming
// the service and the request's size, then the request's bytes; the
// server a reply with the answer's size, then the answer's bytes. Unlike a
// blob, neither side's bytes are content-addressed: the service checks
// what it receives (secure-aggregation messages are signed and parsed
// strictly by their host), and the caller what it gets back.

// Call sends req to member's service over a data channel and returns the
// answer (at most limit bytes). An error means the caller should fall
// back to HTTPS; a refusal by the service comes back as an SC7204
// diagnostic carrying its text.
func (p *Peer) Call(ctx context.Context, member, service string, req []byte, limit int64) ([]byte, error) {
	c, err := p.connTo(ctx, member)
	if err != nil {
		return nil, err
	}
	rw, err := c.open(ctx, p, "call")
	if err != nil {
		return nil, err
	}
	defer rw.Close()
	defer watch(ctx, c, rw)()
	if err := writeJSON(rw, request{Op: "call", Service: service, Size: int64(len(req))}); err != nil {
		return nil, err
	}
	if err := sendBytes(rw, req, p.cfg.Chunk); err != nil {
		return nil, err
	}
	var rep reply
	// The service may hold the call (a long poll) up to its own bound,
	// below the stall bound readJSON waits.
	if err := readJSON(rw, make([]byte, 64<<10), &rep); err != nil {
		return nil, err
	}
	if !rep.OK {
		return nil, diag.New(diag.P2PTransfer, service, "%s refused the call: %s", member, rep.Error)
	}
	if rep.Size < 0 || rep.Size > limit {
		return nil, diag.New(diag.P2PTransfer, service, "%s announced an answer of %d bytes, over the %d bytes expected", member, rep.Size, limit)
	}
	b, err := recvBytes(rw, rep.Size)
	if err != nil {
		return nil, err
	}
	p.counter(member).moved(c.path, int64(len(req)+len(b)))
	return b, nil
}

// answerCall serves one call on rw.
func (p *Peer) answerCall(ctx context.Context, m identity.Member, c *conn, rw *channel, req request, refuse func(string, ...any)) {
	svc, ok := p.cfg.Services[req.Service]
	if !ok {
		refuse("no service %q here", req.Service)
		return
	}
	if req.Size < 0 || req.Size > blob.DefaultMaxSize {
		refuse("call of %d bytes exceeds %d", req.Size, blob.DefaultMaxSize)
		return
	}
	b, err := recvBytes(rw, req.Size)
	if err != nil {
		return
	}
	// The caller sends nothing more: a read returns when it closes the
	// channel (it gave up, or it has the answer), which ends the call.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		defer cancel()
		rw.SetReadDeadline(time.Now().Add(2 * stall))
		rw.Read(make([]byte, 1<<10))
	}()
	out, err := svc(cctx, m, b)
	if err != nil {
		refuse("%v", err)
	} else if err := writeJSON(rw, reply{OK: true, Size: int64(len(out))}); err == nil {
		if sendBytes(rw, out, p.cfg.Chunk) == nil {
			p.counter(m.Name).moved(c.path, int64(len(b)+len(out)))
		}
	}
	// Wait for the caller to close: closing first could reset the stream
	// before the last messages are delivered.
	<-closed
}
