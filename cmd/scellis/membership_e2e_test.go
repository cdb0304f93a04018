package main

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/identity"
)

// Membership through the log, through the real binary and no restart of
// any process: an operator adds a worker and a silo to a running
// three-aggregator federation (neither is in anyone's federation file) and
// each does pool work; revoking the worker closes its connections and its
// requests are refused with SC1119; rotating an aggregator's key switches
// that aggregator to its new key in place — clients that follow the log
// reach it, a client pinning the old key cannot — and the cluster goes on
// committing. An aggregator added through the log joins the Raft cluster,
// leaves it and is revoked. Bad changes are refused with their codes and
// exit code 2.
//
// One cluster for all of it; about 20-40 s on two busy cores (three
// aggregators and a fourth, three two-shard jobs), which the issue's "add,
// revoke, rotate with no restart" needs at once.
func TestMembershipThroughTheLog(t *testing.T) {
	// Independent of every other test (own cluster, ports, directories):
	// it runs beside them, so CI waits on the slowest, not on the sum.
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process membership test")
	}
	c := newCluster(t, "own", 3, member{"ops", "operator"}, member{"alice", "researcher"})
	c.startAggregators()

	// New members make their keys; the operator adds them.
	wKey := c.keygen("w-new")
	c.write("w-new.yaml", "name: w-new\nidentity: w-new/identity.key\nfederation: federation.yaml\ncache_dir: w-new/cache\nparallel: 1\npoll: 100ms\n")
	sKey := c.keygen("s-new")
	mustRun(t, scellisCmd(t, c.dir, "datagen", "hospitals", "--sites", "1", "--rows", "100", "--out", "data"))
	sNew := hospitalSilo("s-new", 1, 1, "")
	sNew.header, sNew.policy = "poll: 100ms\n", "  strategies: [fedavg]\n  generic_shards: true\n"
	c.writeSilo(sNew)
	opsKey := strings.TrimSpace(c.read("ops/identity.pub"))

	// Refused changes: each with its code, exit code 2, nothing applied.
	c.refused("alice", "SC1113", []string{"operator"}, "federation", "add", "w-new", "--role", "worker", "--public-key", wKey)
	c.refused("ops", "SC1115", []string{"already ops's"}, "federation", "add", "w-new", "--role", "worker", "--public-key", opsKey)
	c.refused("ops", "SC1115", []string{"already"}, "federation", "add", "alice", "--role", "worker", "--public-key", wKey)
	c.refused("ops", "SC1114", []string{"no member is named", "alicee", `"alice"`}, "federation", "revoke", "alicee")
	c.refused("ops", "SC1116", []string{"last operator"}, "federation", "revoke", "ops")
	c.refused("ops", "SC1117", []string{"Raft voter", "aggregator leave"}, "federation", "revoke", "agg-3")
	c.refused("ops", "SC1101", []string{"did you mean"}, "federation", "add", "x", "--role", "wroker", "--public-key", wKey)
	c.refused("ops", "SC1107", []string{"raft_address"}, "federation", "add", "agg-9", "--role", "aggregator", "--public-key", wKey, "--address", "127.0.0.1:1")

	// Add the worker; it starts from the unchanged file and works.
	if out := c.mustCLI("ops", "federation", "add", "w-new", "--role", "worker", "--public-key", wKey); !strings.Contains(out, "added w-new (membership change 0") {
		t.Fatalf("federation add: %s", out)
	}
	c.startWorker("w-new")
	job1 := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("by-worker", 2)))
	c.waitDone(job1, "w-new")

	// Add the silo, revoke the worker: the next job can only be the silo's.
	c.mustCLI("ops", "federation", "add", "s-new", "--role", "silo", "--public-key", sKey)
	c.start("s-new", "silo", "--config", "s-new.yaml")
	if out := c.mustCLI("ops", "federation", "revoke", "w-new"); !strings.Contains(out, "revoked w-new (membership change 2") {
		t.Fatalf("federation revoke: %s", out)
	}
	job2 := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("by-silo", 2)))
	c.waitDone(job2, "s-new")
	// The revocation is in force on every node once each refuses w-new's
	// key: a client tries the next node on a refusal, so a command as
	// w-new fails with SC1119 only when none accepts it.
	waitFor(t, "the revoked worker to be refused", untilElected(), func() bool {
		_, errs, err := c.cli("w-new", "job", "ls")
		return err != nil && strings.Contains(errs, "SC1119")
	})
	c.refused("w-new", "SC1119", []string{"refused this member's key", "revoked"}, "job", "ls")
	c.refused("ops", "SC1115", []string{"never accepted again"}, "federation", "add", "w-again", "--role", "worker", "--public-key", wKey)

	// Rotate agg-2's key: the new key goes where its config points, the
	// running process picks it up when the rotation applies.
	next := c.keygen("agg-2-next")
	newKey, err := os.ReadFile(filepath.Join(c.dir, "agg-2-next", "identity.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "agg-2", "identity.key"), newKey, 0o600); err != nil {
		t.Fatal(err)
	}
	c.mustCLI("ops", "federation", "rotate", "agg-2", "--public-key", next)
	id, fileFed := c.memberKeys("alice")
	agg2, _ := fileFed.Member("agg-2")
	waitFor(t, "agg-2 to present its new key", untilElected(), func() bool {
		return dialKey(agg2.Address) == next
	})
	// A client that pins the file's (old) key for agg-2 is refused by its
	// own check; one that followed the log is not.
	if err := dialPinned(id, fileFed, agg2.Address); err == nil {
		t.Fatal("a client pinning agg-2's old key completed a handshake")
	}
	followed := fileFed
	cl, err := api.NewClient(id, followed)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), untilQuorum())
	defer cancel()
	if _, err := api.SyncMembership(ctx, cl, followed); err != nil {
		t.Fatal(err)
	}
	if err := dialPinned(id, followed, agg2.Address); err != nil {
		t.Fatalf("a client following the log cannot reach agg-2: %v", err)
	}
	if m, _ := followed.Member("w-new"); m.Name != "" {
		t.Fatal("the followed membership still lists the revoked worker")
	}
	// The cluster goes on: a job commits, and every node, agg-2 included,
	// reaches the same state.
	job3 := strings.TrimSpace(c.mustCLI("alice", "job", "submit", c.montecarlo("after-rotation", 2)))
	c.waitDone(job3, "s-new")
	waitFor(t, "every aggregator at one state hash", untilElected(), func() bool {
		out, _, err := c.cli("alice", "--json", "aggregator", "status")
		if err != nil {
			return false
		}
		var nodes []struct {
			Node      string `json:"node"`
			StateHash string `json:"state_hash"`
		}
		if json.Unmarshal([]byte(out), &nodes) != nil || len(nodes) != 3 {
			return false
		}
		for _, n := range nodes[1:] {
			if n.StateHash != nodes[0].StateHash {
				return false
			}
		}
		return true
	})
	// An aggregator added through the log joins the Raft cluster; once it
	// left the voters again it can be revoked.
	aggKey := c.keygen("agg-4")
	pp := &ports{t: t}
	apiAddr, raftAddr := pp.next(), pp.next()
	pp.release()
	c.write("agg-4.yaml", "name: agg-4\nidentity: agg-4/identity.key\nfederation: federation.yaml\ndata_dir: agg-4/data\nlease_ttl: 2s\nlog_level: error\njoin: true\n")
	c.mustCLI("ops", "federation", "add", "agg-4", "--role", "aggregator", "--public-key", aggKey, "--address", apiAddr, "--raft-address", raftAddr)
	c.start("agg-4", "aggregator", "--config", "agg-4.yaml")
	waitFor(t, "agg-4 to serve", untilElected(), func() bool {
		conn, err := net.DialTimeout("tcp", apiAddr, time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	c.mustCLI("ops", "aggregator", "join", "agg-4")
	waitFor(t, "agg-4 to follow the leader", untilElected(), func() bool {
		out, _, _ := c.cli("alice", "aggregator", "status")
		return strings.Count(out, "follower") == 3 && strings.Contains(out, "agg-4")
	})
	c.refused("ops", "SC1117", []string{"Raft voter"}, "federation", "revoke", "agg-4")
	c.mustCLI("ops", "aggregator", "leave", "agg-4")
	c.mustCLI("ops", "federation", "revoke", "agg-4")

	if out := c.mustCLI("alice", "federation", "members"); !strings.Contains(out, "6 changes since the file") || !strings.Contains(out, next) || strings.Contains(out, "w-new") || strings.Contains(out, "agg-4") {
		t.Fatalf("federation members:\n%s", out)
	}
}

// waitDone waits for a job to be done and checks every shard was verified
// with peer among its agreeing peers.
func (c *cluster) waitDone(id, peer string) {
	c.t.Helper()
	waitFor(c.t, "job "+id+" done", untilRun(), func() bool { return c.status("alice", id).State == "done" })
	for _, s := range c.status("alice", id).Shards {
		if !slices.Contains(s.Agreeing, peer) {
			c.t.Fatalf("job %s shard %d: agreeing %v, want %s", id, s.Index, s.Agreeing, peer)
		}
	}
}

// dialKey returns the public key an aggregator presents, without pinning.
func dialKey(addr string) string {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return ""
	}
	defer conn.Close()
	certs := conn.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return ""
	}
	pub, ok := certs[0].PublicKey.(ed25519.PublicKey)
	if !ok {
		return ""
	}
	return identity.PublicKeyPrefix + base64.StdEncoding.EncodeToString(pub)
}

// dialPinned completes a handshake with addr pinning fed's keys.
func dialPinned(id *identity.Identity, fed *identity.Federation, addr string) error {
	cfg, err := identity.ClientTLSConfig(id, fed, "agg-2", identity.Aggregator)
	if err != nil {
		return err
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Handshake()
}
