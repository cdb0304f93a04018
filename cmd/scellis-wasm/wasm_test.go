//go:build !js

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/internal/browsertest"
	"github.com/scellis/scellis/job"
)

// The page that loads the worker: go.run sets scellisRunShard before
// main blocks, so once ready resolves the function is there.
const page = `<!doctype html><meta charset="utf-8"><title>scellis wasm</title>
<script src="wasm_exec.js"></script>
<script>
const go = new Go();
window.ready = WebAssembly.instantiateStreaming(fetch("scellis.wasm"), go.importObject)
  .then(r => { go.run(r.instance); });
window.runB64 = async (b64) => {
  const req = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  try {
    const r = await scellisRunShard(req);
    let s = "";
    for (const b of r.result) s += String.fromCharCode(b);
    return {hash: r.hash, result: btoa(s)};
  } catch (e) {
    return {error: String(e)};
  }
};
// benchB64 runs one request k times in a row and gives the milliseconds
// (the benchmark's timing, not the content's: content has no clock).
window.benchB64 = async (b64, k) => {
  const req = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const t0 = performance.now();
  for (let i = 0; i < k; i++) await scellisRunShard(req);
  return performance.now() - t0;
};
</script>`

// buildWorker builds the WebAssembly worker into dir, beside Go's
// wasm_exec.js of the same toolchain, and returns the .wasm's size.
func buildWorker(t testing.TB, dir string) int64 {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "scellis.wasm"), ".")
	cmd.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("GOOS=js GOARCH=wasm go build: %v\n%s", err, out)
	}
	// Content must have no way out of the tab: the worker links no HTTP
	// client (the only network a js/wasm program has is fetch, through
	// net/http) and no process launcher.
	cmd = exec.Command("go", "list", "-deps", ".")
	cmd.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm")
	deps, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, d := range strings.Fields(string(deps)) {
		if d == "net/http" || d == "os/exec" {
			t.Errorf("the wasm worker links %s: content could reach it", d)
		}
	}
	root, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatal(err)
	}
	var shim []byte
	for _, p := range []string{"lib/wasm/wasm_exec.js", "misc/wasm/wasm_exec.js"} {
		if shim, err = os.ReadFile(filepath.Join(strings.TrimSpace(string(root)), p)); err == nil {
			break
		}
	}
	if shim == nil {
		t.Fatalf("no wasm_exec.js in GOROOT %s", root)
	}
	if err := os.WriteFile(filepath.Join(dir, "wasm_exec.js"), shim, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "scellis.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// compile compiles a job spec against the builtin catalog, as a native
// worker does.
func compile(t testing.TB, yaml string) *job.Plan {
	t.Helper()
	spec, err := job.ParseSpec(filepath.Join(t.TempDir(), "job.yaml"), []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, err := job.Compile(context.Background(), spec, cat)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// request is shard i of p as the tab receives it.
func request(t testing.TB, p *job.Plan, i int) string {
	t.Helper()
	bundle, err := content.Encode(p.Bundle())
	if err != nil {
		t.Fatal(err)
	}
	sources, _ := p.Blobs()
	raw, err := content.Encode(job.ShardRequest{Bundle: bundle, Sources: sources, Job: p.ID, Shard: i})
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(raw)
}

type tabResult struct {
	Hash   string `json:"hash"`
	Result string `json:"result"`
	Error  string `json:"error"`
}

func runInTab(t testing.TB, tab context.Context, req string) tabResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 2*time.Minute)
	defer cancel()
	r, err := chromedp.Run(ctx, chromedp.Evaluate[tabResult](`runB64("`+req+`")`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("running a shard in the tab: %v", err)
	}
	return r
}

// TestWasmWorkerMatchesNative runs shards of a Monte Carlo job and of a
// matmul job in the shard executor compiled to WebAssembly, in headless
// Chromium, and checks that every result is byte-identical to the native
// executor's for the same shard; and that the step budget stops the same
// shard in the tab as natively. Most of its time (~10-25 s on two busy
// cores) is the GOOS=js build of the worker, which is the point: the test
// runs the .wasm this source builds, not a stale one.
func TestWasmWorkerMatchesNative(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the wasm worker and drives a browser")
	}
	tab := browsertest.Start(t)
	dir := t.TempDir()
	size := buildWorker(t, dir)
	t.Logf("scellis.wasm: %d bytes (%.1f MiB)", size, float64(size)/(1<<20))
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(tab, 2*time.Minute)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Navigate(srv.URL+"/index.html")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`window.ready`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("loading the wasm worker: %v", err)
	}

	jobs := map[string]*job.Plan{
		"montecarlo": compile(t, `name: mc
program: montecarlo-pi
partitioner: {use: range, params: {start: 0, count: 40000, chunks: 4}}
reducer: {use: mean, params: {weight: samples}}
`),
		"matmul": compile(t, `name: mm
program: matmul
partitioner: {use: range, params: {start: 0, count: 24, chunks: 3}}
reducer: concat
params: {n: 24, seed: 1}
`),
	}
	for name, p := range jobs {
		for i := range p.Shards {
			want, err := p.Execute(context.Background(), p.Shards[i])
			if err != nil {
				t.Fatalf("%s shard %d natively: %v", name, i, err)
			}
			got := runInTab(t, tab, request(t, p, i))
			if got.Error != "" {
				t.Fatalf("%s shard %d in the tab: %s", name, i, got.Error)
			}
			b, err := base64.StdEncoding.DecodeString(got.Result)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, want.Bytes) || got.Hash != string(want.Hash) {
				t.Errorf("%s shard %d: tab gave %d bytes (%s), native %d bytes (%s)", name, i, len(b), got.Hash, len(want.Bytes), want.Hash)
			}
		}
		t.Logf("%s: %d shards byte-identical in the tab and natively", name, len(p.Shards))
	}

	// The same step budget: a job whose limit is too low for its shard
	// fails with SC2004 in the tab as it does natively.
	tight := compile(t, `name: tight
program: matmul
partitioner: {use: range, params: {start: 0, count: 64, chunks: 2}}
reducer: concat
params: {n: 64, seed: 1}
limits: {steps: 1000}
`)
	_, err := tight.Execute(context.Background(), tight.Shards[0])
	if err == nil || !strings.Contains(err.Error(), "SC2004") {
		t.Fatalf("natively, a 1000-step budget gave %v, want SC2004", err)
	}
	if got := runInTab(t, tab, request(t, tight, 0)); !strings.Contains(got.Error, "SC2004") {
		t.Errorf("in the tab, a 1000-step budget gave %+v, want SC2004", got)
	}
}

