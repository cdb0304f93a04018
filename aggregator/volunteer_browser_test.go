package aggregator

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/dataplane"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/browsertest"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

var (
	volunteerWasmOnce sync.Once
	volunteerWasmDir  string
	volunteerWasmErr  error
)

// volunteerWasm builds the worker compiled to WebAssembly once per test
// process, with Go's wasm_exec.js of the same toolchain beside it, as an
// operator does (volunteer.BuildCommand).
func volunteerWasm(t *testing.T) string {
	t.Helper()
	volunteerWasmOnce.Do(func() {
		dir, err := os.MkdirTemp("", "scellis-volunteer-wasm-")
		if err != nil {
			volunteerWasmErr = err
			return
		}
		volunteerWasmDir = dir
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "scellis.wasm"), "../cmd/scellis-wasm")
		cmd.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm")
		if out, err := cmd.CombinedOutput(); err != nil {
			volunteerWasmErr = fmt.Errorf("GOOS=js GOARCH=wasm go build: %v\n%s", err, out)
			return
		}
		root, err := exec.Command("go", "env", "GOROOT").Output()
		if err != nil {
			volunteerWasmErr = err
			return
		}
		shim, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(root)), "lib", "wasm", "wasm_exec.js"))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "wasm_exec.js"), shim, 0o644)
		}
		volunteerWasmErr = err
	})
	if volunteerWasmErr != nil {
		t.Fatal(volunteerWasmErr)
	}
	return filepath.Join(volunteerWasmDir, "scellis.wasm")
}

// emulation replaces, before the page's scripts run, the two browser
// facts the page reacts to: the Battery Status API (a battery at 90%,
// discharging) and the Page Visibility API, so the test can hide the tab
// and drain the battery.
const emulation = `
window.__battery = Object.assign(new EventTarget(), {level: 0.9, charging: false, chargingTime: Infinity, dischargingTime: Infinity});
navigator.getBattery = () => Promise.resolve(window.__battery);
window.__hidden = false;
Object.defineProperty(document, "visibilityState", {get: () => window.__hidden ? "hidden" : "visible", configurable: true});
Object.defineProperty(document, "hidden", {get: () => window.__hidden, configurable: true});
window.__setHidden = (h) => { window.__hidden = h; document.dispatchEvent(new Event("visibilitychange")); };
window.__setBattery = (l) => { window.__battery.level = l; window.__battery.dispatchEvent(new Event("levelchange")); };
window.scellisDataPlaneOptions = {connectTimeoutMs: 60000}; // the data channel must win on two busy cores
`

// pageState is what the test reads of the page's controller.
type pageState struct {
	State    string `json:"state"`
	Why      string `json:"why"`
	Held     int    `json:"held"`
	Workers  int    `json:"workers"`
	Releases int    `json:"releases"`
	Peer     string `json:"peer"`
	Done     []struct {
		Job   content.Ref `json:"job"`
		Shard int         `json:"shard"`
		Hash  content.Ref `json:"hash"`
		Path  string      `json:"path"` // how its bytes went
	} `json:"done"`
	Errors []string `json:"errors"`
	// Path is how the last shard's bytes went (direct, relayed, https);
	// DataPlane whether a data-plane connection is open; Note why the
	// data plane is not used, when it is not.
	Path      string `json:"path"`
	DataPlane bool   `json:"dataPlane"`
	Note      string `json:"note"`
}

const readState = `(() => { const V = window.scellisVolunteer; return {state: V.state, why: V.why, held: V.held.size, workers: V.workers.length,
  releases: V.releases || 0, peer: V.session ? V.session.peer : "", done: V.done, errors: V.errors,
  path: V.transport.path, dataPlane: !!V.transport.dp, note: V.transportNote}; })()`

