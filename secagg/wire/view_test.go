package wire

import (
	"encoding/binary"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/scellis/scellis/internal/uniformity"
	"github.com/scellis/scellis/secagg"
)

// TestHostSeesOnlyMasked records every request body the host receives in
// a round over TLS (one silo dropping after key sharing, so the mask keys
// of a site are revealed too) and checks that no individual input can be
// read from it, as secagg's TestServerViewLooksUniform does for the state
// machine: every masked vector differs from every plaintext encoding in
// every coordinate, decodes to numbers uncorrelated with its site's input,
// and passes coarse uniformity tests (which the plaintext encodings fail);
// no 16-byte stretch of any plaintext encoding, nor of any input's float64
// bytes, appears in anything the host received.
func TestHostSeesOnlyMasked(t *testing.T) {
	t.Parallel()
	const dim = 4096
	w, th, p := roundOf(t, 4, HostOptions{}, "view", dim)
	p.Weighted, p.MaxWeight = false, 0
	f, err := p.FracBits()
	if err != nil {
		t.Fatal(err)
	}
	dl := generous()
	dl.Mask = short
	th.open(t, p, dl)
	// Highly structured inputs (multiples of 1/8, encoded exactly): the
	// plaintext encodings are mostly zero bytes, so a leak would stand out.
	inputs := map[string][]float64{}
	encoded := map[string][]uint64{}
	for i, s := range w.silos {
		x := make([]float64, dim)
		enc := make([]uint64, dim)
		for j := range x {
			x[j] = float64((i+j)%5) / 8
			enc[j] = uint64(int64(math.Ldexp(x[j], f)))
		}
		inputs[s], encoded[s] = x, enc
	}
	ctx := t.Context()
	cab := newCable()
	cab.cutBefore = func(r *http.Request) bool { return endpoint(r, "masked") }
	var runs []*run
	for _, s := range w.silos {
		hc := w.silo(s)
		if s == "hospital-c" {
			hc = w.client(w.ids[s], w.fed, cab.wrap)
		}
		runs = append(runs, participate(ctx, hc, th, p, w.keys[s], inputs[s], 0, s))
	}
	res := th.sum(t, ctx, p.Round)
	if len(res.Dropped) != 1 {
		t.Fatalf("dropped %v, want hospital-c", res.Dropped)
	}
	for _, r := range runs {
		if r.site == "hospital-c" {
			r.cancel()
		}
		r.wait(t)
	}

	th.mu.Lock()
	bodies := th.bodies
	th.mu.Unlock()
	const win = 16
	seen := map[[win]byte]bool{}
	masked := map[string][]uint64{}
	kinds := map[string]int{}
	for _, rec := range bodies {
		b := rec.body
		for i := 0; i+win <= len(b); i++ {
			seen[[win]byte(b[i:i+win])] = true
		}
		kinds[rec.path[strings.LastIndex(rec.path, "/")+1:]]++
		if m, err := secagg.ParseMaskedInput(b); err == nil {
			y := make([]uint64, len(m.Masked)/8)
			for i := range y {
				y[i] = binary.LittleEndian.Uint64(m.Masked[8*i:])
			}
			masked[m.From] = y
		}
	}
	if len(masked) != 3 || kinds["advert"] != 4 || kinds["shares"] != 4 || kinds["unmasking"] != 3 {
		t.Fatalf("host received %v bodies and %d masked inputs; want 4 adverts, 4 shares, 3 masked inputs, 3 unmaskings", kinds, len(masked))
	}
	for u, enc := range encoded {
		plain := make([]byte, 8*len(enc))
		for i, v := range enc {
			binary.LittleEndian.PutUint64(plain[8*i:], v)
		}
		floats := make([]byte, 8*len(enc))
		for i, v := range inputs[u] {
			binary.LittleEndian.PutUint64(floats[8*i:], math.Float64bits(v))
		}
		for name, b := range map[string][]byte{"plaintext encoding": plain, "float64 input": floats} {
			for i := 0; i+win <= len(b); i += 8 {
				if seen[[win]byte(b[i:i+win])] {
					t.Fatalf("the %s of %s (bytes %d…) appears in what the host received", name, u, i)
				}
			}
		}
		for k, y := range masked {
			if same := uniformity.Agreements(y, enc); same > 0 {
				t.Errorf("masked vector of %s equals %s's plaintext encoding in %d coordinates", k, u, same)
			}
		}
		if y, ok := masked[u]; ok {
			dec := make([]float64, len(y))
			for i := range y {
				dec[i] = math.Ldexp(float64(int64(y[i])), -f)
			}
			if c := uniformity.Correlation(dec, inputs[u]); math.Abs(c) > 6/math.Sqrt(dim) {
				t.Errorf("decoded masked vector of %s correlates with its input: r = %.3f", u, c)
			}
		}
	}
	for k, y := range masked {
		for _, problem := range uniformity.Problems(y) {
			t.Errorf("masked vector of %s: %s", k, problem)
		}
	}
	for u, enc := range encoded {
		if len(uniformity.Problems(enc)) == 0 {
			t.Errorf("the uniformity tests accept %s's plaintext encoding; they test nothing", u)
		}
	}
}
