package dataplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/pion/datachannel"
	"github.com/pion/webrtc/v4"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// A transfer is one data channel: the requester sends a request message,
// the server a reply; a get's reply is followed by the blob's bytes, a
// put's request by them. Messages are at most Chunk bytes; the channel is
// reliable and ordered, so the bytes arrive whole or the channel fails.
type request struct {
	Op   string      `json:"op"` // "get" or "put"
	Ref  content.Ref `json:"ref"`
	Size int64       `json:"size,omitempty"` // put: the blob's size
	// Service names the service of a call (call.go).
	Service string `json:"service,omitempty"`
}

type reply struct {
	Size  int64       `json:"size,omitempty"` // get: the blob's size
	OK    bool        `json:"ok"`
	Error string      `json:"error,omitempty"` // why the server refused
	Ref   content.Ref `json:"ref,omitempty"`   // echo: the hash of what arrived
}

// stall bounds how long a transfer may make no progress.
const stall = 30 * time.Second

// channel is one open, detached data channel. Writes do not block in
// pion's SCTP (a blocking write waits for its message to leave the
// pending queue entirely, which makes a transfer stop-and-go); instead
// Write waits while more than highWater bytes are buffered, until pion
// reports the amount below lowWater.
type channel struct {
	datachannel.ReadWriteCloserDeadliner
	dc  *webrtc.DataChannel
	low chan struct{}
	// dead is closed by abort: the transfer is over, whatever it waits on.
	dead      chan struct{}
	abortOnce sync.Once
}

// abort ends every read and write on ch at once, now and later. Closing
// a detached channel alone does not: when the remote died (a killed host,
// no SCTP shutdown) a blocked Read waits for its deadline — the whole
// stall — although ICE declared the connection gone seconds before. A
// deadline in the past wakes it, and stays: readJSON and the others set
// their own deadlines per call, which SetReadDeadline and SetWriteDeadline
// below refuse to move once aborted.
func (ch *channel) abort() {
	ch.abortOnce.Do(func() {
		close(ch.dead)
		past := time.Unix(1, 0)
		ch.ReadWriteCloserDeadliner.SetReadDeadline(past)
		ch.ReadWriteCloserDeadliner.SetWriteDeadline(past)
		ch.Close()
	})
}

func (ch *channel) aborted() bool {
	select {
	case <-ch.dead:
		return true
	default:
		return false
	}
}

// SetReadDeadline sets the read deadline unless the channel was aborted.
func (ch *channel) SetReadDeadline(t time.Time) error {
	if ch.aborted() {
		return nil
	}
	return ch.ReadWriteCloserDeadliner.SetReadDeadline(t)
}

// SetWriteDeadline sets the write deadline unless the channel was aborted.
func (ch *channel) SetWriteDeadline(t time.Time) error {
	if ch.aborted() {
		return nil
	}
	return ch.ReadWriteCloserDeadliner.SetWriteDeadline(t)
}

// Flow-control marks of a channel's send buffer (bench_test.go).
var highWater, lowWater uint64 = 4 << 20, 1 << 20

func newChannel(dc *webrtc.DataChannel, rw datachannel.ReadWriteCloserDeadliner) *channel {
	ch := &channel{ReadWriteCloserDeadliner: rw, dc: dc, low: make(chan struct{}, 1), dead: make(chan struct{})}
	dc.SetBufferedAmountLowThreshold(lowWater)
	dc.OnBufferedAmountLow(func() {
		select {
		case ch.low <- struct{}{}:
		default:
		}
	})
	return ch
}

// Write queues b once the send buffer has room.
func (ch *channel) Write(b []byte) (int, error) {
	deadline := time.NewTimer(stall)
	defer deadline.Stop()
	for ch.dc.BufferedAmount() > highWater {
		select {
		case <-ch.low:
		case <-ch.dead:
			return 0, errors.New("dataplane: the transfer was aborted (the connection went, or the caller gave up)")
		case <-deadline.C:
			return 0, fmt.Errorf("dataplane: the peer read nothing for %v", stall)
		}
	}
	return ch.ReadWriteCloserDeadliner.Write(b)
}

// open opens a data channel on c and waits for it.
func (c *conn) open(ctx context.Context, p *Peer, label string) (*channel, error) {
	c.mu.Lock()
	pc := c.pc
	c.mu.Unlock()
	dc, err := pc.CreateDataChannel(label, nil)
	if err != nil {
		return nil, err
	}
	type opened struct {
		rw  *channel
		err error
	}
	ch := make(chan opened, 1)
	dc.OnOpen(func() {
		c.tune(p)
		rw, err := dc.DetachWithDeadline()
		if err != nil {
			ch <- opened{nil, err}
			return
		}
		ch <- opened{newChannel(dc, rw), nil}
	})
	select {
	case o := <-ch:
		return o.rw, o.err
	case <-c.gone:
		return nil, fmt.Errorf("%w: the connection to %s closed", ErrNoPath, c.remote)
	case <-ctx.Done():
		dc.Close()
		return nil, ctx.Err()
	}
}