// A real browser volunteers: headless Chromium opens the volunteer page
// of a real aggregator (open pool, commit–reveal, signed reports), joins
// with a key made in the tab and a proof of work, and computes shards of
// a Monte Carlo job beside a native worker: each shard needs both, so
// every shard is verified by exact match of the tab's result with the
// native one, and the test checks those hashes against its own native
// execution too; the tab moves those shards' bytes (bundle in, result
// out by ref) over a direct WebRTC data channel to the node on loopback,
// as the page and the node's pair counters say. Then, on a second job
// with no native worker (so the tab holds its lease through the reveal
// window): hiding the tab, Stop (two clicks) and a battery below the
// floor each end the page's loops, close its data plane and hand its
// lease back at once — the hide once the node has committed to the tab's
// first result, so the node must see that reveal through without the
// tab. With the data plane's module blocked, the reloaded page falls
// back to HTTPS and its results of that second job, beside a native
// worker again, verify by exact match too, the first shard's by the
// node's reveal for the earlier page (about 3 s of the total). A job with a confidential input never reaches the page
// (admission, SC4002). About 15-30 s on two busy cores, most of it the
// GOOS=js build (cached by go build after the first).
func TestVolunteerPageInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the wasm worker and drives a browser")
	}
	if browsertest.Chromium() == "" {
		browsertest.Start(t) // skips with the install hint
	}
	began := time.Now()
	wasm := volunteerWasm(t)
	t.Logf("wasm build: %v", time.Since(began).Round(time.Millisecond))
	addr := freeAddrs(t, 1)[0]
	p := newTestPool(t, trust.Open, 1, Options{VolunteerListen: addr, VolunteerWasm: wasm, VolunteerDifficulty: 8, P2PLoopback: true})
	// Chromium leaves loopback addresses out of ICE unless told.
	tab := browsertest.Start(t, chromedp.Flag("allow-loopback-in-peer-connection", true))
	// The browser starts on tab, not on the budget below: the context of
	// chromedp's first Run owns the browser, and stuck must still read
	// the page once the budget is spent.
	if err := chromedp.Do(tab); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(tab, 2*time.Minute)
	defer cancel()
	eval := func(js string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](js)); err != nil {
			t.Fatalf("%s: %v", js, err)
		}
	}
	state := func() pageState {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[pageState](readState))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// stuck says, when a job does not finish in the budget, what the
	// page and the coordinator hold: the page read under a fresh
	// deadline (ctx is spent by then), and each undecided shard's
	// leases, commitments and reports.
	stuck := func(id content.Ref) string {
		sctx, scancel := context.WithTimeout(tab, 10*time.Second)
		defer scancel()
		s, err := chromedp.Run(sctx, chromedp.Evaluate[pageState](readState))
		out := fmt.Sprintf("page: %+v (%v)", s, err)
		js, err := p.node.fsm.machine().Job(id)
		if err != nil {
			return out + "; " + err.Error()
		}
		for _, sh := range js.Shards {
			if sh.State != "verified" && sh.State != "unverified" {
				out += fmt.Sprintf("; shard %d %s leases %+v commits %+v reports %d", sh.Index, sh.State, sh.Leases, sh.Commits, len(sh.Reports))
			}
		}
		return out
	}
	keyOf := func(peer string) (string, bool) {
		m, ok := p.fed.Member(peer)
		return m.PublicKey.String(), ok
	}
	// verified checks a finished job that the tab and the native worker
	// w1 both ran: every shard verified by the two agreeing, the tab's
	// hashes those of the test's own native execution, its bytes moved
	// over path, and a signed receipt crediting the tab for each shard.
	// The owed shards are those the node had committed to for an earlier
	// instance of the page, which went away before the reveal: the node
	// revealed them itself, so their hash is the tab's report's.
	verified := func(plan *job.Plan, path string, owed map[int]bool) pageState {
		t.Helper()
		st := state()
		tabHash := map[int]content.Ref{}
		for _, d := range st.Done {
			if d.Job == plan.ID {
				tabHash[d.Shard] = d.Hash
				if d.Path != path {
					t.Errorf("shard %d: the tab's bytes went over %q, want %q (page: %+v)", d.Shard, d.Path, path, st)
				}
			}
		}
		if len(owed) > 0 {
			js, err := p.node.fsm.machine().Job(plan.ID)
			if err != nil {
				t.Fatal(err)
			}
			for i := range owed {
				for _, r := range js.Shards[i].Reports {
					if r.Peer == st.Peer {
						tabHash[i] = r.Result
					}
				}
			}
		}
		// An open pool's job carries canaries (coordinator/standing.go):
		// the known answer decides those, with whichever peer took them.
		js, err := p.node.fsm.machine().Job(plan.ID)
		if err != nil {
			t.Fatal(err)
		}
		tabShards := 0
		for _, sh := range js.Shards {
			canary := sh.Method == coordinator.MethodCanary
			switch {
			case sh.State != "verified":
				t.Fatalf("shard %d: %s", sh.Index, sh.State)
			case canary && len(sh.Agreeing) != 1:
				t.Fatalf("canary shard %d: agreeing %v, want the one peer that matched the known answer", sh.Index, sh.Agreeing)
			case !canary && (len(sh.Agreeing) != 2 || !containsPeer(sh.Agreeing, st.Peer) || !containsPeer(sh.Agreeing, "w1")):
				t.Fatalf("shard %d: agreeing %v (want the tab %s and w1)", sh.Index, sh.Agreeing, st.Peer)
			}
			if containsPeer(sh.Agreeing, st.Peer) {
				tabShards++
			}
		}
		if len(tabHash) < tabShards {
			t.Fatalf("the tab computed shards %v, %d credited to it (page: %+v)", tabHash, tabShards, st)
		}
		for i, sh := range plan.Shards {
			want, err := plan.Execute(ctx, sh)
			if err != nil {
				t.Fatal(err)
			}
			if h, ran := tabHash[i]; ran && h != want.Hash {
				t.Errorf("shard %d: the tab's result %s, natively %s", i, h, want.Hash)
			}
		}
		credited := 0
		for _, r := range p.node.fsm.machine().Receipts(0) {
			if r.Job != plan.ID {
				continue
			}
			if err := r.VerifySignatures(keyOf); err != nil {
				t.Errorf("receipt %d: %v", r.Seq, err)
			}
			if containsPeer(r.Peers, st.Peer) {
				credited++
			}
		}
		if credited != tabShards {
			t.Errorf("%d receipts credit the tab's key, want %d", credited, tabShards)
		}
		return st
	}
	// pageReady waits, as what, until the page's volunteer worker is ready.
	pageReady := func(what string) {
		waitUntil(t, what, time.Minute, func() bool {
			ready, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!!(window.scellisVolunteer && window.scellisVolunteer.ready)`))
			if err != nil {
				t.Fatal(err)
			}
			return ready
		})
	}
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: emulation}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate("https://"+addr+"/")); err != nil {
		t.Fatal(err)
	}
	pageReady("the page to load its worker")

	t.Logf("page loaded: %v", time.Since(began).Round(time.Millisecond))
	// 1. Monte Carlo beside a native worker.
	plan := p.mustCompile(ctx, map[string]string{
		"job.yaml": "name: mc\nprogram: montecarlo-pi\npartitioner: {use: range, params: {start: 0, count: 40000, chunks: 4}}\nreducer: {use: mean, params: {weight: samples}}\n",
	})
	p.mustSubmit(ctx, plan)
	stopNative := p.startWorkers(1, 20*time.Millisecond)
	if err := chromedp.Do(ctx, chromedp.Click("#start")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.waitDone(ctx, plan.ID); err != nil {
		t.Fatalf("the job with the tab and a native worker: %v (%s)", err, stuck(plan.ID))
	}
	st := verified(plan, dataplane.PathDirect, nil)
	if !receipt.IsVolunteer(st.Peer) {
		t.Fatalf("the page's peer %q is no volunteer name", st.Peer)
	}
	// The node counted the tab's bytes on a direct data channel.
	var pair *dataplane.PairStats
	for _, ps := range p.node.p2p.Stats() {
		if ps.Peer == "browser/"+st.Peer {
			pair = &ps
		}
	}
	if pair == nil || pair.DirectBytes == 0 {
		t.Errorf("the node's pair stats for browser/%s: %+v, want the shards' bytes on a direct data channel", st.Peer, pair)
	}
	stopNative()
	t.Logf("Monte Carlo verified: %v", time.Since(began).Round(time.Millisecond))

	// 2. A job no native worker runs: the tab holds each lease through
	// the reveal window, so there is always one to hand back.
	slow := p.mustCompile(ctx, map[string]string{
		"job.yaml": "name: slow\nprogram: montecarlo-pi\npartitioner: {use: range, params: {start: 0, count: 8000, chunks: 8}}\nreducer: {use: mean, params: {weight: samples}}\n",
	})
	p.mustSubmit(ctx, slow)
	volLeases := func() int {
		js, err := p.node.fsm.machine().Job(slow.ID)
		if err != nil {
			t.Fatal(err)
		}
		n, now := 0, time.Now().UnixMilli()
		for _, sh := range js.Shards {
			for _, l := range sh.Leases {
				if l.Peer == st.Peer && l.Expiry > now {
					n++
				}
			}
		}
		return n
	}
	// committed is the set of the second job's shards the node committed
	// to for the tab.
	committed := func() map[int]bool {
		js, err := p.node.fsm.machine().Job(slow.ID)
		if err != nil {
			t.Fatal(err)
		}
		out := map[int]bool{}
		for _, sh := range js.Shards {
			for _, c := range sh.Commits {
				if c.Peer == st.Peer {
					out[sh.Index] = true
				}
			}
		}
		return out
	}
	// halted waits until the page is in state (and why), has no worker
	// left and has handed back every lease (the server's view).
	halted := func(what, want, why string, releasesBefore int) {
		t.Helper()
		waitUntil(t, what, 30*time.Second, func() bool {
			s := state()
			return s.State == want && s.Why == why && s.Workers == 0 && s.Held == 0 && s.Releases > releasesBefore && !s.DataPlane && volLeases() == 0
		})
	}
	holding := func(what string) int {
		t.Helper()
		waitUntil(t, what, 30*time.Second, func() bool { return volLeases() > 0 })
		return state().Releases
	}
	before := holding("the tab to lease a shard of the second job")
	// The tab is hidden only once the node has committed to its first
	// result: the halt then aborts the tab's request in the reveal
	// window, and the node still owes that reveal (it alone holds the
	// nonce, and the tab's key is never leased a shard it committed on
	// again); phase 3 checks it came.
	waitUntil(t, "the node to commit to the tab's first result", 30*time.Second, func() bool { return len(committed()) > 0 })
	eval(`window.__setHidden(true)`)
	halted("the hidden tab to stop and hand its lease back", "paused", "hidden", before)

	eval(`window.__setHidden(false)`)
	before = holding("the visible tab to lease again")
	if err := chromedp.Do(ctx, chromedp.Click("#stop"), chromedp.Click("#confirm-yes")); err != nil {
		t.Fatal(err)
	}
	halted("Stop to hand the lease back", "stopped", "", before)

	if err := chromedp.Do(ctx, chromedp.Click("#battery-on"), chromedp.SetValue("#battery-floor", "50"),
		chromedp.Click("#start")); err != nil {
		t.Fatal(err)
	}
	before = holding("the tab on a 90% battery to lease")
	eval(`window.__setBattery(0.2)`)
	halted("a battery under the floor to pause the tab", "paused", "battery", before)

	t.Logf("hide, Stop, battery: %v", time.Since(began).Round(time.Millisecond))

	// The key travels: exported, a fresh key in its place, imported back,
	// the tab is the same peer again (its credit keeps accruing to it).
	if err := chromedp.Do(ctx, chromedp.Click("#stop"), chromedp.Click("#confirm-yes"), chromedp.Click("#export")); err != nil {
		t.Fatal(err)
	}
	exported, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("key-text").value`))
	if err != nil || !strings.HasPrefix(exported, "scellis-volunteer-key:v1:") {
		t.Fatalf("exported key %q: %v", exported, err)
	}
	peerNow := func() string {
		p, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.scellisVolunteer.key.peer`))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	eval(`setKey(null)`)
	if fresh := peerNow(); fresh == st.Peer || !receipt.IsVolunteer(fresh) {
		t.Fatalf("a fresh key gave peer %q (was %q)", fresh, st.Peer)
	}
	if err := chromedp.Do(ctx, chromedp.SetValue("#key-text", exported), chromedp.Click("#import")); err != nil {
		t.Fatal(err)
	}
	if back := peerNow(); back != st.Peer {
		t.Fatalf("the imported key is peer %q, want %q", back, st.Peer)
	}

	// 3. When the data plane's module cannot load (blocked here; a node
	// serving none alike), the page falls back to the volunteer API over
	// HTTPS for the shards' bytes: reloaded (the key kept in the tab's
	// session), it runs the second job beside a native worker, and its
	// results verify by exact match as before.
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.SetBlockedURLs, network.SetBlockedURLsParams{URLPatterns: []*network.BlockPattern{{URLPattern: "*://*:*/p2p/browser/*", Block: true}}}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	pageReady("the reloaded page to load its worker")
	if s := state(); s.Note == "" || s.Path != dataplane.PathHTTPS {
		t.Fatalf("with the data plane blocked the page says path %q, note %q: want https and why", s.Path, s.Note)
	}
	// What the earlier page left committed (the first shard, and any a
	// later halt caught in its reveal window) is the node's to reveal.
	owed := committed()
	stopNative = p.startWorkers(1, 20*time.Millisecond)
	if err := chromedp.Do(ctx, chromedp.Click("#start")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.waitDone(ctx, slow.ID); err != nil {
		t.Fatalf("the second job with the tab over HTTPS and a native worker: %v (%s)", err, stuck(slow.ID))
	}
	verified(slow, dataplane.PathHTTPS, owed)
	stopNative()
	t.Logf("HTTPS fallback verified: %v", time.Since(began).Round(time.Millisecond))

	// 4. A confidential input is refused at admission: no page sees it.
	conf, err := p.compile(ctx, p.writeJob(map[string]string{
		"data.csv": "a,x\n1,0\n2,1\n",
		"job.yaml": "name: secret\nprogram: montecarlo-pi\npartitioner: {use: range, params: {start: 0, count: 10, chunks: 1}}\nreducer: {use: mean, params: {weight: samples}}\ninputs: {d: {path: data.csv, label: x, class: confidential}}\n",
	}))
	if err == nil {
		_, err = submit(ctx, p.client("alice"), p.fed, conf)
	}
	if ds, ok := diag.As(err); !ok || ds[0].Code != diag.OpenNonPublicInput {
		t.Fatalf("a confidential input in an open pool: %v, want SC4002", err)
	}
	if errs := state().Errors; len(errs) > 0 {
		t.Logf("the page's errors along the way: %q", errs)
	}
}

func containsPeer(ps []string, p string) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}