// BenchmarkWasmVsNative times shards of a trivial program (Monte Carlo,
// mostly native rng calls) and of matmul in the tab and natively, both
// through job.ShardRequest.Execute (the bundle is recompiled on every
// shard on both sides), and reports shards/s of each and their ratio
// (tab/native: 1 would be native speed).
//
//	go test -run '^$' -bench WasmVsNative -benchtime 20x ./cmd/scellis-wasm
func BenchmarkWasmVsNative(b *testing.B) {
	tab := browsertest.Start(b)
	dir := b.TempDir()
	size := buildWorker(b, dir)
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()
	if _, err := chromedp.Run(tab, chromedp.Navigate(srv.URL+"/index.html")); err != nil {
		b.Fatal(err)
	}
	if _, err := chromedp.Run(tab, chromedp.Evaluate[chromedp.Void](`window.ready`, chromedp.EvalAwaitPromise)); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, yaml string }{
		{"montecarlo", "name: mc\nprogram: montecarlo-pi\npartitioner: {use: range, params: {start: 0, count: 400000, chunks: 4}}\nreducer: {use: mean, params: {weight: samples}}\n"},
		{"matmul", "name: mm\nprogram: matmul\npartitioner: {use: range, params: {start: 0, count: 128, chunks: 4}}\nreducer: concat\nparams: {n: 128, seed: 1}\n"},
	} {
		b.Run(c.name, func(b *testing.B) {
			p := compile(b, c.yaml)
			req := request(b, p, 0)
			raw, _ := base64.StdEncoding.DecodeString(req)
			var r job.ShardRequest
			if err := content.Decode(raw, &r); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if _, err := r.Execute(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			native := time.Since(start)
			ms, err := chromedp.Run(tab, chromedp.Evaluate[float64](fmt.Sprintf("benchB64(%q, %d)", req, b.N), chromedp.EvalAwaitPromise))
			if err != nil {
				b.Fatal(err)
			}
			inTab := time.Duration(ms * float64(time.Millisecond))
			b.ReportMetric(float64(b.N)/native.Seconds(), "native-shards/s")
			b.ReportMetric(float64(b.N)/inTab.Seconds(), "tab-shards/s")
			b.ReportMetric(native.Seconds()/inTab.Seconds(), "tab/native")
			b.ReportMetric(float64(size), "wasm-bytes")
		})
	}
}
