package secagg

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
)

// hierParams returns the Params of sub-cohort name: sites name1…name<n>,
// on a fixed grid (so sub-cohorts of any size add on one grid), sealed to
// parent.
func hierParams(name string, n, dim int, proto Protocol, parent []byte) Params {
	p := Params{Round: "hier/" + name, Dim: dim, Clip: 1, GridBits: 20, Protocol: proto, Parent: parent, Weighted: true, MaxWeight: 64}
	for i := range n {
		id := fmt.Sprintf("%s%d", name, i+1)
		p.Members = append(p.Members, Member{ID: id, Key: identity(id).Public().(ed25519.PublicKey)})
	}
	return p
}

// runChild drives one sub-cohort through its child's server, in wire mode
// (every byte the child receives is in h.recv), and returns the harness
// and the partial sum the child forwards, through its canonical bytes.
func runChild(t *testing.T, p Params, stop map[string]step) (*harness, *PartialSum, []byte) {
	t.Helper()
	h, err := newHarness(t, p)
	if err != nil {
		t.Fatal(err)
	}
	h.wire = true
	for id, s := range stop {
		h.stop[id] = s
	}
	// The child's Finish is refused: its shares are sealed to the parent.
	if h.run() || !strings.Contains(h.out.String(), string(diag.SecAggRelayed)) {
		t.Fatalf("the child's Finish was not refused with SC6019:\n%s", h.out.String())
	}
	ps, err := h.server.Relay()
	if err != nil {
		t.Fatalf("relay: %v\n%s", err, h.out.String())
	}
	b, err := ps.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParsePartialSum(b)
	if err != nil {
		t.Fatalf("parse partial sum: %v", err)
	}
	if again, err := back.Marshal(); err != nil || !bytes.Equal(again, b) {
		t.Fatalf("a partial sum does not round-trip through its canonical bytes")
	}
	if _, err := ParsePartialSum(append(slices.Clone(b), 0)); err == nil {
		t.Fatalf("a partial sum with a trailing byte was parsed")
	}
	return h, back, b
}

// withSites lays every sub-cohort out for the round's total number of
// sites (Params.Sites), as a parent's plan does.
func withSites(cohorts ...Params) []Params {
	total := 0
	for _, p := range cohorts {
		total += len(p.Members)
	}
	out := slices.Clone(cohorts)
	for i := range out {
		out[i].Sites = total
	}
	return out
}

// delegateKey is the delegate identity of a test's child cluster; every
// test child's parent federation lists delegateOf's keys.
func delegateKey(cluster string) ed25519.PrivateKey { return identity("delegate " + cluster) }

func delegateOf(cluster string) (ed25519.PublicKey, bool) {
	return delegateKey(cluster).Public().(ed25519.PublicKey), true
}

// planOf names the cluster of each sub-cohort: "cl-" and its round.
func planOf(cohorts []Params) []SubCohort {
	var plan []SubCohort
	for _, p := range cohorts {
		plan = append(plan, SubCohort{Round: p.Round, Cluster: "cl-" + p.Round})
	}
	return plan
}

