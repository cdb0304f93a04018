package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/volunteer"
	"github.com/scellis/scellis/volunteer/proof"
)

// tabClient plays a browser volunteer against a real aggregator's
// volunteer page: join (proof of work, join signature), lease, results.
type tabClient struct {
	t    *testing.T
	hc   *http.Client
	base string
	priv ed25519.PrivateKey
	key  string
	tok  string
	peer string
}

func newTabClient(t *testing.T, base string, seed byte) *tabClient {
	return newTabClientFrom(t, base, seed, nil)
}

// newTabClientFrom is newTabClient whose connections leave from local, an
// address of the loopback network (127.0.1.1 is another /24 than
// 127.0.0.1, so another origin to the volunteer server).
func newTabClientFrom(t *testing.T, base string, seed byte, local net.IP) *tabClient {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, 32))
	tr := &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, // the page's self-signed certificate; not what is tested here
	}}
	if local != nil {
		tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: local}}).DialContext
	}
	hc := &http.Client{Timeout: time.Minute, Transport: tr}
	t.Cleanup(hc.CloseIdleConnections)
	return &tabClient{t: t, hc: hc, base: base, priv: priv, key: receipt.KeyPrefix + base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))}
}

func (tc *tabClient) post(path string, in, out any) {
	tc.t.Helper()
	if err := tc.try(path, in, out); err != nil {
		tc.t.Fatal(err)
	}
}

// try is post for another goroutine than the test's: it returns the
// failure.
func (tc *tabClient) try(path string, in, out any) error {
	b, _ := json.Marshal(in)
	req, _ := http.NewRequest("POST", tc.base+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if tc.tok != "" {
		req.Header.Set("Authorization", "Bearer "+tc.tok)
	}
	res, err := tc.hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		var body bytes.Buffer
		body.ReadFrom(res.Body)
		return fmt.Errorf("%s: %s %s", path, res.Status, body.String())
	}
	if out != nil {
		return json.NewDecoder(res.Body).Decode(out)
	}
	return nil
}

func (tc *tabClient) join() {
	var c volunteer.Challenge
	tc.post("/volunteer/v1/challenge", volunteer.ChallengeRequest{Key: tc.key}, &c)
	sig, _ := tc.priv.Sign(nil, proof.JoinMessage(c.Challenge, tc.key), &ed25519.Options{Context: proof.PurposeJoin})
	var s volunteer.Session
	tc.post("/volunteer/v1/join", volunteer.JoinRequest{Key: tc.key, Challenge: c.Challenge,
		Nonce: strconv.FormatUint(proof.Solve(c.Challenge, tc.key, c.Difficulty), 10), Sig: base64.StdEncoding.EncodeToString(sig)}, &s)
	tc.tok, tc.peer = s.Token, s.Peer
}

func (tc *tabClient) lease(max int) []volunteer.Grant {
	var r volunteer.LeaseResponse
	tc.post("/volunteer/v1/lease", volunteer.LeaseRequest{Max: max}, &r)
	return r.Grants
}

// report sends result for g, signed as the page signs it; it returns once
// the result is revealed.
func (tc *tabClient) report(g volunteer.Grant, result []byte) error {
	st := receipt.Statement{Job: g.Job, Shard: g.Shard, Result: content.Hash(result), Tier: g.Tier, Peer: tc.peer}
	sig, _ := tc.priv.Sign(nil, st.Bytes(), &ed25519.Options{Context: string(identity.PurposeResult)})
	return tc.try("/volunteer/v1/results", volunteer.ResultRequest{Job: g.Job, Shard: g.Shard,
		Result: base64.StdEncoding.EncodeToString(result), Sig: base64.StdEncoding.EncodeToString(sig)}, nil)
}

