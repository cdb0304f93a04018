package secagg

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"testing"

	"github.com/scellis/scellis/internal/uniformity"
)

// TestServerViewLooksUniform records every byte the server state machine
// receives during a round (adverts, shares, masked inputs, unmaskings) and
// checks that no individual input can be read from it: each masked vector
// differs from the plaintext encoding everywhere, decodes to numbers
// uncorrelated with the input, has balanced bits and a flat byte histogram, and
// no stretch of any plaintext encoding appears anywhere in what the server
// received. It runs for pairwise masking (5 sites) and for SecAgg+ on a
// sparse graph (10 sites, 6 neighbours each), and for a DP round's grid
// whose sum fits the 32-bit ring.
func TestServerViewLooksUniform(t *testing.T) {
	for _, c := range []struct {
		proto  Protocol
		n, thr int
		grid   int
	}{{Pairwise, 5, 3, 0}, {SecAggPlus, 10, 6, 0}, {SecAggPlus, 10, 6, 16}} {
		t.Run(fmt.Sprintf("%s/n=%d/grid=%d", c.proto, c.n, c.grid), func(t *testing.T) {
			serverViewLooksUniform(t, c.proto, c.n, c.thr, c.grid)
		})
	}
}

func serverViewLooksUniform(t *testing.T, proto Protocol, n, thr, grid int) {
	const dim = 4096
	p := testParams("view", n, thr, dim, 1)
	p.Protocol, p.GridBits = proto, grid
	h, err := newHarness(t, p)
	if err != nil {
		t.Fatal(err)
	}
	h.wire = true
	// Highly structured inputs: the plaintext encodings are mostly zero
	// bytes, so any leak would stand out.
	for i, id := range h.ids {
		for j := range h.inputs[id] {
			h.inputs[id][j] = float64((i+j)%5) / 8
		}
	}
	h.stop["c4"] = stepShare // one dropout, so key shares are revealed too
	if !h.run() {
		t.Fatalf("round refused:\n%s", h.out.String())
	}
	r, _ := newRound(p)
	if proto == SecAggPlus && r.k >= n-1 {
		t.Fatalf("SecAgg+ round of %d sites on a complete graph; the test wants a sparse one", n)
	}
	if want := map[int]int{0: 64, 16: 32}[grid]; r.ringBits != want {
		t.Fatalf("ring Z_2^%d, want %d", r.ringBits, want)
	}
	w := r.lay.width

	// Every 16-byte window of everything the server received.
	const win = 16
	seen := map[[win]byte]bool{}
	masked := map[string][]uint64{} // the bytes of each coordinate, zero-extended
	maskedBytes := map[string][]byte{}
	packed := map[string][]uint64{} // the bytes as 64-bit words, for the uniformity tests
	for _, b := range h.recv {
		for i := 0; i+win <= len(b); i++ {
			seen[[win]byte(b[i:i+win])] = true
		}
		if m, err := ParseMaskedInput(b); err == nil {
			packed[m.From] = words(m.Masked)
			masked[m.From] = lanes(m.Masked[:w*dim], w)
			maskedBytes[m.From] = m.Masked
		}
	}
	if len(masked) != n-1 {
		t.Fatalf("server received %d masked inputs, want %d", len(masked), n-1)
	}
	for u, enc := range h.encoded {
		b := make([]byte, w*len(enc))
		putCoords(b, w, enc)
		plain := lanes(b, w)
		for i := 0; i+win <= len(b); i += w {
			if seen[[win]byte(b[i:i+win])] {
				t.Fatalf("plaintext encoding of %s (bytes %d…) appears in what the server received", u, i)
			}
		}
		for k, y := range masked {
			if len(y) != len(enc) {
				t.Fatal("masked vector of the wrong length")
			}
			if same := uniformity.Agreements(y, plain); same > 0 {
				t.Errorf("masked vector of %s equals %s's plaintext encoding in %d coordinates", k, u, same)
			}
		}
		// Decoding the client's own masked vector as if it were plain
		// gives numbers uncorrelated with its input.
		dec := make([]float64, dim)
		for i := range dec {
			dec[i] = math.Ldexp(float64(coordAt(maskedBytes[u], r.lay, i)), -r.fracBits)
		}
		if c := uniformity.Correlation(dec, h.inputs[u]); math.Abs(c) > 6/math.Sqrt(dim) {
			t.Errorf("decoded masked vector of %s correlates with its input: r = %.3f", u, c)
		}
	}
	for k, y := range packed {
		for _, problem := range uniformity.Problems(y) {
			t.Errorf("masked vector of %s: %s", k, problem)
		}
	}
	// Negative control: the same tests reject the plaintext encodings.
	for u, enc := range h.encoded {
		b := make([]byte, w*len(enc))
		putCoords(b, w, enc)
		if len(uniformity.Problems(words(b))) == 0 {
			t.Errorf("the uniformity tests accept %s's plaintext encoding; they test nothing", u)
		}
	}
}

// lanes reads bytes as little-endian words of width bytes, zero-extended.
func lanes(b []byte, width int) []uint64 {
	y := make([]uint64, len(b)/width)
	for i := range y {
		if width == 8 {
			y[i] = binary.LittleEndian.Uint64(b[8*i:])
		} else {
			y[i] = uint64(binary.LittleEndian.Uint32(b[4*i:]))
		}
	}
	return y
}

// words reads bytes as little-endian 64-bit words.
func words(b []byte) []uint64 {
	y := make([]uint64, len(b)/8)
	for i := range y {
		y[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return y
}

// TestServerMemoryIsLinearInDimension checks that the server accumulates
// masked inputs as they arrive: adding n inputs allocates nothing that
// grows with n·d, and finishing allocates O(d).
func TestServerMemoryIsLinearInDimension(t *testing.T) {
	const n, dim = 6, 1 << 14
	h := roundAt(t, n, 0, dim, stepShare)
	dels, err := h.server.EndShare()
	if err != nil {
		t.Fatal(err)
	}
	var inputs []*MaskedInput
	for _, d := range dels {
		m, err := h.clients[d.To].MaskInput(d, h.inputs[d.To], 0)
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, m)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, m := range inputs {
		if err := h.server.AddMaskedInput(m); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	vec := uint64(8 * dim)
	// Keeping or copying the inputs would allocate n·vec. The bound is one
	// vector: the kernel's per-core scratch tiles come from a sync.Pool,
	// which a GC empties and which, under -race, drops Puts on purpose,
	// so a few tiles may be allocated again during the loop.
	if got := after.TotalAlloc - before.TotalAlloc; got > vec {
		t.Errorf("adding %d masked inputs of %d bytes allocated %d bytes; want streaming accumulation", n, vec, got)
	}
	inputs = nil
	req, err := h.server.EndMask()
	if err != nil {
		t.Fatal(err)
	}
	if req, err = consistency(h.server, h.clients, req); err != nil {
		t.Fatal(err)
	}
	if err := unmaskAll(h.server, h.clients, req.Survivors, req, nil); err != nil {
		t.Fatal(err)
	}
	h.server.testRing = nil
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := h.server.Finish(); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 2*vec {
		t.Errorf("finishing allocated %d bytes for a %d-byte sum; want O(d)", got, vec)
	}
}
