package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/identity"
)

// member is an API client authenticated as a federation member, for tests
// that send what the CLI never would: hand-made bundles.
type apiMember struct {
	c    *cluster
	api  *api.Client
	http *http.Client
	base string
}

func (c *cluster) apiAs(name string) *apiMember {
	id, fed := c.memberKeys(name)
	cl := c.apiClient(name)
	tlsCfg, err := identity.ClientTLSConfig(id, fed, "", identity.Aggregator)
	if err != nil {
		c.t.Fatal(err)
	}
	return &apiMember{c: c, api: cl, http: &http.Client{Transport: api.Transport(tlsCfg)}, base: cl.Endpoints()[0]}
}

// submitRaw uploads a bundle's bytes and submits it, returning the HTTP
// status and body of POST /v1/jobs.
func (m *apiMember) submitRaw(bundle []byte) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), untilRun())
	defer cancel()
	ref, err := m.api.PutBlob(ctx, bundle)
	if err != nil {
		m.c.t.Fatalf("upload: %v", err)
	}
	body, _ := json.Marshal(api.SubmitRequest{Bundle: ref})
	return m.post("/v1/jobs", body)
}

func (m *apiMember) post(path string, body []byte) (int, string) {
	resp, err := m.http.Post(m.base+path, "application/json", bytes.NewReader(body))
	if err != nil {
		m.c.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// bundleOf returns the decoded bundle of a submitted job, as a plain map a
// test can tamper with.
func (m *apiMember) bundleOf(id string) map[string]any {
	ctx, cancel := context.WithTimeout(context.Background(), untilQuorum())
	defer cancel()
	ref, err := content.ParseRef(id)
	if err != nil {
		m.c.t.Fatal(err)
	}
	js, err := m.api.Job(ctx, ref)
	if err != nil {
		m.c.t.Fatal(err)
	}
	raw, err := m.api.GetBlob(ctx, js.Bundle)
	if err != nil {
		m.c.t.Fatal(err)
	}
	var b map[string]any
	if err := content.Decode(raw, &b); err != nil {
		m.c.t.Fatal(err)
	}
	return b
}

func mustEncode(t testing.TB, v any) []byte {
	b, err := content.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A member submits bundles whose input refs try to leave the cache folder
// (sha256:../../../../secret), or are not refs at all, or name blobs never
// uploaded: each is refused with a diagnostic and a 4xx through the real
// API, nothing of the secret file comes back, and the state hash does not
// move.
func TestPoolRefusesPathTraversalBundle(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	c := newCluster(t, "own", 1, member{"alice", "researcher"})
	// The file the traversal aims at: <cwd>/secret.csv of the aggregator.
	secret := "password,label\nhunter2-correct-horse,1\nhunter3-battery-staple,0\n"
	c.write("secret.csv", secret)
	secretRef := content.Hash([]byte(secret))
	c.startAggregators()
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("mc-base", 2)))
	m := c.apiAs("alice")
	good := m.bundleOf(id)
	before := c.converged("alice", c.aggs...)

	notUploaded := string(content.Hash([]byte("never uploaded")))
	cases := map[string]string{
		"traversal":    "sha256:../../../../secret",
		"separator":    "sha256:" + strings.Repeat("a", 31) + "/" + strings.Repeat("a", 32),
		"dots":         "sha256:" + strings.Repeat(".", 64),
		"upper case":   "sha256:" + strings.ToUpper(notUploaded[7:]),
		"wrong length": notUploaded[:70],
		"not uploaded": notUploaded,
	}
	for name, ref := range cases {
		b := map[string]any{}
		for k, v := range good {
			b[k] = v
		}
		b["name"] = "hostile-" + strings.ReplaceAll(name, " ", "-")
		b["inputs"] = map[string]any{"data": map[string]any{"ref": ref, "label": "label", "class": "open"}}
		status, body := m.submitRaw(mustEncode(t, b))
		if status < 400 || status >= 500 {
			t.Errorf("%s: status %d, want 4xx: %s", name, status, body)
			continue
		}
		if !strings.Contains(body, `"code"`) {
			t.Errorf("%s: no diagnostic in %s", name, body)
		}
		for _, leak := range []string{"hunter2", "hunter3", "password", string(secretRef)[7:19], secretRef.Short()} {
			if strings.Contains(body, leak) {
				t.Errorf("%s: the answer echoes %q: %s", name, leak, body)
			}
		}
	}
	// A bundle whose content ref is malformed is refused the same way.
	b := map[string]any{}
	for k, v := range good {
		b[k] = v
	}
	b["program"] = "sha256:../../../../secret"
	if status, body := m.submitRaw(mustEncode(t, b)); status != http.StatusBadRequest || !strings.Contains(body, `"code"`) {
		t.Errorf("malformed program ref: %d %s", status, body)
	}
	// A malformed ref in the request itself.
	if status, body := m.post("/v1/jobs", []byte(`{"bundle":"sha256:../../../../secret"}`)); status != http.StatusBadRequest {
		t.Errorf("malformed bundle ref: %d %s", status, body)
	}
	if _, err := os.Stat(filepath.Join(c.dir, "agg-1", "data", "plans")); err == nil {
		filepath.Walk(filepath.Join(c.dir, "agg-1", "data", "plans"), func(p string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() {
				if data, _ := os.ReadFile(p); bytes.Contains(data, []byte("hunter2")) {
					t.Errorf("the secret was copied into the plan cache: %s", p)
				}
			}
			return nil
		})
	}
	after := c.converged("alice", c.aggs...)
	if after.StateHash != before.StateHash || after.Jobs != before.Jobs {
		t.Fatalf("refused submissions changed the state: %s (%d jobs) → %s (%d jobs)", before.StateHash, before.Jobs, after.StateHash, after.Jobs)
	}
}

// hostileBundle is the bundle of a submitted job with its partitioner
// swapped for src: content the submitter's own machine never ran.
func (m *apiMember) hostileBundle(good map[string]any, name, src string) []byte {
	e, err := catalog.Parse(name+".star", []byte(src))
	if err != nil {
		m.c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), untilQuorum())
	defer cancel()
	if _, err := m.api.PutBlob(ctx, []byte(src)); err != nil {
		m.c.t.Fatal(err)
	}
	b := map[string]any{}
	for k, v := range good {
		b[k] = v
	}
	cont := map[string]any{}
	for k, v := range good["content"].(map[string]any) {
		cont[k] = v
	}
	cont[name] = string(e.Ref)
	b["content"] = cont
	b["name"] = name
	b["partitioner"] = map[string]any{"ref": string(e.Ref), "params": map[string]any{}}
	// The job asks for every budget it may name, as high as it can: the
	// operator's caps must hold all the same.
	lim := map[string]any{}
	for k := range good["limits"].(map[string]any) {
		switch {
		case strings.Contains(strings.ToLower(k), "step"):
			lim[k] = int64(1) << 50
		case strings.Contains(strings.ToLower(k), "mem"):
			lim[k] = int64(1) << 20
		}
	}
	if len(lim) != 2 {
		m.c.t.Fatalf("bundle limits have unexpected keys: %v", good["limits"])
	}
	b["limits"] = lim
	return mustEncode(m.c.t, b)
}

