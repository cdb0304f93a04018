//go:build !js

package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/internal/browsertest"
	"github.com/scellis/scellis/job"
)

// workersPage runs shards in Web Workers the way the volunteer page does:
// the module compiled once, handed to each worker (volunteer/assets/worker.js),
// shards taken from one queue.
const workersPage = `<!doctype html><meta charset="utf-8"><title>workers</title>
<script>
window.benchWorkers = async (b64, n, k) => {
  const mod = await WebAssembly.compileStreaming(fetch("scellis.wasm"));
  const ws = [];
  for (let i = 0; i < n; i++) { const w = new Worker("worker.js"); w.postMessage({module: mod}); ws.push(w); }
  const req = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const run = (w, id) => new Promise((res, rej) => {
    const on = (ev) => { if (ev.data.id !== id) return; w.removeEventListener("message", on); ev.data.error ? rej(ev.data.error) : res(); };
    w.addEventListener("message", on);
    w.postMessage({id, request: req.slice()});
  });
  await Promise.all(ws.map((w, i) => run(w, -1 - i))); // each worker instantiated and warm
  let next = 0;
  const t0 = performance.now();
  await Promise.all(ws.map(async (w) => { while (next < k) await run(w, next++); }));
  const ms = performance.now() - t0;
  ws.forEach((w) => w.terminate());
  return ms;
};
</script>`

// BenchmarkVolunteerWorkers times b.N shards of a trivial program (Monte
// Carlo) and of matmul in 2 Web Workers of the volunteer page's kind
// against 2 native goroutines (one per core of the CI machine), both
// through job.ShardRequest.Execute, and reports shards/s of each, their
// ratio (tab/native) and the .wasm size.
//
//	go test -run '^$' -bench VolunteerWorkers -benchtime 40x ./cmd/scellis-wasm
//
// Under -short (CI runs every benchmark once that way) only montecarlo
// runs.
func BenchmarkVolunteerWorkers(b *testing.B) {
	const workers = 2
	tab := browsertest.Start(b)
	dir := b.TempDir()
	size := buildWorker(b, dir)
	shim, err := os.ReadFile("../../volunteer/assets/worker.js")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "worker.js"), shim, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "workers.html"), []byte(workersPage), 0o644); err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()
	if err := chromedp.Do(tab, chromedp.Navigate(srv.URL+"/workers.html")); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, yaml string }{
		{"montecarlo", "name: mc\nprogram: montecarlo-pi\npartitioner: {use: range, params: {start: 0, count: 400000, chunks: 4}}\nreducer: {use: mean, params: {weight: samples}}\n"},
		{"matmul", "name: mm\nprogram: matmul\npartitioner: {use: range, params: {start: 0, count: 128, chunks: 4}}\nreducer: concat\nparams: {n: 128, seed: 1}\n"},
	} {
		b.Run(fmt.Sprintf("%s/workers=%d", c.name, workers), func(b *testing.B) {
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
			var next atomic.Int64
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						rr := r
						if _, err := rr.Execute(context.Background()); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			native := time.Since(start)
			ms, err := chromedp.Run(tab, chromedp.Evaluate[float64](fmt.Sprintf("benchWorkers(%q, %d, %d)", req, workers, b.N), chromedp.EvalAwaitPromise))
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
