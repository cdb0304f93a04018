//go:build !js

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
// buildB64 builds a shard request from its parts, as the volunteer
// page does with blobs it fetched over its data plane.
window.buildB64 = (bundle, sources, job, shard) => {
  const dec = (b64) => Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const src = {};
  for (const k of Object.keys(sources)) src[k] = dec(sources[k]);
  const r = scellisShardRequest(dec(bundle), src, job, shard);
  if (r.error) return "error: " + r.error;
  let s = "";
  for (const b of r) s += String.fromCharCode(b);
  return btoa(s);
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
	checkNoPageAccess(t)
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

// checkNoPageAccess checks, on the import graph of the js/wasm build,
// that the shim (package main) is the only package of this module or its
// dependencies that imports syscall/js: the sandbox, the catalog, the
// native modules and the encoding cannot touch the page (DOM, fetch,
// timers) whatever content asks of them, because nothing they link can.
// The standard library's syscall and time import it to implement files
// and clocks on js; content has no builtin that reaches either.
func checkNoPageAccess(t testing.TB) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}} {{.Standard}} {{join .Imports " "}}`, ".")
	cmd.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	var self string
	if b, err := exec.Command("go", "list", ".").Output(); err == nil {
		self = strings.TrimSpace(string(b))
	}
	nonStd := 0
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) < 2 || f[1] == "true" {
			continue
		}
		nonStd++
		if f[0] != self && slices.Contains(f[2:], "syscall/js") {
			t.Errorf("%s imports syscall/js in the wasm build: content running through it could reach the page", f[0])
		}
	}
	if nonStd < 10 {
		t.Fatalf("go list found %d non-standard packages in the wasm build: the import graph was not read", nonStd)
	}
}

// compile compiles a job spec against the builtin catalog, as a native
// worker does; files are written beside the spec first (a program of
// the job's own, program: ./x.star).
func compile(t testing.TB, yaml string, files ...string) *job.Plan {
	t.Helper()
	dir := t.TempDir()
	for i := 0; i+1 < len(files); i += 2 {
		if err := os.WriteFile(filepath.Join(dir, files[i]), []byte(files[i+1]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec, err := job.ParseSpec(filepath.Join(dir, "job.yaml"), []byte(yaml))
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

// TestWasmWorkerMatchesNative runs shards of a Monte Carlo job, of a
// matmul job and of content calling the math module in the shard executor compiled to WebAssembly, in headless
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
		// The math module's exp, log and tanh of normal draws: repmath
		// and the Ziggurat sampler, the same bits in the tab as on amd64
		// and arm64 (cmd/scellis TestReplayableAcrossArchitectures).
		"mathfns": compile(t, "name: fns\nprogram: ./fns.star\npartitioner: {use: range, params: {start: 0, count: 400, chunks: 2}}\nreducer: concat\n",
			"fns.star", `def run(params, inputs):
    out = []
    for _ in range(params["count"]):
        x = rng.normal()
        out.append([math.exp(3 * x), math.log(x * x + 1e-3), math.tanh(x), math.log(abs(x) + 1, 10)])
    return out
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

	// A request the tab builds from its parts (scellisShardRequest, for
	// blobs it fetched over the data plane) is byte for byte the one the
	// volunteer API's shard endpoint sends: with no content source (a
	// builtin program) and with one (a program of the job's own).
	own := compile(t, "name: own\nprogram: ./p.star\npartitioner: {use: range, params: {start: 0, count: 2, chunks: 2}}\nreducer: concat\n",
		"p.star", "def run(params, inputs):\n    return [1]\n")
	for _, p := range []*job.Plan{jobs["montecarlo"], own} {
		bundle, err := content.Encode(p.Bundle())
		if err != nil {
			t.Fatal(err)
		}
		blobs, _ := p.Blobs()
		sources := map[string]string{}
		for ref, b := range blobs {
			sources[string(ref)] = base64.StdEncoding.EncodeToString(b)
		}
		js, _ := json.Marshal(sources)
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf("buildB64(%q, %s, %q, 1)", base64.StdEncoding.EncodeToString(bundle), js, p.ID)))
		if err != nil {
			t.Fatal(err)
		}
		if want := request(t, p, 1); got != want {
			t.Errorf("%s: the request built in the tab (%d sources) differs from the endpoint's: %.80s…, want %.80s…", p.Spec.Name, len(sources), got, want)
		}
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

	// Content that reaches for the page (DOM, fetch, timers, eval) or the
	// machine (files, clock, environment) finds no such builtin in the
	// tab, and is refused with the same diagnostic, at the same
	// file:line, as natively; so is a load of anything outside the
	// bundle. The memory budget stops the same shard at the same point
	// in both: a native's reservation (exact) and an audit of what the
	// content's own lists hold (estimated, on a schedule that depends
	// only on the program). Each case is one shard that fails at once.
	const one = "partitioner: {use: range, params: {start: 0, count: 2, chunks: 1}}\nreducer: concat\n"
	for _, c := range []struct{ what, call string }{
		{"DOM", "document.getElementById(\"x\")"},
		{"window", "window.location"},
		{"fetch", "fetch(\"https://example.com/\")"},
		{"XMLHttpRequest", "XMLHttpRequest()"},
		{"timers", "setTimeout(run, 0)"},
		{"eval", "eval(\"1\")"},
		{"files", "open(\"/etc/passwd\").read()"},
		{"clock", "time.now()"},
		{"environment", "os.environ[\"HOME\"]"},
	} {
		p := compile(t, "name: reach\nprogram: ./p.star\n"+one, "p.star", "def run(params, inputs):\n    return "+c.call+"\n")
		name, _, _ := strings.Cut(c.call, "(")
		name, _, _ = strings.Cut(name, ".")
		sameRefusal(t, tab, c.what, request(t, p, 0), "SC2002", "p.star:2:12", "undefined: "+name)
	}
	base := compile(t, "name: reach\nprogram: ./p.star\n"+one, "p.star", "def run(params, inputs):\n    return 1\n")
	sameRefusal(t, tab, "load", withProgram(t, base, "load(\"http\", \"get\")\n\ndef run(params, inputs):\n    return get(\"x\")\n"),
		"SC2010", "p.star:1:1", `load("http")`)
	for _, c := range []struct{ what, src, pos string }{
		{"a native's reservation", "def run(params, inputs):\n    return tensor.zeros(100000000)\n", "p.star:2:24"},
		{"an audit of lists", "def run(params, inputs):\n    kept = []\n    for k in range(1000000):\n        kept.append([k, k + 1])\n    return len(kept)\n", "p.star:"},
	} {
		p := compile(t, "name: mem\nprogram: ./p.star\nlimits: {memory_mb: 8}\n"+one, "p.star", c.src)
		sameRefusal(t, tab, "memory budget, "+c.what, request(t, p, 0), "SC2005", c.pos, "over the budget of 8.0 MiB")
	}
}

