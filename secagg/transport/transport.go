// Package transport is the one round transport every secure-aggregation
// scheme runs over: a site's exchanges with the host of a round (package
// secagg/wire: pairwise masking, SecAgg+, threshold-he) — messages posted,
// phases long-polled, transient failures retried, hosts probed — over
// HTTPS to the aggregator or over a WebRTC data channel to it (package
// dataplane), HTTPS then being the fallback.
//
// Either way an exchange is the same request to the same http.Handler on
// the host, authenticated as the same federation member (mutual TLS, or
// the DTLS fingerprint the member signed), so every refusal rule of the
// hosts holds on both paths. Nothing here parses, logs or stores a
// message's bytes: they are the secagg state machines' canonical CBOR,
// checked by the host and by the site's state machine.
//
// It may import the standard library, diag, content and identity — not
// secagg, nor the data plane's dataplane package (Caller is its side of a
// data channel): TestSecAggFloors in secagg/wire.
package transport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Request is one exchange with a round's host.
type Request struct {
	Method string // GET (a long poll for what a phase publishes) or POST (a message)
	Path   string // the absolute path on the host, e.g. /secagg/v1/rounds/{round}/keyset
	Body   []byte // POST: the message's canonical CBOR
	Accept string // the media type asked for; "" is CBOR
	// Limit is the most bytes a 200 answer may carry (GET); a transport
	// may return up to Limit+1 so that the caller sees it exceeded.
	Limit int64
}

// Response is the host's answer.
type Response struct {
	Status int
	Type   string // Content-Type
	Body   []byte // for a refusal: its JSON diagnostics, at most MaxErrorLen bytes
}

// Transport carries exchanges with one host. RoundTrip returns an error
// only when the exchange did not complete (no connection, broken
// transfer): the host's answer, refusals included, is a Response. It is
// safe for concurrent use.
type Transport interface {
	RoundTrip(ctx context.Context, req Request) (Response, error)
}

// Media types of the exchanges.
const (
	ContentCBOR = "application/cbor"
	ContentJSON = "application/json"
)

// MaxErrorLen bounds the body of a refusal a transport reads.
const MaxErrorLen = 64 << 10

// HTTPS is the transport over the aggregator's mutual-TLS API port: Client
// must authenticate the site with its identity key and pin the
// federation's aggregators (identity.ClientTLSConfig); Base is the host's
// URL ("https://agg-1.example.org:7400").
type HTTPS struct {
	Client *http.Client
	Base   string
}

var _ Transport = HTTPS{}

// RoundTrip implements Transport.
func (h HTTPS) RoundTrip(ctx context.Context, req Request) (Response, error) {
	var rd io.Reader
	if req.Body != nil {
		rd = bytes.NewReader(req.Body)
	}
	hr, err := http.NewRequestWithContext(ctx, req.Method, strings.TrimRight(h.Base, "/")+req.Path, rd)
	if err != nil {
		return Response{}, err
	}
	if req.Body != nil {
		hr.Header.Set("Content-Type", ContentCBOR)
	}
	hr.Header.Set("Accept", cmpOr(req.Accept, ContentCBOR))
	resp, err := h.Client.Do(hr)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()
	limit := int64(MaxErrorLen)
	if resp.StatusCode == http.StatusOK {
		limit = req.Limit + 1
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return Response{}, fmt.Errorf("%s %s: the connection broke mid-answer: %w", req.Method, req.Path, err)
	}
	return Response{Status: resp.StatusCode, Type: resp.Header.Get("Content-Type"), Body: b}, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
