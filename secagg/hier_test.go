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
			for c := range 2 + rng.IntN(2) {
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
			parent, err := NewParent("hier/total", key, cohorts)
			if err != nil {
				t.Fatal(err)
			}
			var total []int64
			parent.testTotal = func(v []int64) { total = v }
			want := make([]int64, dim)
			wantF := make([]float64, dim)
			var wantW float64
			var contributors []string
			for _, p := range cohorts {
				h, ps, _ := runChild(t, p, stops[p.Round])
				for _, id := range h.ids {
					if h.stop[id] < stepMask {
						continue
					}
					contributors = append(contributors, id)
					for i := range dim {
						want[i] += int64(h.encoded[id][i])
						wantF[i] += h.inputs[id][i]
					}
					wantW += h.weights[id]
				}
				if err := parent.AddPartial(ps); err != nil {
					t.Fatalf("parent refuses the partial sum of %s: %v", p.Round, err)
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
	if _, err := NewParent("hier/two", key, []Params{hierParams("a", 4, 4, Pairwise, pk), two}); codeOf(err) != diag.SecAggTooFewSites {
		t.Fatalf("parent over a sub-cohort of two: %v, want SC6002", err)
	}
	if _, err := NewServer(two); codeOf(err) != diag.SecAggTooFewSites {
		t.Fatalf("child of a sub-cohort of two: %v, want SC6002", err)
	}
	if _, err := NewParent("hier/x", key, []Params{hierParams("a", 4, 4, Pairwise, pk), hierParams("b", 4, 4, Pairwise, pk[:31])}); codeOf(err) != diag.SecAggBadParams {
		t.Fatalf("a short parent key: %v, want SC6001", err)
	}
	if _, err := NewParent("hier/x", key, []Params{hierParams("a", 4, 4, Pairwise, pk), hierParams("a", 4, 4, Pairwise, pk)}); codeOf(err) != diag.SecAggBadParams {
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

	a, b := hierParams("a", 5, 8, Pairwise, pk), hierParams("b", 4, 8, Pairwise, pk)
	parent, err := NewParent("hier/r", key, []Params{a, b})
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
