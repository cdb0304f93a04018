package aggregator

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/dataplane"
	"github.com/scellis/scellis/internal/browsertest"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/volunteer"
	"github.com/scellis/scellis/volunteer/proof"
)

// browserPool is an open pool's node serving the volunteer page (its
// own TLS listener), with a running job whose bundle names an input, and
// a volunteer joined the way a tab joins (a fresh Ed25519 key, the
// node's challenge, a proof of work, the key's signature): tabs use its
// session token.
type browserPool struct {
	*testPool
	url            string
	token, peer    string // the volunteer's session token and peer name
	bundle, input  content.Ref
	inputBytes     []byte
	forbidden      content.Ref // a blob in the store that no open job names
	forbiddenBytes []byte
}

func startBrowserPool(t testing.TB, inputRows int) *browserPool {
	t.Helper()
	// The page is not loaded as a worker here: the .wasm it would serve
	// only has to exist.
	wasm := filepath.Join(t.TempDir(), "scellis.wasm")
	for _, f := range []string{wasm, filepath.Join(filepath.Dir(wasm), "wasm_exec.js")} {
		if err := os.WriteFile(f, []byte("unused"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := newTestPool(t, trust.Open, 0, Options{P2PLoopback: true, VolunteerListen: "127.0.0.1:0", VolunteerWasm: wasm, VolunteerDifficulty: 4})
	var csv strings.Builder
	csv.WriteString("x,y\n")
	for i := range inputRows {
		fmt.Fprintf(&csv, "%d.%03d,%d\n", i, i%997, i%2)
	}
	// No worker runs, so the job stays running: its blobs stay readable
	// by tabs.
	path := p.writeJob(map[string]string{
		"job.yaml": "name: vol\nprogram: montecarlo-pi\npartitioner: {use: range, params: {start: 0, count: 100, chunks: 2}}\nreducer: {use: mean, params: {weight: samples}}\ninputs:\n  data: {path: data.csv, label: y, class: public}\n",
		"data.csv": csv.String(),
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	plan, err := p.compile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := submit(ctx, p.client("alice"), p.fed, plan); err != nil {
		t.Fatal(err)
	}
	st, err := p.node.fsm.machine().Job(plan.ID)
	if err != nil {
		t.Fatal(err)
	}
	bp := &browserPool{testPool: p, bundle: st.Bundle, inputBytes: []byte(csv.String())}
	bp.input = content.Hash(bp.inputBytes)
	bp.forbiddenBytes = []byte("a blob in the store that no open job names")
	if bp.forbidden, err = p.client("alice").PutBlob(ctx, bp.forbiddenBytes); err != nil {
		t.Fatal(err)
	}
	addr, fp := p.node.VolunteerAddr()
	bp.url = "https://" + addr.String()
	bp.token, bp.peer = joinVolunteer(t, bp.url, fp)
	return bp
}

// joinVolunteer joins as a tab does and returns the session's token and
// peer name; the page's certificate is pinned to fp.
func joinVolunteer(t testing.TB, url, fp string) (token, peer string) {
	t.Helper()
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, // self-signed: pinned below instead
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if sum := sha256.Sum256(raw[0]); fmt.Sprintf("%X", sum[:]) != fp {
				return errors.New("not the volunteer page's certificate")
			}
			return nil
		},
	}}}
	defer hc.CloseIdleConnections()
	post := func(path string, in, out any) {
		b, _ := json.Marshal(in)
		res, err := hc.Post(url+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(res.Body)
			t.Fatalf("%s: %s %s", path, res.Status, body)
		}
		if err := json.NewDecoder(res.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key := receipt.KeyPrefix + base64.StdEncoding.EncodeToString(pub)
	var c volunteer.Challenge
	post("/volunteer/v1/challenge", volunteer.ChallengeRequest{Key: key}, &c)
	sig, err := priv.Sign(nil, proof.JoinMessage(c.Challenge, key), &ed25519.Options{Context: proof.PurposeJoin})
	if err != nil {
		t.Fatal(err)
	}
	var s volunteer.Session
	post("/volunteer/v1/join", volunteer.JoinRequest{Key: key, Challenge: c.Challenge,
		Nonce: strconv.FormatUint(proof.Solve(c.Challenge, key, c.Difficulty), 10), Sig: base64.StdEncoding.EncodeToString(sig)}, &s)
	return s.Token, s.Peer
}

// openTab starts headless Chromium on the pool's page. Chromium leaves
// loopback addresses out of ICE unless told; everything else is as a
// volunteer's browser would have it.
func (bp *browserPool) openTab(t testing.TB) context.Context {
	t.Helper()
	tab := browsertest.Start(t, chromedp.Flag("allow-loopback-in-peer-connection", true))
	// The first Run starts the browser, for the life of the context it
	// is given: tab's, not one with a timeout. The page is the volunteer
	// page; the test drives the module, not the page's controller.
	if _, err := chromedp.Run(tab, chromedp.Navigate(bp.url+"/")); err != nil {
		t.Fatal(err)
	}
	return tab
}

// inTab evaluates an async JavaScript function body in the tab, with
// the module imported as m, and decodes what it returns into v.
func inTab[T any](t testing.TB, tab context.Context, body string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 2*time.Minute)
	defer cancel()
	js := `(async () => { const m = await import("/p2p/browser/dataplane.js");
const pattern = (n, k) => { const b = new Uint8Array(n); for (let i = 0; i < n; i++) b[i] = (i * 31 + k) % 251; return b; };
` + body + `})()`
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("in the tab: %v", err)
	}
	return v
}

// pattern is the tab's pattern(n, k): bytes the tab makes and the test
// can check without moving them back.
func pattern(n, k int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((i*31 + k) % 251)
	}
	return b
}

