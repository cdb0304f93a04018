package aggregator

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/trust"
)

// Law 3: the coordinator never touches tensor bytes. These tests watch
// every request and response body that goes through the control-plane
// handler (/v1/) of a real aggregator while real workers run a job with
// large, distinctive results, and check that no piece of any result blob —
// raw, base64 or as the decimal text of its numbers — crossed it, while the
// results' hashes did.

// exchange is one control-plane request and its response, as the handler
// read and wrote them.
type exchange struct {
	method, path string
	status       int
	req, resp    []byte
}

// apiRecorder records the control-plane traffic through Options.WrapAPI.
// Bodies are appended as they flow, so a stream (server-sent events) is
// visible before its handler returns.
type apiRecorder struct {
	mu        sync.Mutex
	exchanges []*exchange
}

func (rec *apiRecorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ex := &exchange{method: r.Method, path: r.URL.Path, status: http.StatusOK}
		rec.mu.Lock()
		rec.exchanges = append(rec.exchanges, ex)
		rec.mu.Unlock()
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.TeeReader(r.Body, appender{rec, &ex.req}), r.Body}
		h.ServeHTTP(&recordingWriter{ResponseWriter: w, rec: rec, ex: ex}, r)
	})
}

// appender appends to one of an exchange's bodies under the recorder's lock.
type appender struct {
	rec *apiRecorder
	buf *[]byte
}

func (a appender) Write(p []byte) (int, error) {
	a.rec.mu.Lock()
	*a.buf = append(*a.buf, p...)
	a.rec.mu.Unlock()
	return len(p), nil
}

// recordingWriter copies the response to the exchange. It keeps Flush, which
// the event stream needs.
type recordingWriter struct {
	http.ResponseWriter
	rec *apiRecorder
	ex  *exchange
}

func (w *recordingWriter) WriteHeader(status int) {
	w.rec.mu.Lock()
	w.ex.status = status
	w.rec.mu.Unlock()
	w.ResponseWriter.WriteHeader(status)
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	appender{w.rec, &w.ex.resp}.Write(p)
	return w.ResponseWriter.Write(p)
}