// A member's partitioner that loops for ever, or allocates without bound,
// runs on the aggregator in a child process under the operator's caps: it
// is killed at the wall-clock cap or by RLIMIT_AS, the submission gets a
// 4xx with a diagnostic, the aggregator answers status calls while the
// hostile plan runs, and the state hash does not move. A job priced at
// 2^62 work units is refused the same way.
func TestPoolKillsHostilePartitioner(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	c := newCluster(t, "own", 1, member{"alice", "researcher"})
	b, _ := os.ReadFile(filepath.Join(c.dir, "agg-1.yaml"))
	// Steps far beyond what the wall clock allows, so the kill, not the
	// step budget, ends the loop.
	c.write("agg-1.yaml", string(b)+"content_steps: 1000000000000\ncontent_memory_mb: 64\ncontent_timeout: 6s\nmax_job_units: 1000000\n")
	c.startAggregators()
	id := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("mc-base", 2)))
	m := c.apiAs("alice")
	good := m.bundleOf(id)
	before := c.converged("alice", c.aggs...)

	// An endless loop: killed at content_timeout. While it runs, a status
	// call answers and reports the plan running.
	loop := "def partition(params):\n    n = 0\n    for a in range(1000000000):\n        for b in range(1000000000):\n            n += a ^ b\n    return [{}]\n"
	type answer struct {
		status int
		body   string
	}
	done := make(chan answer, 1)
	bundle := m.hostileBundle(good, "hostile_loop", loop)
	// A second submission, uploaded now so that it is posted at once.
	ctx, cancel := context.WithTimeout(context.Background(), untilQuorum())
	defer cancel()
	secondRef, err := m.api.PutBlob(ctx, m.hostileBundle(good, "hostile_loop_2", loop))
	if err != nil {
		t.Fatal(err)
	}
	second, _ := json.Marshal(api.SubmitRequest{Bundle: secondRef})
	go func() {
		s, body := m.submitRaw(bundle)
		done <- answer{s, body}
	}()
	sawRunning := false
	waitFor(t, "a status answer while the hostile plan runs", untilElected(), func() bool {
		select {
		case a := <-done:
			done <- a
			return true // the plan ended first; checked below
		default:
		}
		// Asked in this process (no CLI start-up in the way): the plan
		// runs for content_timeout, which a loaded machine can spend
		// starting processes.
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		raw, err := m.api.Status(sctx)
		scancel()
		var st nodeStatus
		if err != nil || json.Unmarshal(raw, &st) != nil {
			return false
		}
		if st.PlansRunning > 0 {
			sawRunning = true
			return true
		}
		return false
	})
	if !sawRunning {
		t.Fatal("the hostile plan ended before any status call answered during it")
	}
	// While alice's plan runs, her next submission is refused (one plan
	// per member at a time), not queued behind it.
	s2, body2 := m.post("/v1/jobs", second)
	select {
	case a := <-done:
		done <- a
		t.Logf("the first plan ended before the second submission; per-member limit not observed (status %d)", s2)
	default:
		if s2 != http.StatusTooManyRequests || !strings.Contains(body2, "SC7020") {
			t.Fatalf("a second plan of the same member while one runs: %d %s", s2, body2)
		}
	}
	a := <-done
	if a.status != http.StatusUnprocessableEntity || !strings.Contains(a.body, "SC7021") || !strings.Contains(a.body, "wall-clock") {
		t.Fatalf("endless partitioner: %d %s", a.status, a.body)
	}

	// A 16 GiB allocation by a job that set its own memory limit to 1 TiB:
	// stopped at the operator's 64 MiB, by the in-sandbox guard (SC2005)
	// or, should the guard miss it, by RLIMIT_AS on the child (SC7021;
	// internal/sandboxproc tests that kill with a real allocation).
	alloc := "def partition(params):\n    x = [0] * ((1 << 30) - 1)\n    return [{\"n\": len(x)}]\n"
	s, body := m.submitRaw(m.hostileBundle(good, "hostile_alloc", alloc))
	guarded := strings.Contains(body, "SC2005") && strings.Contains(body, "budget of 64.0 MiB")
	killed := strings.Contains(body, "SC7021") && strings.Contains(body, "memory cap")
	if s < 400 || s >= 500 || !(guarded || killed) {
		t.Fatalf("allocating partitioner: %d %s", s, body)
	}

	// A price of 2^62, through the CLI as a user would submit it.
	c.write("price.star", "def run(params, inputs):\n    return {\"x\": 1.0}\n\ndef cost(params):\n    return 1 << 62\n")
	c.write("price.yaml", "name: priced\nprogram: ./price.star\npartitioner: {use: items, params: {items: [1, 2]}}\nreducer: {use: mean}\n")
	out, errOut, err := c.cli("alice", "job", "submit", "price.yaml")
	if err == nil || !strings.Contains(out+errOut, "SC7019") {
		t.Fatalf("a 2^62 price was not refused: %v\n%s%s", err, out, errOut)
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("price refusal exit: %v", err)
	}

	after := c.converged("alice", c.aggs...)
	if after.StateHash != before.StateHash || after.Jobs != before.Jobs || after.PlansRunning != 0 {
		t.Fatalf("hostile submissions changed the state: %+v → %+v", before, after)
	}
}