type tabRun struct {
	Path      string           `json:"path"`
	Paths     []string         `json:"paths"`
	Hashes    []string         `json:"hashes"`
	Sizes     []int            `json:"sizes"`
	Put       string           `json:"put"`
	Refused   string           `json:"refused"`
	LastError string           `json:"lastError"`
	Stats     map[string]int64 `json:"stats"`
	Logs      []string         `json:"logs"`
}

// dataPlaneScript is the tab's side of a data-plane case: a data plane
// made with the volunteer's token and opts (JavaScript object members),
// which gets each of refs (JavaScript string literals, comma-separated),
// puts pattern(put) (its arguments), and asks for the blob no open job
// names; it returns a tabRun.
func (bp *browserPool) dataPlaneScript(opts, refs, put string) string {
	return `
const logs = [];
const dp = m.createDataPlane({ token: "` + bp.token + `", ` + opts + `, log: (s) => logs.push(s) });
const out = { paths: [], hashes: [], sizes: [], logs };
for (const ref of [` + refs + `]) {
  const b = await dp.getBlob(ref);
  out.paths.push(dp.path); out.hashes.push(await m.hashRef(b)); out.sizes.push(b.length);
}
out.put = await dp.putBlob(pattern(` + put + `));
out.path = dp.path;
try { await dp.getBlob("` + string(bp.forbidden) + `"); out.refused = "got it"; } catch (e) { out.refused = String(e); }
out.stats = dp.stats; out.lastError = dp.lastError;
dp.close();
return out;`
}