// outerMasks draws each child's outer mask for the round parent and
// returns them with the signed keys, through their canonical bytes (as
// the parent's host publishes them).
func outerMasks(t *testing.T, parent string, plan []SubCohort) ([]*OuterMask, []OuterKey) {
	t.Helper()
	var masks []*OuterMask
	var keys []OuterKey
	for _, c := range plan {
		o, err := NewOuterMask(parent, c.Round, c.Cluster, delegateKey(c.Cluster))
		if err != nil {
			t.Fatal(err)
		}
		b, err := o.Key().Marshal()
		if err != nil {
			t.Fatal(err)
		}
		k, err := ParseOuterKey(b)
		if err != nil {
			t.Fatal(err)
		}
		masks, keys = append(masks, o), append(keys, *k)
	}
	b, err := (&OuterKeys{Keys: keys}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseOuterKeys(b)
	if err != nil {
		t.Fatal(err)
	}
	return masks, back.Keys
}

func parentKey(t *testing.T) *ecdh.PrivateKey {
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestHierarchicalSumOfSums runs hierarchical rounds of two or three
// sub-cohorts with random sizes and dropouts before masking (the site's
// pairwise masks are removed with its key's shares) and after masking
// (its self mask is rebuilt from its seed's shares), under pairwise masking
// and SecAgg+ on sparse graphs, and checks the parent's total exactly on
// the grid against the sum of every surviving site's plaintext encoding,
// the weight against the survivors' weights, and the float sum within the
// error bound.
func TestHierarchicalSumOfSums(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(22, 2)) // chooses test cases only
	for it := range 8 {
		proto := []Protocol{Pairwise, SecAggPlus}[it%2]
		t.Run(fmt.Sprintf("%s/%d", proto, it), func(t *testing.T) {
			key := parentKey(t)
			dim := 1 + rng.IntN(300)
			var cohorts []Params
			stops := map[string]map[string]step{}
			nc := 2 + rng.IntN(2)
			if it == 7 {
				nc = 1 // no outer mask: the total is the one sum
			}
			for c := range nc {
				n := 3 + rng.IntN(6)
				if proto == SecAggPlus {
					n = 10 + rng.IntN(4) // sparse: k < n−1
				}
				p := hierParams(string(rune('a'+c)), n, dim, proto, key.PublicKey().Bytes())
				r, err := newRound(p)
				if err != nil {
					t.Fatal(err)
				}
				if proto == SecAggPlus && r.k >= n-1 {
					t.Fatalf("SecAgg+ sub-cohort of %d on a complete graph", n)
				}
				// Up to n − floor dropouts (one under SecAgg+, whose
				// neighbourhoods are small), before or after masking.
				stop := map[string]step{}
				drops := rng.IntN(n - r.floor + 1)
				if proto == SecAggPlus {
					drops = min(drops, 1)
				}
				for _, m := range p.Members[:drops] {
					stop[m.ID] = []step{stepShare, stepMask}[rng.IntN(2)]
				}
				cohorts = append(cohorts, p)
				stops[p.Round] = stop
			}
			cohorts = withSites(cohorts...)
			parent, err := NewParent("hier/total", key, cohorts)
			if err != nil {
				t.Fatal(err)
			}
			var total []int64
			parent.testTotal = func(v []int64) { total = v }
			rings := map[string][]byte{}
			parent.testRing = func(round string, ring []byte) { rings[round] = ring }
			want := make([]int64, dim)
			wantF := make([]float64, dim)
			var wantW float64
			var contributors []string
			plan := planOf(cohorts)
			masks, keys := outerMasks(t, "hier/total", plan)
			plain := map[string][]uint64{} // each sub-cohort's plaintext sum, on the ring
			for c, p := range cohorts {
				h, ps, _ := runChild(t, p, stops[p.Round])
				plain[p.Round] = make([]uint64, dim+1)
				for _, id := range h.ids {
					if h.stop[id] < stepMask {
						continue
					}
					contributors = append(contributors, id)
					for i := range dim {
						want[i] += int64(h.encoded[id][i])
						wantF[i] += h.inputs[id][i]
					}
					for i := range dim + 1 {
						plain[p.Round][i] += h.encoded[id][i]
					}
					wantW += h.weights[id]
				}
				masked := slices.Clone(ps.Masked)
				if err := masks[c].Apply(p, ps, plan, keys, delegateOf); err != nil {
					t.Fatalf("child %s: outer mask: %v", plan[c].Cluster, err)
				}
				if nc == 1 && !bytes.Equal(masked, ps.Masked) {
					t.Fatalf("the outer mask of a lone sub-cohort is not zero")
				}
				if err := parent.AddPartial(ps); err != nil {
					t.Fatalf("parent refuses the partial sum of %s: %v", p.Round, err)
				}
			}
			// What the parent computes per sub-cohort hides its sum at
			// every coordinate, the weight's too, when there are two or
			// more sub-cohorts (and is that sum when there is one).
			r, _ := newRound(cohorts[0])
			for _, p := range cohorts {
				ring := rings[p.Round]
				for i := range dim {
					if same := uint64(coordAt(ring, r.lay, i)) == plain[p.Round][i]; same != (nc == 1) {
						t.Fatalf("sub-cohort %s, coordinate %d: the parent's ring sum equals the plaintext sum: %v (sub-cohorts: %d)", p.Round, i, same, nc)
					}
				}
				if same := uint64(weightAt(ring, r.lay)) == plain[p.Round][dim]; same != (nc == 1) {
					t.Fatalf("sub-cohort %s: the parent's weight equals the plaintext weight: %v (sub-cohorts: %d)", p.Round, same, nc)
				}
			}
			res, err := parent.Finish()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(total, want) {
				t.Fatalf("total on the grid differs from the sum of the survivors' encodings")
			}
			if res.Weight != wantW {
				t.Fatalf("weight %v, want %v", res.Weight, wantW)
			}
			slices.Sort(contributors)
			if !slices.Equal(res.Contributors, contributors) {
				t.Fatalf("contributors %v, want %v", res.Contributors, contributors)
			}
			for i := range dim {
				if math.Abs(res.Sum[i]-wantF[i]) > res.ErrorBound {
					t.Fatalf("sum[%d] = %v, want %v within %v", i, res.Sum[i], wantF[i], res.ErrorBound)
				}
			}
		})
	}
}

// TestHierarchicalRefusals: a sub-cohort of two is refused by the parent
// and the child; the child cannot Finish a relayed round, a flat round
// cannot Relay, and a relayed round refuses shares in the clear; the
// parent refuses a partial below the sub-cohort's floor, one whose
// survivor set differs from the set the sites signed (the sealed shares do
// not open), a second partial of one sub-cohort, and a total while a
// sub-cohort is missing.
func TestHierarchicalRefusals(t *testing.T) {
	key := parentKey(t)
	pk := key.PublicKey().Bytes()
	two := hierParams("two", 2, 4, Pairwise, pk)
	if _, err := NewParent("hier/two", key, withSites(hierParams("a", 4, 4, Pairwise, pk), two)); codeOf(err) != diag.SecAggTooFewSites {
		t.Fatalf("parent over a sub-cohort of two: %v, want SC6002", err)
	}
	if _, err := NewServer(two); codeOf(err) != diag.SecAggTooFewSites {
		t.Fatalf("child of a sub-cohort of two: %v, want SC6002", err)
	}
	if _, err := NewParent("hier/x", key, withSites(hierParams("a", 4, 4, Pairwise, pk), hierParams("b", 4, 4, Pairwise, pk[:31]))); codeOf(err) != diag.SecAggBadParams {
		t.Fatalf("a short parent key: %v, want SC6001", err)
	}
	if _, err := NewParent("hier/x", key, withSites(hierParams("a", 4, 4, Pairwise, pk), hierParams("a", 4, 4, Pairwise, pk))); codeOf(err) != diag.SecAggBadParams {
		t.Fatalf("one site in two sub-cohorts: %v, want SC6001", err)
	}
	flat, err := newHarness(t, testParams("flat", 4, 0, 4, 1))
	if err != nil {
		t.Fatal(err)
	}
	if !flat.advertise() || !flat.share() || !flat.mask() {
		t.Fatal(flat.out.String())
	}
	if req, err := flat.server.EndMask(); err != nil {
		t.Fatal(err)
	} else if _, err := consistency(flat.server, flat.clients, req); err != nil {
		t.Fatal(err)
	}
	if _, err := flat.server.Relay(); codeOf(err) != diag.SecAggRelayed {
		t.Fatalf("Relay of a flat round: %v, want SC6019", err)
	}

	// Sub-cohorts not on one layout: each on its own size's, or one
	// laid out for another total.
	if _, err := NewParent("hier/x", key, []Params{hierParams("a", 5, 8, Pairwise, pk), hierParams("b", 4, 8, Pairwise, pk)}); codeOf(err) != diag.SecAggBadParams {
		t.Fatalf("sub-cohorts on their own sizes' layouts: %v, want SC6001", err)
	}
	odd := withSites(hierParams("a", 5, 8, Pairwise, pk), hierParams("b", 4, 8, Pairwise, pk))
	odd[1].Sites = 10
	if _, err := NewParent("hier/x", key, odd); codeOf(err) != diag.SecAggBadParams {
		t.Fatalf("a sub-cohort laid out for another total: %v, want SC6001", err)
	}
	odd[1].Sites = 3
	if _, err := NewServer(odd[1]); codeOf(err) != diag.SecAggBadParams {
		t.Fatalf("a sub-cohort laid out for fewer sites than its members: %v, want SC6001", err)
	}
	ab := withSites(hierParams("a", 5, 8, Pairwise, pk), hierParams("b", 4, 8, Pairwise, pk))
	a, b := ab[0], ab[1]
	parent, err := NewParent("hier/r", key, ab)
	if err != nil {
		t.Fatal(err)
	}
	_, psA, _ := runChild(t, a, nil)
	_, psB, _ := runChild(t, b, nil)

	low := *psB
	low.Survivors = psB.Survivors[:2]
	if err := parent.AddPartial(&low); codeOf(err) == "" {
		t.Fatalf("a partial with two survivors was accepted")
	}
	moved := *psA // one survivor reported dropped: not the set the sites signed
	moved.Survivors, moved.Dropped = psA.Survivors[1:], []string{psA.Survivors[0]}
	moved.Commits = psA.Commits[1:]
	moved.Unmaskings = slices.DeleteFunc(slices.Clone(psA.Unmaskings), func(u Unmasking) bool { return u.From == psA.Survivors[0] })
	if err := parent.AddPartial(&moved); codeOf(err) != diag.SecAggDecrypt {
		t.Fatalf("a partial with another survivor set: %v, want SC6014", err)
	}
	tampered := *psA
	tampered.Unmaskings = slices.Clone(psA.Unmaskings)
	tampered.Unmaskings[0].Sealed = slices.Clone(psA.Unmaskings[0].Sealed)
	tampered.Unmaskings[0].Sealed[30] ^= 1
	if err := parent.AddPartial(&tampered); codeOf(err) != diag.SecAggDecrypt {
		t.Fatalf("a partial with altered sealed shares: %v, want SC6014", err)
	}
	if err := parent.AddPartial(psA); err != nil {
		t.Fatal(err)
	}
	if err := parent.AddPartial(psA); codeOf(err) != diag.SecAggDuplicate {
		t.Fatalf("a second partial of one sub-cohort: %v, want SC6006", err)
	}
	if _, err := parent.Finish(); codeOf(err) != diag.SecAggBelowThreshold {
		t.Fatalf("a total with a sub-cohort missing: %v, want SC6004", err)
	}
	if err := parent.AddPartial(psB); err != nil {
		t.Fatal(err)
	}
	if _, err := parent.Finish(); err != nil {
		t.Fatal(err)
	}

	// Shares in the clear reach a relayed child: refused.
	h, err := newHarness(t, hierParams("c", 4, 4, Pairwise, pk))
	if err != nil {
		t.Fatal(err)
	}
	if !h.advertise() || !h.share() || !h.mask() {
		t.Fatal(h.out.String())
	}
	req, _ := h.server.EndMask()
	signed, err := consistency(h.server, h.clients, req)
	if err != nil {
		t.Fatal(err)
	}
	u, err := h.clients[h.ids[0]].Unmask(signed)
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Sealed) == 0 || len(u.Seeds)+len(u.Keys) != 0 {
		t.Fatalf("a site of a relayed round sent shares in the clear")
	}
	clearU := &Unmasking{Round: u.Round, From: u.From, Seeds: []Share{{Of: h.ids[0], Value: make([]byte, keySize)}}}
	if err := h.server.AddUnmasking(clearU); codeOf(err) != diag.SecAggMalformed {
		t.Fatalf("shares in the clear at a relayed child: %v, want SC6013", err)
	}
}

