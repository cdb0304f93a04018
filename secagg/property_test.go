package secagg

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/scellis/scellis/diag"
)

// TestSecureSumMatchesPlainSum runs rounds with random n in [3, 20],
// threshold, dimension, inputs and dropouts at random steps, and checks the
// result against the dumb reference — the plaintext sum of the survivors'
// inputs — exactly in the ring and within the fixed-point bound as floats.
// When too many clients drop, the round must be refused with SC6002 or
// SC6004 and release no sum.
//
// It runs for both protocols. SecAgg+ rounds draw n in [3, 26], so most
// run on a sparse Harary graph (n ≥ 8) and the rest on every pair. A
// third of the rounds take the finest fixed grid whose sum fits Z_2^32,
// as a DP round's does, so they run in the narrow ring (coordinates in
// pairs, odd dimensions too) with extremes at ±clip. Every other round
// the clients mask into used buffers (MaskInputTo), whose stale bytes
// must not show in the sum.
func TestSecureSumMatchesPlainSum(t *testing.T) {
	for _, proto := range []Protocol{Pairwise, SecAggPlus} {
		t.Run(string(proto), func(t *testing.T) { secureSumMatchesPlainSum(t, proto) })
	}
}

func secureSumMatchesPlainSum(t *testing.T, proto Protocol) {
	rounds, dropOdds := 30, 5
	if proto == SecAggPlus {
		// Dropouts at about the rate SecAgg+'s graph is sized for
		// (PlusDropoutRate); more would mostly test its refusals.
		rounds, dropOdds = 14, 10
	}
	if testing.Short() {
		rounds = 12
	}
	// math/rand only chooses test cases; the protocol's randomness is
	// crypto/rand throughout.
	rng := rand.New(rand.NewPCG(20170101, 4))
	var ok, refused, sparse, narrow int
	for i := range rounds {
		n := 3 + rng.IntN(18)
		if proto == SecAggPlus {
			n = 3 + rng.IntN(24)
		}
		t0 := n/2 + 1 + rng.IntN(n-n/2)
		dim := 1 + rng.IntN(40)
		clip := []float64{1, 10, 1e6}[rng.IntN(3)]
		p := testParams("prop", n, t0, dim, clip)
		if rng.IntN(3) == 0 {
			p.Weighted, p.MaxWeight = true, 1e4
		}
		p.PRG = []PRG{AESCTR, ChaCha20}[rng.IntN(2)]
		p.Protocol = proto
		if rng.IntN(3) == 0 {
			f := 0
			for n*(int(math.Ldexp(clip, f+1))+1) <= math.MaxInt32 {
				f++
			}
			p.GridBits = f
		}
		h, err := newHarness(t, p)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if p.GridBits > 0 {
			if h.server.r.ringBits != 32 {
				t.Fatalf("round %d: grid 2^-%d for %d sites of clip %v runs in Z_2^%d, want 32", i, p.GridBits, n, clip, h.server.r.ringBits)
			}
			narrow++
		}
		if r := h.server.r; r.k < r.n-1 {
			sparse++
		}
		h.wire = rng.IntN(2) == 0
		h.reuse = i%2 == 1
		for _, id := range h.ids {
			x := h.inputs[id]
			for j := range x {
				switch rng.IntN(8) {
				case 0:
					x[j] = clip
				case 1:
					x[j] = -clip
				default:
					x[j] = (2*rng.Float64() - 1) * clip
				}
			}
			if p.Weighted {
				h.weights[id] = rng.Float64() * p.MaxWeight
			}
			// Each client drops with probability 1/dropOdds, after a
			// random step.
			if rng.IntN(dropOdds) == 0 {
				h.stop[id] = step(rng.IntN(int(stepUnmask)))
			}
		}
		if h.run() {
			ok++
			if h.result == nil {
				t.Fatalf("round %d: finished without a result", i)
			}
			continue
		}
		refused++
		if h.result != nil {
			t.Fatalf("round %d: refused but released a result", i)
		}
		unrevealed := false // a site advertised, then dropped before its graph reveal
		for _, s := range h.stop {
			unrevealed = unrevealed || (s == stepAdvertise && h.server.r.revealed())
		}
		if c := codeOf(h.server.Err()); c != diag.SecAggTooFewSites && c != diag.SecAggBelowThreshold && (c != diag.SecAggGraphReveal || !unrevealed) {
			t.Fatalf("round %d (n=%d t=%d): refused with %v, want SC6002 or SC6004\n%s", i, n, t0, h.server.Err(), h.out.String())
		}
	}
	t.Logf("%d rounds summed, %d refused, %d on a sparse graph, %d in Z_2^32", ok, refused, sparse, narrow)
	if narrow == 0 {
		t.Fatal("no round ran in the 32-bit ring")
	}
	if proto == SecAggPlus && sparse < rounds/2 {
		t.Fatalf("only %d of %d SecAgg+ rounds ran on a sparse graph", sparse, rounds)
	}
	if ok < rounds/3 {
		t.Fatalf("only %d of %d rounds produced a sum; the test exercises too little", ok, rounds)
	}
}
