package wire

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg/transport"
)

// inProcess is a data channel to the host's aggregator without the
// network: each call runs the aggregator's service (transport.Serve over
// the host) as from member as, which is who the channel's DTLS
// fingerprint authenticated. down makes every call fail (no path).
type inProcess struct {
	serve func(context.Context, identity.Member, []byte) ([]byte, error)
	as    identity.Member
	down  bool
	calls atomic.Int32
}

func (c *inProcess) Call(ctx context.Context, _, _ string, req []byte, limit int64) ([]byte, error) {
	c.calls.Add(1)
	if c.down {
		return nil, errors.New("test: no data-channel path")
	}
	out, err := c.serve(ctx, c.as, req)
	if err == nil && int64(len(out)) > limit {
		err = errors.New("test: answer over the limit")
	}
	return out, err
}

// One round over the three transports: hospital-a over HTTPS, hospital-b
// over a data channel, hospital-c over a data channel that finds no path
// and so over the HTTPS fallback; the sum holds all three. Over the data
// channel the host's rules are the same: a site authenticated as c that
// posts b's messages is refused (SC6101), and the service serves nothing
// but the secure-aggregation paths.
func TestOverDataChannelTransport(t *testing.T) {
	t.Parallel()
	const dim = 64
	w, th, p := roundOf(t, 3, HostOptions{}, "over data channels", dim)
	serve := transport.Serve(th.Host, Prefix)
	member := func(name string) identity.Member { m, _ := w.fed.Member(name); return m }
	https := func(name string) transport.Transport { return transport.HTTPS{Client: w.silo(name), Base: th.url} }
	b := &inProcess{serve: serve, as: member("hospital-b")}
	c := &inProcess{down: true}
	var paths []string
	over := map[string]transport.Transport{
		"hospital-a": https("hospital-a"),
		"hospital-b": &transport.DataChannel{Peer: b, Member: "agg-1", Fallback: https("hospital-b")},
		"hospital-c": &transport.DataChannel{Peer: c, Member: "agg-1", Fallback: https("hospital-c"),
			Path: func(path string, _ error) { paths = append(paths, path) }},
	}
	th.open(t, p, generous())
	// A data channel authenticated as hospital-c cannot speak for b.
	impostor := &transport.DataChannel{Peer: &inProcess{serve: serve, as: member("hospital-c")}, Member: "agg-1"}
	wantCode(t, "c's channel posting b's advert", ParticipateOver(t.Context(), impostor, p, w.keys["hospital-b"], Input{Values: make([]float64, dim), Weight: 1}), diag.SecAggWireForbidden)
	if _, err := serve(t.Context(), member("hospital-b"), mustEncodeReq(t, http.MethodGet, "/v1/jobs")); err == nil {
		t.Error("the data-channel service served a path outside the secure-aggregation hosts")
	}

	errs := make(chan error, 3)
	var xs [][]float64
	for _, s := range w.silos {
		x := testInput(s, dim)
		xs = append(xs, x)
		go func() { errs <- ParticipateOver(t.Context(), over[s], p, w.keys[s], Input{Values: x, Weight: 1}) }()
	}
	for range w.silos {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	res, err := th.Wait(t.Context(), p.Round)
	if err != nil {
		t.Fatal(err)
	}
	checkSum(t, res, plainSum(dim, xs...), 3, w.silos, nil)
	if b.calls.Load() < 4 {
		t.Errorf("hospital-b made %d calls over the data channel, want its 4 messages and 3 fetches at least", b.calls.Load())
	}
	if len(paths) != 1 || paths[0] != "https" {
		t.Errorf("hospital-c's path changes: %v, want [https]", paths)
	}
}

// mustEncodeReq encodes an exchange as transport.DataChannel sends it.
func mustEncodeReq(t *testing.T, method, path string) []byte {
	b, err := content.Encode(struct {
		Method string `cbor:"1,keyasint"`
		Path   string `cbor:"2,keyasint"`
	}{method, path})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