// TestChildViewHoldsNoShare records every byte the child receives in a
// sub-cohort of five with a dropout before masking and one after (so both
// seed and key shares are revealed), and the partial sum it forwards, and
// checks that no share the parent opens appears in any of it — not even
// a 12-byte stretch — that every unmasking it relays is sealed, and that
// the masked sum it forwards differs from its sub-cohort's plaintext sum at
// every coordinate (the survivors' self masks are still on it).
func TestChildViewHoldsNoShare(t *testing.T) {
	for _, proto := range []Protocol{Pairwise, SecAggPlus} {
		t.Run(string(proto), func(t *testing.T) {
			key := parentKey(t)
			n := 6
			if proto == SecAggPlus {
				n = 10
			}
			p := hierParams("v", n, 512, proto, key.PublicKey().Bytes())
			parent, err := NewParent("hier/view", key, []Params{p})
			if err != nil {
				t.Fatal(err)
			}
			var opened [][]byte
			parent.testOpened = func(u *Unmasking) {
				for _, sh := range slices.Concat(u.Seeds, u.Keys) {
					opened = append(opened, slices.Clone(sh.Value))
				}
			}
			h, ps, psBytes := runChild(t, p, map[string]step{"v1": stepShare, "v2": stepMask})
			if err := parent.AddPartial(ps); err != nil {
				t.Fatal(err)
			}
			if len(opened) == 0 {
				t.Fatal("the parent opened no share")
			}
			const win = 12
			view := append(slices.Clone(h.recv), psBytes)
			for _, sh := range opened {
				for i := 0; i+win <= len(sh); i++ {
					for _, b := range view {
						if bytes.Contains(b, sh[i:i+win]) {
							t.Fatalf("bytes %d–%d of an opened share appear in the child's view", i, i+win)
						}
					}
				}
			}
			sealed := 0
			for _, b := range h.recv {
				if u, err := ParseUnmasking(b); err == nil {
					if len(u.Seeds)+len(u.Keys) != 0 || len(u.Sealed) == 0 {
						t.Fatalf("the child received shares of %q in the clear", u.From)
					}
					sealed++
				}
			}
			if sealed < 3 {
				t.Fatalf("the child relayed %d sealed unmaskings", sealed)
			}
			r, _ := newRound(p)
			for i := range p.Dim {
				var plain int64
				for _, id := range h.ids {
					if h.stop[id] >= stepMask {
						plain += int64(h.encoded[id][i])
					}
				}
				if got := coordAt(ps.Masked, r.lay, i); got == plain {
					t.Fatalf("coordinate %d of the forwarded masked sum is the plaintext sum", i)
				}
			}
		})
	}
}

