package secagg

import (
	"encoding/binary"
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
// received.
func TestServerViewLooksUniform(t *testing.T) {
	const n, dim = 5, 4096
	p := testParams("view", n, 3, dim, 1)
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

	// Every 16-byte window of everything the server received.
	const win = 16
	seen := map[[win]byte]bool{}
	masked := map[string][]uint64{}
	for _, b := range h.recv {
		for i := 0; i+win <= len(b); i++ {
			seen[[win]byte(b[i:i+win])] = true
		}
		if m, err := ParseMaskedInput(b); err == nil {
			w := make([]uint64, len(m.Masked)/8)
			for i := range w {
				w[i] = binary.LittleEndian.Uint64(m.Masked[8*i:])
			}
			masked[m.From] = w
		}
	}
	if len(masked) != n-1 {
		t.Fatalf("server received %d masked inputs, want %d", len(masked), n-1)
	}
	r, _ := newRound(p)
	for u, enc := range h.encoded {
		b := make([]byte, 8*len(enc))
		for i, w := range enc {
			binary.LittleEndian.PutUint64(b[8*i:], w)
		}
		for i := 0; i+win <= len(b); i += 8 {
			if seen[[win]byte(b[i:i+win])] {
				t.Fatalf("plaintext encoding of %s (bytes %d…) appears in what the server received", u, i)
			}
		}
		for k, y := range masked {
			if len(y) != len(enc) {
				t.Fatal("masked vector of the wrong length")
			}
			same := 0
			for i := range y {
				if y[i] == enc[i] {
					same++
				}
			}
			if same > 0 {
				t.Errorf("masked vector of %s equals %s's plaintext encoding in %d coordinates", k, u, same)
			}
		}
		// Decoding the client's own masked vector as if it were plain
		// gives numbers uncorrelated with its input.
		y := masked[u]
		dec := make([]float64, len(y))
		for i := range y {
			dec[i] = decodeValue(y[i], r.fracBits)
		}
		if c := uniformity.Correlation(dec, h.inputs[u]); math.Abs(c) > 6/math.Sqrt(dim) {
			t.Errorf("decoded masked vector of %s correlates with its input: r = %.3f", u, c)
		}
	}
	for k, y := range masked {
		for _, problem := range uniformity.Problems(y) {
			t.Errorf("masked vector of %s: %s", k, problem)
		}
	}
	// Negative control: the same tests reject the plaintext encodings.
	for u, enc := range h.encoded {
		if len(uniformity.Problems(enc)) == 0 {
			t.Errorf("the uniformity tests accept %s's plaintext encoding; they test nothing", u)
		}
	}
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
	if got := after.TotalAlloc - before.TotalAlloc; got > vec/4 {
		t.Errorf("adding %d masked inputs of %d bytes allocated %d bytes; want streaming accumulation", n, vec, got)
	}
	inputs = nil
	req, err := h.server.EndMask()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range req.Survivors {
		u, _ := h.clients[id].Unmask(req)
		if err := h.server.AddUnmasking(u); err != nil {
			t.Fatal(err)
		}
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