// sameRefusal runs req natively, through the same job.ShardRequest path
// as the tab, and in the tab: both must fail with the same message,
// which must carry code and every one of wants.
func sameRefusal(t *testing.T, tab context.Context, what, req, code string, wants ...string) {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(req)
	if err != nil {
		t.Fatal(err)
	}
	var r job.ShardRequest
	if err := content.Decode(raw, &r); err != nil {
		t.Fatal(err)
	}
	_, err = r.Execute(context.Background())
	if err == nil {
		t.Fatalf("%s: natively the shard ran", what)
	}
	native := err.Error()
	got := runInTab(t, tab, req)
	if got.Error != native {
		t.Errorf("%s: the tab gave %+v, natively %q", what, got, native)
	}
	for _, w := range append([]string{code}, wants...) {
		if !strings.Contains(native, w) {
			t.Errorf("%s: natively %q, which lacks %q", what, native, w)
		}
	}
}

// withProgram is shard 0 of p with its program replaced by src: a
// request job.Compile would refuse to build (a load outside the
// catalog), as a hostile submitter could hand-craft it. The executor
// refuses it while compiling the bundle, before the job's ID is checked.
func withProgram(t *testing.T, p *job.Plan, src string) string {
	t.Helper()
	e, err := catalog.Parse("p.star", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	b := p.Bundle()
	sources, _ := p.Blobs()
	delete(sources, b.Program)
	for name, ref := range b.Content {
		if ref == b.Program {
			b.Content[name] = e.Ref
		}
	}
	b.Program = e.Ref
	sources[e.Ref] = e.Source
	bundle, err := content.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := content.Encode(job.ShardRequest{Bundle: bundle, Sources: sources, Job: p.ID, Shard: 0})
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(raw)
}

// BenchmarkWasmVsNative times shards of a trivial program (Monte Carlo,
// mostly native rng calls) and of matmul in the tab and natively, both
// through job.ShardRequest.Execute (the bundle is recompiled on every
// shard on both sides), and reports shards/s of each and their ratio
// (tab/native: 1 would be native speed).
//
//	go test -run '^$' -bench WasmVsNative -benchtime 20x ./cmd/scellis-wasm
//
// Under -short (CI runs every benchmark once that way) only montecarlo
// runs.
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
			if testing.Short() && c.name != "montecarlo" {
				b.Skipf("-short: %s skipped (montecarlo runs the same path)", c.name)
			}
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