// TestOuterMaskRefusals: a child refuses (SC6020), leaving its partial
// sum as it was, a key set missing another child's key, one with an extra
// child, a key signed by another key than its cluster's delegate, a
// low-order X25519 point its child signed, two keys of one cluster, a key of another round, a key in its own place that is
// not its own, and a plan that leaves it out or lists one sub-cohort for
// a layout of more sites; and a mask is applied once.
func TestOuterMaskRefusals(t *testing.T) {
	key := parentKey(t)
	pk := key.PublicKey().Bytes()
	cohorts := withSites(hierParams("a", 3, 4, Pairwise, pk), hierParams("b", 3, 4, Pairwise, pk), hierParams("c", 3, 4, Pairwise, pk))
	plan := planOf(cohorts)
	_, ps, _ := runChild(t, cohorts[0], nil)
	_, keys := outerMasks(t, "hier/o", plan)
	fresh := func() (*OuterMask, []OuterKey) { // a's mask, and every key with a's own
		o, err := NewOuterMask("hier/o", plan[0].Round, plan[0].Cluster, delegateKey(plan[0].Cluster))
		if err != nil {
			t.Fatal(err)
		}
		return o, append([]OuterKey{*o.Key()}, keys[1:]...)
	}
	resign := func(k OuterKey, by ed25519.PrivateKey) OuterKey {
		k.Sign(by)
		return k
	}
	extra, err := NewOuterMask("hier/o", "hier/z", "cl-hier/z", delegateKey("cl-hier/z"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewOuterMask("hier/other", plan[1].Round, plan[1].Cluster, delegateKey(plan[1].Cluster))
	if err != nil {
		t.Fatal(err)
	}
	second, err := NewOuterMask("hier/o", plan[1].Round, plan[1].Cluster, delegateKey(plan[1].Cluster))
	if err != nil {
		t.Fatal(err)
	}
	impostor, err := NewOuterMask("hier/o", plan[0].Round, plan[0].Cluster, delegateKey(plan[0].Cluster))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func([]OuterKey) []OuterKey
		plan []SubCohort
		p    Params
	}{
		{name: "missing child", edit: func(k []OuterKey) []OuterKey { return k[:2] }},
		{name: "extra child", edit: func(k []OuterKey) []OuterKey { return append(k, *extra.Key()) }},
		{name: "signed by the wrong key", edit: func(k []OuterKey) []OuterKey {
			k[1] = resign(k[1], delegateKey("mallory"))
			return k
		}},
		{name: "signed by another child's key", edit: func(k []OuterKey) []OuterKey {
			k[2] = resign(k[2], delegateKey(plan[1].Cluster))
			return k
		}},
		{name: "a low-order point, signed by its child", edit: func(k []OuterKey) []OuterKey {
			k[1].Key = make([]byte, len(k[1].Key)) // all zeros: every shared secret with it is zero
			k[1] = resign(k[1], delegateKey(plan[1].Cluster))
			return k
		}},
		{name: "two keys of one child", edit: func(k []OuterKey) []OuterKey { return append(k, *second.Key()) }},
		{name: "key of another round", edit: func(k []OuterKey) []OuterKey {
			k[1] = *other.Key()
			return k
		}},
		{name: "another key in the child's place", edit: func(k []OuterKey) []OuterKey {
			k[0] = *impostor.Key()
			return k
		}},
		{name: "the plan leaves the child out", plan: plan[1:]},
		{name: "a lone sub-cohort laid out for more sites", plan: plan[:1]},
		{name: "a plan of three for a sub-cohort laid out alone", p: hierParams("a", 3, 4, Pairwise, pk)},
	}
	for _, tc := range cases {
		o, ks := fresh()
		if tc.edit != nil {
			ks = tc.edit(slices.Clone(ks))
		}
		pl, p := cmpOr(tc.plan, plan), cohorts[0]
		if tc.p.Round != "" {
			p = tc.p
		}
		before := slices.Clone(ps.Masked)
		if err := o.Apply(p, ps, pl, ks, delegateOf); codeOf(err) != diag.SecAggOuterKeys {
			t.Errorf("%s: %v, want SC6020", tc.name, err)
		}
		if !bytes.Equal(before, ps.Masked) {
			t.Fatalf("%s: a refused outer mask changed the partial sum", tc.name)
		}
	}
	o, ks := fresh()
	if err := o.Apply(cohorts[0], ps, plan, ks, delegateOf); err != nil {
		t.Fatal(err)
	}
	if err := o.Apply(cohorts[0], ps, plan, ks, delegateOf); codeOf(err) != diag.SecAggOutOfOrder {
		t.Fatalf("an outer mask applied twice: %v, want SC6011", err)
	}
	// A child checks keys against its own copy of the parent federation:
	// a cluster it does not list is refused even with a valid signature.
	o, ks = fresh()
	only := func(cluster string) (ed25519.PublicKey, bool) {
		if cluster == plan[2].Cluster {
			return nil, false
		}
		return delegateOf(cluster)
	}
	if err := o.Apply(cohorts[0], ps, plan, ks, only); codeOf(err) != diag.SecAggOuterKeys {
		t.Fatalf("a key of a cluster the child's federation does not list: %v, want SC6020", err)
	}
}

func cmpOr[T any](a, b []T) []T {
	if a != nil {
		return a
	}
	return b
}
