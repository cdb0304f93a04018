package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/identity"
)

// Service is the name of the data-plane service (dataplane.Config.Services)
// an aggregator answers round exchanges on.
const Service = "secagg"

// Caller makes one call to a member's data-plane service
// (*dataplane.Peer): an error means no answer came over the data channel.
type Caller interface {
	Call(ctx context.Context, member, service string, req []byte, limit int64) ([]byte, error)
}

// wireRequest and wireResponse are an exchange as it crosses a data
// channel (canonical CBOR).
type wireRequest struct {
	Method string `cbor:"1,keyasint"`
	Path   string `cbor:"2,keyasint"`
	Body   []byte `cbor:"3,keyasint"`
	Accept string `cbor:"4,keyasint"`
}

type wireResponse struct {
	Status int    `cbor:"1,keyasint"`
	Type   string `cbor:"2,keyasint"`
	Body   []byte `cbor:"3,keyasint"`
}

// DataChannel is the transport over a WebRTC data channel to the host's
// aggregator, Member, with HTTPS as the last fallback: an exchange whose
// call fails (no connection can be set up, or it broke) goes over
// Fallback. Path, if set, hears of each change of path ("direct",
// "relayed" or "https", with why the data channel failed), for the
// member's log.
type DataChannel struct {
	Peer     Caller
	Member   string
	Fallback Transport
	// PathOf returns the path of the live data channel to member
	// (dataplane's direct or relayed); nil reports "data channel".
	PathOf func(member string) string
	// Fell back counts the bytes of an exchange that went over the
	// fallback (dataplane.Peer.RecordHTTPS); nil counts nothing.
	FellBack func(member string, n int64)
	// Moved, if set, hears of the bodies each exchange over the data
	// channel sent and received (the member's metrics; the fallback
	// counts its own).
	Moved func(sent, received int)
	Path  func(path string, err error)

	mu   sync.Mutex
	last string
}

var _ Transport = (*DataChannel)(nil)

// RoundTrip implements Transport.
func (d *DataChannel) RoundTrip(ctx context.Context, req Request) (Response, error) {
	enc, err := content.Encode(wireRequest{Method: req.Method, Path: req.Path, Body: req.Body, Accept: req.Accept})
	if err != nil {
		return Response{}, err
	}
	// The answer's envelope adds a few bytes to the body the host may
	// send: a refusal's diagnostics, or a phase's answer up to Limit+1.
	limit := max(req.Limit+1, MaxErrorLen) + 1<<10
	out, err := d.Peer.Call(ctx, d.Member, Service, enc, limit)
	if err == nil {
		var w wireResponse
		if err = content.Decode(out, &w); err == nil {
			d.used(d.pathOf(), nil)
			if d.Moved != nil {
				d.Moved(len(req.Body), len(w.Body))
			}
			return Response(w), nil
		}
		err = fmt.Errorf("the host's answer cannot be decoded: %v", err)
	}
	if ctx.Err() != nil || d.Fallback == nil {
		return Response{}, err
	}
	d.used("https", err)
	resp, herr := d.Fallback.RoundTrip(ctx, req)
	if herr == nil && d.FellBack != nil {
		d.FellBack(d.Member, int64(len(req.Body)+len(resp.Body)))
	}
	return resp, herr
}

func (d *DataChannel) pathOf() string {
	if d.PathOf != nil {
		if p := d.PathOf(d.Member); p != "" {
			return p
		}
	}
	return "data channel"
}

func (d *DataChannel) used(path string, err error) {
	d.mu.Lock()
	changed := d.last != path
	d.last = path
	d.mu.Unlock()
	if changed && d.Path != nil {
		d.Path(path, err)
	}
}

// Serve answers round exchanges that arrived over a data channel by
// running them through h (the aggregator's secure-aggregation hosts),
// as requests from peer: what reaches h is what an HTTPS request from
// that member would be, so the hosts apply the same rules to both. Only
// paths under prefixes are served (the hosts' own), never the
// coordinator's API.
func Serve(h http.Handler, prefixes ...string) func(ctx context.Context, peer identity.Member, req []byte) ([]byte, error) {
	return func(ctx context.Context, peer identity.Member, req []byte) ([]byte, error) {
		var w wireRequest
		if err := content.Decode(req, &w); err != nil {
			return nil, fmt.Errorf("a round exchange that cannot be decoded: %v", err)
		}
		if w.Method != http.MethodGet && w.Method != http.MethodPost {
			return nil, fmt.Errorf("method %q is not a round exchange", w.Method)
		}
		ok := false
		for _, p := range prefixes {
			ok = ok || strings.HasPrefix(w.Path, p)
		}
		if !ok || strings.Contains(w.Path, "..") {
			return nil, fmt.Errorf("path %q is not a secure-aggregation path", w.Path)
		}
		hr, err := http.NewRequestWithContext(identity.WithPeer(ctx, peer.PublicKey), w.Method, w.Path, bytes.NewReader(w.Body))
		if err != nil {
			return nil, err
		}
		if w.Method == http.MethodPost {
			hr.Header.Set("Content-Type", ContentCBOR)
		}
		hr.Header.Set("Accept", cmpOr(w.Accept, ContentCBOR))
		rec := &recorder{header: http.Header{}}
		h.ServeHTTP(rec, hr)
		if rec.status == 0 {
			// The handler gave no answer (the caller went away): nothing
			// may pass for an accepted message.
			return nil, ErrNoAnswer
		}
		return content.Encode(wireResponse{Status: rec.status, Type: rec.header.Get("Content-Type"), Body: rec.body.Bytes()})
	}
}

// recorder is the http.ResponseWriter of an exchange served for a data
// channel.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

// ErrNoAnswer is Serve's refusal when the host wrote no answer (the
// caller went away meanwhile).
var ErrNoAnswer = errors.New("transport: the caller went away before the host answered")