// openVolunteerPool starts an open pool's aggregator with its volunteer
// page and submits a 4-shard Monte Carlo job named name: it returns the
// cluster, the page's base URL and the job's ID.
func openVolunteerPool(t *testing.T, name string) (*cluster, string, string) {
	c := newCluster(t, "open", 1, member{"alice", "researcher"})
	pp := &ports{t: t}
	vaddr := pp.next()
	pp.release()
	c.write("scellis.wasm", "unused")
	c.write("wasm_exec.js", "unused")
	c.write("agg-1.yaml", "name: agg-1\nidentity: agg-1/identity.key\nfederation: federation.yaml\ndata_dir: agg-1/data\nlease_ttl: 5s\nlog_level: error\n"+
		"volunteer_listen: "+vaddr+"\nvolunteer_wasm: scellis.wasm\nvolunteer_difficulty: 4\n")
	c.startAggregators()
	id := string(bytes.TrimSpace([]byte(c.mustCLI("alice", "job", "submit", c.montecarlo(name, 4)))))
	return c, "https://" + vaddr, id
}

// reportAll reports result for every grant at once, as a tab's workers
// do: each waits for its reveal.
func (tc *tabClient) reportAll(gs []volunteer.Grant, result []byte) {
	tc.t.Helper()
	errs := make(chan error, len(gs))
	for _, g := range gs {
		go func() { errs <- tc.report(g, result) }()
	}
	for range gs {
		if err := <-errs; err != nil {
			tc.t.Fatal(err)
		}
	}
}

// noShardDecided fails t for every shard of job id that was verified.
func noShardDecided(t *testing.T, c *cluster, id, by string) {
	t.Helper()
	for _, s := range c.fullStatus(id).Shards {
		if s.State == coordinator.StateVerified {
			t.Errorf("shard %d was decided (%s) by %s", s.Index, s.Result.Short(), by)
		}
	}
}

// The reviewer's Sybil through a real aggregator: one attacker, two
// volunteer keys joined from one network (127.0.0.1, one /24), on an open
// pool's 4-shard job. Before, the second key leased the second replica of
// every shard the first held, both reported the same wrong result, and
// all 4 shards were verified and receipted with it. Now the second key is
// granted nothing the first holds or answered, and no shard is decided:
// the wrong result waits for a peer of another network (or a member
// worker), whose honest result would disagree with it.
func TestSameNetworkVolunteersCannotDecideE2E(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process test")
	}
	c, base, id := openVolunteerPool(t, "mc-sybil")
	a, b := newTabClient(t, base, 71), newTabClient(t, base, 72)
	a.join()
	b.join()
	ga := a.lease(8)
	if len(ga) != 4 {
		t.Fatalf("the first key got %d shards, want all 4", len(ga))
	}
	if gb := b.lease(8); len(gb) != 0 {
		t.Fatalf("the second key of the same network got %d shards the first holds", len(gb))
	}
	a.reportAll(ga, []byte(`{"pi": 4}`))
	if gb := b.lease(8); len(gb) != 0 {
		t.Fatalf("the second key of the same network got %d shards the first answered", len(gb))
	}
	noShardDecided(t, c, id, "one network's keys")
}

// The Sybil that prefix rules do not stop, through a real aggregator: two
// fresh volunteer keys of two networks (127.0.0.1 and 127.0.1.1, two
// /24s). Neither has standing, so the second is granted none of the
// shards the first holds or answered (but the canary, which the known
// answer decides), and their agreeing wrong result decides nothing: a
// shard of an open pool is decided only with a member or a volunteer with
// standing among its agreeing peers, or by a canary's known answer.
func TestFreshVolunteersOfTwoNetworksCannotDecideE2E(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process test")
	}
	c, base, id := openVolunteerPool(t, "mc-fresh")
	a := newTabClient(t, base, 73)
	b := newTabClientFrom(t, base, 74, net.IPv4(127, 0, 1, 1))
	a.join()
	b.join()
	ga := a.lease(8)
	if len(ga) != 4 {
		t.Fatalf("the first key got %d shards, want all 4", len(ga))
	}
	if gb := b.lease(8); len(gb) != 0 {
		t.Fatalf("a fresh key of another network got %d shards a fresh key holds", len(gb))
	}
	wrong := []byte(`{"pi": 4}`)
	a.reportAll(ga, wrong)
	// The job's one canary (⌈4 × 5 %⌉) is open to every key: a known
	// answer decides it, not a second key. Nothing else is.
	gb := b.lease(8)
	if len(gb) > 1 {
		t.Fatalf("a fresh key of another network got %d shards a fresh key answered, want at most the canary", len(gb))
	}
	b.reportAll(gb, wrong)
	noShardDecided(t, c, id, "fresh keys")
}