// TestBrowserDataPlane moves blobs between headless Chromium, using its
// own RTCPeerConnection through the embedded module on the volunteer
// page's origin and a joined volunteer's session token, and a real
// aggregator node (pion on the server, UDP on 127.0.0.1): the job's
// bundle and a 300 kB input fetched and a 200 kB result stored over a
// data channel, each hash-checked; a blob no open job names refused on
// both paths; and the HTTPS fallback when the tab turns data channels
// off and when ICE finds no path (relay only, and the node has no TURN),
// within the tab's connect bound. A wrong token gets nothing. It takes
// about 10-15 s on two busy cores: starting Chromium and the node, and
// the 2 s bound the relay case waits out by design; one tab and one
// node serve every case.
func TestBrowserDataPlane(t *testing.T) {
	if testing.Short() {
		t.Skip("drives a browser")
	}
	bp := startBrowserPool(t, 22000)
	tab := bp.openTab(t)

	get := fmt.Sprintf(`"%s", "%s"`, bp.bundle, bp.input)
	// The connect bound is generous: the data channel must win here even
	// on two busy cores; the fallback cases below use a short one.
	r := inTab[tabRun](t, tab, bp.dataPlaneScript(`connectTimeoutMs: 60000`, get, `200000, 7`))
	t.Logf("data channel: %+v", r)
	want := []content.Ref{bp.bundle, bp.input}
	for i, ref := range want {
		if i >= len(r.Hashes) || r.Hashes[i] != string(ref) || r.Paths[i] != dataplane.PathDirect {
			t.Fatalf("the tab's gets: %+v, want %v over a direct data channel", r, want)
		}
	}
	if r.Sizes[1] != len(bp.inputBytes) {
		t.Errorf("the input came as %d bytes, want %d", r.Sizes[1], len(bp.inputBytes))
	}
	result := pattern(200000, 7)
	if r.Put != string(content.Hash(result)) || r.Path != dataplane.PathDirect {
		t.Errorf("the tab's put: ref %s over %s, want %s over a direct data channel", r.Put, r.Path, content.Hash(result))
	}
	if got, err := bp.node.blobs.Get(content.Ref(r.Put)); err != nil || !bytes.Equal(got, result) {
		t.Errorf("the node's store has %d bytes under the tab's result ref (%v), want the tab's %d", len(got), err, len(result))
	}
	if !strings.Contains(r.Refused, "may not read") || r.Stats["https"] != 0 {
		t.Errorf("a blob no open job names: %q (https bytes %d), want a refusal over the data channel, not retried over HTTPS", r.Refused, r.Stats["https"])
	}
	// The node counted the tab's bytes under its pair.
	var pair *dataplane.PairStats
	for _, ps := range bp.node.p2p.Stats() {
		if ps.Peer == "browser/"+bp.peer {
			pair = &ps
		}
	}
	if moved := int64(len(bp.inputBytes) + len(result)); pair == nil || pair.DirectBytes < moved {
		t.Errorf("the node's pair stats for browser/%s: %+v, want at least %d direct bytes", bp.peer, pair, moved)
	}

	// The fallback: data channels turned off in the tab, and ICE with no
	// path (relay only; the node runs no TURN server), bounded at 2 s.
	for _, ice := range []string{"https", "relay"} {
		r := inTab[tabRun](t, tab, bp.dataPlaneScript(`ice: "`+ice+`", connectTimeoutMs: 2000`, `"`+string(bp.input)+`"`, `5000, 3`))
		t.Logf("ice %s: %+v", ice, r)
		if len(r.Hashes) != 1 || r.Hashes[0] != string(bp.input) || r.Paths[0] != dataplane.PathHTTPS || r.Path != dataplane.PathHTTPS {
			t.Errorf("ice %s: %+v, want the input and the put over https", ice, r)
		}
		if r.Put != string(content.Hash(pattern(5000, 3))) {
			t.Errorf("ice %s: put ref %s", ice, r.Put)
		}
		if _, err := bp.node.blobs.Get(content.Ref(r.Put)); err != nil {
			t.Errorf("ice %s: the put over https is not in the store: %v", ice, err)
		}
		if !strings.Contains(r.Refused, "may not read") {
			t.Errorf("ice %s: a blob no open job names over https: %q, want refused", ice, r.Refused)
		}
		if ice == "relay" && !strings.Contains(r.LastError, "no data channel within 2000 ms") && !strings.Contains(r.LastError, "ICE failed") {
			t.Errorf("ice relay: the tab says %q of its data channel, want that it found no path in time", r.LastError)
		}
	}

	// A wrong token: no signalling, no blobs.
	bad := inTab[tabRun](t, tab, `
const dp = m.createDataPlane({ token: "vs1.forged.AAAA", connectTimeoutMs: 2000 });
const out = {};
try { await dp.getBlob("`+string(bp.input)+`"); out.refused = "got it"; } catch (e) { out.refused = String(e); }
out.lastError = dp.lastError;
return out;`)
	if !strings.Contains(bad.Refused, "unknown to this node") || !strings.Contains(bad.LastError, "unknown to this node") {
		t.Errorf("a forged token: %+v, want refused on the offer and on /blobs/", bad)
	}
}

// BenchmarkBrowserBlobs times blob round trips between headless
// Chromium and a real node — fetching an ~8 MB input and storing an
// 8 MB result, hash-checked on both ends — over a data channel and over
// the HTTPS fallback in the same browser run, and reports MB/s of each
// and their ratio (data channel / HTTPS).
//
//	go test -run '^$' -bench BrowserBlobs -benchtime 3x ./aggregator
//
// Under -short (CI runs every benchmark once that way) the blobs are
// about 1 MB: the same paths, a fraction of the bytes.
func BenchmarkBrowserBlobs(b *testing.B) {
	rows, size := 700000, 8<<20
	if testing.Short() {
		rows, size = 70000, 1<<20
	}
	bp := startBrowserPool(b, rows)
	tab := bp.openTab(b)
	mbps := map[string]float64{}
	for _, ice := range []string{"all", "https"} {
		ms := inTab[float64](b, tab, fmt.Sprintf(`
const dp = m.createDataPlane({ token: "`+bp.token+`", ice: %q, connectTimeoutMs: 60000 });
await dp.getBlob(%q); // connects, and warms both ends
const result = pattern(%d, 1);
const t0 = performance.now();
for (let i = 0; i < %d; i++) {
  result[0] = i; // a new blob each time
  await dp.putBlob(result);
  await dp.getBlob(%q);
}
const ms = performance.now() - t0;
if (dp.path !== (%q === "all" ? "direct" : "https")) throw new Error("blobs went over " + dp.path);
dp.close();
return ms;`, ice, bp.input, size, b.N, bp.input, ice))
		moved := float64(b.N) * float64(size+len(bp.inputBytes))
		mbps[ice] = moved / 1e6 / (ms / 1e3)
	}
	b.ReportMetric(mbps["all"], "datachannel-MB/s")
	b.ReportMetric(mbps["https"], "https-MB/s")
	b.ReportMetric(mbps["all"]/mbps["https"], "datachannel/https")
	b.ReportMetric(float64(len(bp.inputBytes)), "input-bytes")
}
