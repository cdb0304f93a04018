package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// A receipt that credits a browser volunteer (a peer named after its own
// key, not in the federation file) beside a member passes `scellis
// receipts verify --federation` through the real binary: the chain the
// coordinator minted, exported as `receipts export --format json` writes
// it, checked offline. The same chain with the volunteer's signature
// swapped for another volunteer key's is refused (SC7306), so the pass is
// not the check being skipped. Lean: no cluster, two runs of the binary.
func TestReceiptsVerifyVolunteerCredit(t *testing.T) {
	t.Parallel()
	bin := scellisBinary(t)
	dir := t.TempDir()
	agg, w1 := identity.NewFromSeed([32]byte{1}), identity.NewFromSeed([32]byte{2})
	vol, other := identity.NewFromSeed([32]byte{3}), identity.NewFromSeed([32]byte{4})
	volName := receipt.VolunteerPeer(vol.Public().String())

	m, err := coordinator.New(coordinator.Config{Regime: trust.Open, DefaultLeaseTTL: 60000, SignedReports: true})
	if err != nil {
		t.Fatal(err)
	}
	job, res := content.Hash([]byte("job")), content.Hash([]byte("result"))
	pol := coordinator.Policy{Replicas: 2}
	apply := func(c coordinator.Command) {
		t.Helper()
		if r := m.Apply(c); r.Refused() {
			t.Fatalf("%T: %v", c, r.Refusal)
		}
	}
	apply(coordinator.SubmitJob{Job: job, Name: "mc", Bundle: content.Hash([]byte("b")), Submitter: "agg-1", Policy: pol,
		Shards: []coordinator.ShardPlan{{Index: 0, ID: content.Hash([]byte("s0")), Price: 3, PriceBasis: "flat"}}, Now: 1})
	for _, p := range []struct {
		name string
		id   *identity.Identity
	}{{volName, vol}, {"w1", w1}} {
		apply(coordinator.Lease{Peer: p.name, Now: 2, Max: 1})
		st := coordinator.StatementOf(job, 0, res, pol, p.name)
		apply(coordinator.ReportResult{Peer: p.name, Job: job, Shard: 0, Result: res, Key: p.id.Public().String(),
			Sig: identity.Sign(p.id, identity.PurposeResult, st.Bytes()), Now: 3})
	}
	rs := m.Receipts(0)
	if len(rs) != 1 || len(rs[0].Peers) != 2 || !receipt.IsVolunteer(rs[0].Peers[0]) && !receipt.IsVolunteer(rs[0].Peers[1]) {
		t.Fatalf("want one receipt crediting the volunteer and w1: %+v", rs)
	}
	write := func(name string, v any) {
		t.Helper()
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("receipts.json", rs)
	forged := m.Receipts(0)
	for i, s := range forged[0].Signatures {
		if s.Peer == volName { // another volunteer's key and signature, under this name
			st := coordinator.StatementOf(job, 0, res, pol, volName)
			forged[0].Signatures[i].Key, forged[0].Signatures[i].Sig = other.Public().String(), identity.Sign(other, identity.PurposeResult, st.Bytes())
		}
	}
	// Re-sealed, so the chain is intact and only the signature is wrong.
	c, err := receipt.NewChain(nil)
	if err != nil {
		t.Fatal(err)
	}
	write("receipts-forged.json", []receipt.Receipt{c.Next(forged[0])})
	fed := fmt.Sprintf("federation: pool\nregime: open\nmembers:\n  - {name: agg-1, role: aggregator, public_key: %s, address: \"127.0.0.1:1\"}\n  - {name: w1, role: worker, public_key: %s}\n",
		agg.Public(), w1.Public())
	if err := os.WriteFile(filepath.Join(dir, "federation.yaml"), []byte(fed), 0o644); err != nil {
		t.Fatal(err)
	}

	exit, stdout, stderr := runBounded(t, bin, dir, "receipts", "verify", "--file", "receipts.json", "--federation", "federation.yaml")
	if exit != 0 || !strings.Contains(stdout, "intact: 1 receipts") || !strings.Contains(stdout, "every receipt is signed by the peers it credits") {
		t.Fatalf("a chain crediting a volunteer: exit %d\nstdout:\n%s\nstderr:\n%s", exit, stdout, stderr)
	}
	exit, stdout, stderr = runBounded(t, bin, dir, "receipts", "verify", "--file", "receipts-forged.json", "--federation", "federation.yaml")
	if exit != 2 || !strings.Contains(stderr, "error[SC7306]") || !strings.Contains(stderr, "was not derived from") || !strings.Contains(stderr, volName) {
		t.Fatalf("a volunteer credit signed by another key: exit %d, want 2 with SC7306 naming %s\nstdout:\n%s\nstderr:\n%s", exit, volName, stdout, stderr)
	}
}