func (w *recordingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// snapshot returns copies of the exchanges so far.
func (rec *apiRecorder) snapshot() []exchange {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := make([]exchange, len(rec.exchanges))
	for i, ex := range rec.exchanges {
		out[i] = *ex
		out[i].req = bytes.Clone(ex.req)
		out[i].resp = bytes.Clone(ex.resp)
	}
	return out
}

// window is the length of the byte sequences looked for: any piece of a
// result this long or longer that crossed the handler is found. A float64
// is 9 bytes of CBOR and about 20 characters of decimal text.
const window = 16

// windowSet indexes every window-byte sequence of the traffic.
type windowSet map[string]struct{}

func (s windowSet) add(b []byte) {
	for i := 0; i+window <= len(b); i++ {
		s[string(b[i:i+window])] = struct{}{}
	}
}

// firstHit returns the offset of the first window of b found in s, or -1.
func (s windowSet) firstHit(b []byte) int {
	for i := 0; i+window <= len(b); i++ {
		if _, ok := s[string(b[i:i+window])]; ok {
			return i
		}
	}
	return -1
}

// leak reports how any piece of the result b (or of its decoded values)
// appears in seen, or "" when none does.
func leak(seen windowSet, b []byte, vals []float64) string {
	if off := seen.firstHit(b); off >= 0 {
		return fmt.Sprintf("raw bytes %d..%d: %x", off, off+window, b[off:off+window])
	}
	for shift := 0; shift < 3 && shift < len(b); shift++ {
		if seen.firstHit([]byte(base64.StdEncoding.EncodeToString(b[shift:]))) >= 0 {
			return "base64 of its bytes"
		}
	}
	for _, v := range vals {
		text := strconv.FormatFloat(v, 'g', -1, 64) // as encoding/json writes it
		if len(text) >= window && seen.firstHit([]byte(text)) >= 0 {
			return "the value " + text
		}
	}
	return ""
}

// law3Program returns, for each shard, thousands of floats derived from the
// shard: long decimal expansions and 9-byte CBOR floats that cannot appear
// anywhere by chance.
const law3Program = `def run(params, inputs):
    k = params["chunk"]
    return [1.0 / (7.0 + k * 7919.0 + i * 0.6180339887498949) for i in range(params["n"])]
`

func TestLaw3NoResultBytesThroughControlPlane(t *testing.T) {
	t.Parallel()
	const shards, perShard = 12, 3000
	rec := &apiRecorder{}
	// The workers move their blobs over data channels (dataplane), whose
	// signalling goes through the node's /p2p/ mailbox: the recorder sees
	// that too, and it must carry no result bytes either.
	p := newTestPool(t, trust.Own, 2, Options{LeaseTTL: 5 * time.Second, WrapAPI: rec.wrap, P2PLoopback: true})
	p.p2p = true
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	path := p.writeJob(map[string]string{
		"floats.star": law3Program,
		// Two replicas, so both workers upload and report every result.
		"job.yaml": fmt.Sprintf("name: law3\nprogram: ./floats.star\npartitioner: {use: range, params: {count: %d, chunks: %d}}\nreducer: concat\nparams: {n: %d}\nverification: {replicas: 2}\n", shards, shards, perShard),
	})
	plan, err := p.compile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	alice := p.client("alice")
	stopWorkers := p.startWorkers(2, 20*time.Millisecond)
	if _, err := submit(ctx, alice, p.fed, plan); err != nil {
		t.Fatalf("submit: %v", err)
	}
	// Follow the job on its event stream, as `scellis job watch` does, so
	// the stream's bytes are recorded too.
	if err := alice.Watch(ctx, plan.ID, func(api.Event) error { return nil }); err != nil {
		t.Fatalf("watch: %v", err)
	}
	st, err := alice.Job(ctx, plan.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != coordinator.JobDone || st.Counts.Verified != shards {
		t.Fatalf("job %s with %d/%d verified; want done with all verified", st.State, st.Counts.Verified, shards)
	}
	stopWorkers() // the traffic is complete: workers have handed back their leases

	// The result bytes exist and travelled, through the blob endpoint: fetch
	// each canonical result by its hash and check it is the shard's output.
	type blobOf struct {
		name string
		ref  content.Ref
		b    []byte
	}
	var results []blobOf
	for _, s := range st.Shards {
		b, err := alice.GetBlob(ctx, s.Result)
		if err != nil {
			t.Fatalf("shard %d: result %s: %v", s.Index, s.Result.Short(), err)
		}
		want, err := plan.Execute(ctx, plan.Shards[s.Index])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, want.Bytes) {
			t.Fatalf("shard %d: the stored result is not the shard's output", s.Index)
		}
		if len(b) < perShard*9 {
			t.Fatalf("shard %d: result is %d bytes; the test needs large results", s.Index, len(b))
		}
		results = append(results, blobOf{fmt.Sprintf("shard %d result", s.Index), s.Result, b})
	}
	reduced, err := alice.GetBlob(ctx, st.Reduced)
	if err != nil {
		t.Fatalf("reduced result: %v", err)
	}
	// result.json also cites the job, its content and the result hashes,
	// which the control plane rightly carries: check its reduced value.
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(reduced, &doc); err != nil || len(doc["result"]) < shards*perShard*10 {
		t.Fatalf("reduced result.json: %d bytes of result, %v", len(doc["result"]), err)
	}
	results = append(results, blobOf{"reduced value in result.json", st.Reduced, doc["result"]})

	traffic := rec.snapshot()
	seen := windowSet{}
	calls := map[string]int{}
	var total int
	for _, ex := range traffic {
		seen.add(ex.req)
		seen.add(ex.resp)
		total += len(ex.req) + len(ex.resp)
		route := ex.method + " " + ex.path
		if strings.HasPrefix(ex.path, "/v1/jobs/") {
			route = ex.method + " /v1/jobs/{id}" + strings.TrimPrefix(ex.path, "/v1/jobs/"+string(plan.ID))
		}
		calls[route]++
	}
	t.Logf("control plane: %d exchanges, %d body bytes: %v", len(traffic), total, calls)
	var moved int64
	for _, pair := range p.node.Status().DataPlane.Pairs {
		moved += pair.DirectBytes
	}
	if moved < int64(shards*perShard*9) {
		t.Fatalf("the data channels moved %d bytes; the workers' results did not go over them", moved)
	}
	// Workers report alone or in batches (adaptive by default).
	calls["POST /v1/results"] += calls["POST /v1/results/batch"]
	for _, route := range []string{"POST /v1/jobs", "POST /v1/lease", "POST /v1/results", "GET /v1/jobs/{id}", "GET /v1/jobs/{id}/events", "POST /p2p/signal", "GET /p2p/signal"} {
		if calls[route] == 0 {
			t.Fatalf("the recorder saw no %s: it does not observe the control plane", route)
		}
	}

	// No piece of any result crossed the control plane: not the raw CBOR,
	// not base64 (JSON's form of []byte), not the numbers as JSON text.
	// First, the detector finds each of those forms when they are there.
	var vals0 []float64
	if err := content.Decode(results[0].b, &vals0); err != nil || len(vals0) != perShard {
		t.Fatalf("%s: %d values, %v", results[0].name, len(vals0), err)
	}
	asNumbers, _ := json.Marshal(map[string]any{"values": vals0[1500:1502]})
	asBase64, _ := json.Marshal(map[string]any{"bytes": results[0].b[1000:1040]})
	for form, body := range map[string][]byte{"raw": results[0].b[500:520], "numbers": asNumbers, "base64": asBase64} {
		probe := windowSet{}
		probe.add(body)
		if leak(probe, results[0].b, vals0) == "" {
			t.Fatalf("the detector misses a result sent as %s", form)
		}
	}
	for _, r := range results {
		var vals []float64
		if r.ref != st.Reduced {
			if err := content.Decode(r.b, &vals); err != nil || len(vals) != perShard {
				t.Fatalf("%s: %d values, %v", r.name, len(vals), err)
			}
		}
		if form := leak(seen, r.b, vals); form != "" {
			t.Errorf("%s went through the control-plane API (%s)", r.name, form)
		}
	}

	// The hashes did cross it: every canonical result hash was reported by
	// both workers and is in the job status the submitter read.
	reported := map[content.Ref]int{}
	var statusBodies []byte
	for _, ex := range traffic {
		switch {
		case ex.method == "POST" && ex.path == "/v1/results":
			var r api.ResultReport
			if err := json.Unmarshal(ex.req, &r); err != nil {
				t.Fatalf("a result report is not a hash report: %v: %s", err, ex.req)
			}
			reported[r.Result]++
		case ex.method == "POST" && ex.path == "/v1/results/batch":
			var b api.ReportBatch
			if err := json.Unmarshal(ex.req, &b); err != nil {
				t.Fatalf("a batch of result reports is not hash reports: %v: %s", err, ex.req)
			}
			for _, r := range b.Reports {
				reported[r.Result]++
			}
		case ex.method == "GET" && strings.HasPrefix(ex.path, "/v1/jobs/"):
			statusBodies = append(statusBodies, ex.resp...)
		}
	}
	if !bytes.Contains(statusBodies, []byte("event: job-complete")) {
		t.Fatalf("the recorder did not see the event stream to its end")
	}
	for _, r := range results[:len(results)-1] {
		if reported[r.ref] < 2 {
			t.Errorf("%s: its hash was reported %d times through the API; want one report per worker", r.name, reported[r.ref])
		}
		if !bytes.Contains(statusBodies, []byte(r.ref)) {
			t.Errorf("%s: its hash %s is not in the job status served by the API", r.name, r.ref.Short())
		}
	}
	if !bytes.Contains(statusBodies, []byte(st.Reduced)) {
		t.Errorf("the reduced result's hash is not in the job status served by the API")
	}

	// Refused requests leave the coordinator's state and receipt chain as
	// they were: the pool is quiet now, so any change would be theirs.
	t.Run("refusals", func(t *testing.T) { testRefusals(t, p, plan.ID, st.Shards[0].Result) })
}

// testRefusals sends oversized and malformed bodies to the control plane
// of a quiet pool and checks each gets its status with a diagnostic and
// leaves the coordinator state unchanged.
func testRefusals(t *testing.T, p *testPool, jobID, result content.Ref) {
	// Workers lease and report; a researcher (alice) submits.
	clients := map[string]*http.Client{}
	for _, name := range []string{"w1", "alice"} {
		tlsCfg, err := identity.ClientTLSConfig(p.ids[name], p.fed, "", identity.Aggregator)
		if err != nil {
			t.Fatal(err)
		}
		clients[name] = &http.Client{Transport: api.Transport(tlsCfg), Timeout: 10 * time.Second}
		defer clients[name].CloseIdleConnections()
	}
	base := "https://" + p.node.Self.Address

	// A worker trying to push result bytes through the control plane.
	pushed := fmt.Sprintf(`{"job":%q,"shard":0,"result":%q,"bytes":%q}`, jobID, result, strings.Repeat("QUJD", api.MaxRequestBytes/4+1))
	cases := []struct {
		name, path, body string
		status           int
		message          string
	}{
		{"oversized report", "/v1/results", pushed, http.StatusRequestEntityTooLarge, "request body too large"},
		{"oversized submission", "/v1/jobs", `{"bundle":"` + strings.Repeat("a", api.MaxRequestBytes) + `"}`, http.StatusRequestEntityTooLarge, "request body too large"},
		{"result bytes in a report", "/v1/results", fmt.Sprintf(`{"job":%q,"shard":0,"result":%q,"bytes":"QUJD"}`, jobID, result), http.StatusBadRequest, "unknown field"},
		{"result not a ref", "/v1/results", fmt.Sprintf(`{"job":%q,"shard":0,"result":"QUJD"}`, jobID), http.StatusBadRequest, "not a ref"},
		{"truncated JSON", "/v1/results", fmt.Sprintf(`{"job":%q,"shard":0,`, jobID), http.StatusBadRequest, "malformed request body"},
		{"not JSON", "/v1/lease", "lease me", http.StatusBadRequest, "malformed request body"},
		{"wrong type", "/v1/renew", fmt.Sprintf(`{"job":%q,"shard":"zero"}`, jobID), http.StatusBadRequest, "malformed request body"},
		{"trailing data", "/v1/lease", `{"max":1} {"max":2}`, http.StatusBadRequest, "trailing data"},
		{"empty body", "/v1/jobs", "", http.StatusBadRequest, "malformed request body"},
	}
	for _, c := range cases {
		before := p.node.Status()
		hc := clients["w1"]
		if c.path == "/v1/jobs" {
			hc = clients["alice"]
		}
		resp, err := hc.Post(base+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s: HTTP %d, want %d: %s", c.name, resp.StatusCode, c.status, body)
			continue
		}
		var out struct{ Diagnostics diag.List }
		if err := json.Unmarshal(body, &out); err != nil || len(out.Diagnostics) == 0 {
			t.Errorf("%s: HTTP %d without a JSON diagnostic: %s", c.name, resp.StatusCode, body)
			continue
		}
		d := out.Diagnostics[0]
		if d.Code != diag.PoolBadRequest || !strings.Contains(d.Message, c.message) {
			t.Errorf("%s: diagnostic %s %q; want %s mentioning %q", c.name, d.Code, d.Message, diag.PoolBadRequest, c.message)
		}
		if c.status == http.StatusRequestEntityTooLarge && !strings.Contains(d.Help, "blob endpoint") {
			t.Errorf("%s: the help %q does not point to the blob endpoint", c.name, d.Help)
		}
		after := p.node.Status()
		if after.StateHash != before.StateHash || after.ChainHead != before.ChainHead {
			t.Errorf("%s: the coordinator state changed (%s → %s)", c.name, before.StateHash.Short(), after.StateHash.Short())
		}
	}
}