// watch aborts rw when ctx ends or the connection c goes (ICE finds the
// peer silent: a few seconds, not the whole stall), so blocked reads and
// writes return.
func watch(ctx context.Context, c *conn, rw *channel) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-c.gone:
			rw.abort()
		case <-done:
		}
	}()
	stopCtx := context.AfterFunc(ctx, rw.abort)
	return func() {
		close(done)
		stopCtx()
	}
}

func writeJSON(rw *channel, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	rw.SetWriteDeadline(time.Now().Add(stall))
	_, err = rw.Write(b)
	return err
}

func readJSON(rw *channel, buf []byte, v any) error {
	rw.SetReadDeadline(time.Now().Add(stall))
	n, err := rw.Read(buf)
	if err != nil {
		return err
	}
	return json.Unmarshal(buf[:n], v)
}

// sendBytes writes b in chunks.
func sendBytes(rw *channel, b []byte, chunk int) error {
	for len(b) > 0 {
		n := min(chunk, len(b))
		rw.SetWriteDeadline(time.Now().Add(stall))
		if _, err := rw.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// recvBytes reads exactly size bytes.
func recvBytes(rw *channel, size int64) ([]byte, error) {
	out := make([]byte, size)
	got := 0
	for int64(got) < size {
		rw.SetReadDeadline(time.Now().Add(stall))
		n, err := rw.Read(out[got:])
		if errors.Is(err, io.ErrShortBuffer) {
			return nil, fmt.Errorf("peer sent more than the %d bytes announced", size)
		}
		if err != nil {
			return nil, err
		}
		got += n
	}
	return out, nil
}

// Get fetches ref from member over a data channel and checks that the
// bytes hash to it. An error means the caller should fall back to HTTPS.
func (p *Peer) Get(ctx context.Context, member string, ref content.Ref) ([]byte, error) {
	c, err := p.connTo(ctx, member)
	if err != nil {
		return nil, err
	}
	return p.getOn(ctx, c, ref)
}

// getOn is Get over the connection c.
func (p *Peer) getOn(ctx context.Context, c *conn, ref content.Ref) ([]byte, error) {
	member := c.remote
	rw, err := c.open(ctx, p, "get")
	if err != nil {
		return nil, err
	}
	defer rw.Close()
	defer watch(ctx, c, rw)()
	buf := make([]byte, 64<<10)
	if err := writeJSON(rw, request{Op: "get", Ref: ref}); err != nil {
		return nil, err
	}
	var rep reply
	if err := readJSON(rw, buf, &rep); err != nil {
		return nil, err
	}
	if !rep.OK {
		return nil, diag.New(diag.P2PTransfer, ref.Short(), "%s refused: %s", member, rep.Error)
	}
	if rep.Size < 0 || rep.Size > blob.DefaultMaxSize {
		return nil, diag.New(diag.P2PTransfer, ref.Short(), "%s announced %d bytes, over the %d-byte blob limit", member, rep.Size, blob.DefaultMaxSize)
	}
	b, err := recvBytes(rw, rep.Size)
	if err != nil {
		return nil, err
	}
	if content.Hash(b) != ref {
		return nil, diag.New(diag.P2PTransfer, ref.Short(), "%s sent bytes that hash to %s", member, content.Hash(b).Short())
	}
	p.counter(member).moved(c.path, int64(len(b)))
	return b, nil
}

// Put sends b to member, which stores it under its hash; it returns once
// the member has checked and stored the bytes.
func (p *Peer) Put(ctx context.Context, member string, b []byte) (content.Ref, error) {
	c, err := p.connTo(ctx, member)
	if err != nil {
		return content.Hash(b), err
	}
	return p.putOn(ctx, c, b)
}

// putOn is Put over the connection c.
func (p *Peer) putOn(ctx context.Context, c *conn, b []byte) (content.Ref, error) {
	ref, member := content.Hash(b), c.remote
	rw, err := c.open(ctx, p, "put")
	if err != nil {
		return ref, err
	}
	defer rw.Close()
	defer watch(ctx, c, rw)()
	if err := writeJSON(rw, request{Op: "put", Ref: ref, Size: int64(len(b))}); err != nil {
		return ref, err
	}
	if err := sendBytes(rw, b, p.cfg.Chunk); err != nil {
		return ref, err
	}
	var rep reply
	if err := readJSON(rw, make([]byte, 64<<10), &rep); err != nil {
		return ref, err
	}
	if !rep.OK {
		return ref, diag.New(diag.P2PTransfer, ref.Short(), "%s refused: %s", member, rep.Error)
	}
	p.counter(member).moved(c.path, int64(len(b)))
	return ref, nil
}

// client is who opened a data channel: a federation member, or a
// browser tab (browser.go), whose gets and puts go through may instead
// of Config.Authorize and which reaches no service.
type client struct {
	identity.Member
	may func(op string, ref content.Ref) error // set for a browser
}

// serve answers one data channel a connected member opened.
func (p *Peer) serve(ctx context.Context, m client, c *conn, rw *channel) {
	defer rw.Close()
	defer watch(ctx, c, rw)()
	buf := make([]byte, 64<<10)
	var req request
	if err := readJSON(rw, buf, &req); err != nil {
		return
	}
	refuse := func(format string, args ...any) {
		writeJSON(rw, reply{Error: fmt.Sprintf(format, args...)})
		p.logf("p2p: refused %s's %s of %s: %s", m.Name, req.Op, req.Ref.Short(), fmt.Sprintf(format, args...))
	}
	if req.Op == "echo" {
		p.echo(m, c, rw, req, refuse)
		return
	}
	if req.Op == "call" {
		if m.may != nil {
			refuse("a browser reaches no service")
			return
		}
		p.answerCall(ctx, m.Member, c, rw, req, refuse)
		return
	}
	if _, err := content.ParseRef(string(req.Ref)); err != nil {
		refuse("%v", err)
		return
	}
	if p.cfg.Store == nil {
		refuse("this peer serves no blobs")
		return
	}
	if m.may != nil {
		if err := m.may(req.Op, req.Ref); err != nil {
			refuse("%v", err)
			return
		}
	} else if p.cfg.Authorize != nil {
		if err := p.cfg.Authorize(m.Member, req.Op, req.Ref); err != nil {
			refuse("%v", err)
			return
		}
	}
	switch req.Op {
	case "get":
		b, err := p.cfg.Store.Get(req.Ref)
		if err != nil {
			refuse("%v", err)
			return
		}
		if err := writeJSON(rw, reply{OK: true, Size: int64(len(b))}); err != nil {
			return
		}
		if err := sendBytes(rw, b, p.cfg.Chunk); err != nil {
			return
		}
		p.counter(m.Name).moved(c.path, int64(len(b)))
	case "put":
		if req.Size < 0 || req.Size > blob.DefaultMaxSize {
			refuse("blob of %d bytes exceeds %d", req.Size, blob.DefaultMaxSize)
			return
		}
		b, err := recvBytes(rw, req.Size)
		if err != nil {
			return
		}
		// Put re-hashes the bytes: a blob is stored only under its own ref.
		if err := p.cfg.Store.Put(req.Ref, bytes.NewReader(b)); err != nil {
			refuse("%v", err)
			return
		}
		if err := writeJSON(rw, reply{OK: true}); err != nil {
			return
		}
		p.counter(m.Name).moved(c.path, int64(len(b)))
	default:
		refuse("unknown operation %q", req.Op)
		return
	}
	// Wait for the requester to close: closing first could reset the
	// stream before the last messages are delivered.
	rw.SetReadDeadline(time.Now().Add(stall))
	rw.Read(buf)
}

// echo receives req.Size bytes and answers their hash: a probe of the
// path that stores nothing (scellis p2p probe).
func (p *Peer) echo(m client, c *conn, rw *channel, req request, refuse func(string, ...any)) {
	if req.Size < 0 || req.Size > blob.DefaultMaxSize {
		refuse("probe of %d bytes exceeds %d", req.Size, blob.DefaultMaxSize)
		return
	}
	b, err := recvBytes(rw, req.Size)
	if err != nil {
		return
	}
	if err := writeJSON(rw, reply{OK: true, Ref: content.Hash(b)}); err != nil {
		return
	}
	p.counter(m.Name).moved(c.path, req.Size)
	rw.SetReadDeadline(time.Now().Add(stall))
	rw.Read(make([]byte, 64<<10))
}

// ProbeResult is what Probe measured.
type ProbeResult struct {
	Peer    string        `json:"peer"`
	Path    string        `json:"path"`
	Pair    string        `json:"pair"` // the ICE candidate pair
	Bytes   int64         `json:"bytes"`
	Connect time.Duration `json:"connect_ns"`
	Elapsed time.Duration `json:"transfer_ns"`
}

// Probe connects to member and sends it n random bytes, which it hashes
// and stores nowhere; the answer must be their hash.
func (p *Peer) Probe(ctx context.Context, member string, n int) (ProbeResult, error) {
	start := time.Now()
	c, err := p.connTo(ctx, member)
	if err != nil {
		return ProbeResult{}, err
	}
	res := ProbeResult{Peer: member, Path: c.path, Pair: c.pair, Bytes: int64(n), Connect: time.Since(start)}
	b := make([]byte, n)
	rand.Read(b)
	start = time.Now()
	rw, err := c.open(ctx, p, "echo")
	if err != nil {
		return res, err
	}
	defer rw.Close()
	defer watch(ctx, c, rw)()
	if err := writeJSON(rw, request{Op: "echo", Size: int64(n)}); err != nil {
		return res, err
	}
	if err := sendBytes(rw, b, p.cfg.Chunk); err != nil {
		return res, err
	}
	var rep reply
	if err := readJSON(rw, make([]byte, 64<<10), &rep); err != nil {
		return res, err
	}
	if !rep.OK || rep.Ref != content.Hash(b) {
		return res, diag.New(diag.P2PTransfer, member, "%s answered the probe wrongly: %s", member, rep.Error)
	}
	res.Elapsed = time.Since(start)
	p.counter(member).moved(c.path, int64(n))
	return res, nil
}
