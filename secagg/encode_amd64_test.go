//go:build amd64 && !purego

package secagg

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
)

// TestEncodeAVX2MatchesGo: the AVX2 encoding gives, byte for byte, what
// the Go loop gives, in both widths, for values of every magnitude and
// sign the bound allows (zeros, −0, subnormals, integers, values beside
// 2^52 where fractions end, values near the bound), at several scales,
// with random draws and with draws forced to tie.
func TestEncodeAVX2MatchesGo(t *testing.T) {
	if !hasAVX2 {
		t.Skip("the CPU has no AVX2: the Go loop is the only encoding")
	}
	restartTies := countTies(t)
	rng := rand.New(rand.NewPCG(3, 4)) // test data, not secrets
	for _, f := range []int{0, 1, 16, 40, 52, 60} {
		scale := math.Ldexp(1, f)
		bound := math.Ldexp(1, 61-f) // |x·scale| ≤ 2^61
		const n = 4096 + 3
		x := make([]float64, n)
		for i := range x {
			switch i % 8 {
			case 0:
				x[i] = (rng.Float64()*2 - 1) * bound
			case 1:
				x[i] = math.Ldexp(rng.Float64()*2-1, -rng.IntN(1100)) // down to subnormals
			case 2:
				x[i] = math.Ldexp(float64(rng.Int64N(1<<53)-(1<<52)), -f) // integers on the grid
			case 3:
				x[i] = math.Ldexp(float64(1<<52)+float64(rng.IntN(5)-2)+0.5*float64(rng.IntN(2)), -f) * float64(1-2*rng.IntN(2))
			case 4:
				x[i] = []float64{0, math.Copysign(0, -1), bound, -bound, math.SmallestNonzeroFloat64, -math.SmallestNonzeroFloat64}[rng.IntN(6)]
			default:
				x[i] = math.Ldexp(rng.Float64()*2-1, rng.IntN(30)-20)
			}
			x[i] = max(-bound, min(bound, x[i]))
		}
		draws := make([]byte, roundBytes*n)
		for i := range n {
			le.PutUint16(draws[2*i:], drawFor(rng, x[i]*scale, i%5 == 0))
		}
		for _, w := range []int{8, 4} {
			for _, m := range []int{n, 4, 5, 7} {
				got, want := make([]byte, w*m), make([]byte, w*m)
				restartTies()
				encodeTile(got, w, x[:m], scale, draws)
				hasAVX2 = false
				restartTies()
				encodeTile(want, w, x[:m], scale, draws)
				hasAVX2 = true
				if !bytes.Equal(got, want) {
					for i := 0; i < len(got); i += 8 {
						if !bytes.Equal(got[i:min(i+8, len(got))], want[i:min(i+8, len(got))]) {
							t.Fatalf("f=%d width %d, %d values: byte %d differs (x=%v): AVX2 %x, Go %x", f, w, m, i, x[i/w], got[i:min(i+8, len(got))], want[i:min(i+8, len(got))])
						}
					}
				}
			}
		}
	}
}

// TestEncodeAddAVX2MatchesGo: the fused encoding and first batch of
// masks (encodeAddTile, AVX2 bulk) stores, byte for byte, what the Go
// path does in two steps — encodeTile, then sumWords — in both widths,
// for every batch size (short batches read zeroChunk in the assembly),
// every count of subtracted masks, lengths around the four-value steps
// and a last odd 4-byte coordinate, with draws forced to tie.
func TestEncodeAddAVX2MatchesGo(t *testing.T) {
	if !hasAVX2 {
		t.Skip("the CPU has no AVX2: the Go path is the only one")
	}
	restartTies := countTies(t)
	rng := rand.New(rand.NewPCG(5, 6)) // test data, not secrets
	const scale = 1 << 20
	for _, w := range []int{8, 4} {
		n := tileBytes / w // a whole tile, the kernel's unit
		x := make([]float64, n)
		draws := make([]byte, roundBytes*n)
		for i := range x {
			x[i] = math.Ldexp(rng.Float64()*2-1, rng.IntN(20)-10)
			le.PutUint16(draws[2*i:], drawFor(rng, x[i]*scale, i%7 == 0))
		}
		src := randomTiles(rng)
		matchesGo(t, w, []int{n, n - 1, 4, 5, 7, 1}, "encodeTile + sumWords",
			func(dst []byte, m, k int, c uint64) {
				restartTies()
				encodeAddTile(dst, w, x[:m], scale, draws, c, src, k)
			},
			func(dst []byte, m, k int, c uint64) {
				restartTies()
				encodeTile(dst, w, x[:m], scale, draws)
				sumWords(dst, c, src, k)
			})
	}
}

// TestCoordsAddAVX2MatchesGo: a DP round's integers put on the ring with
// the first batch of masks in one pass (coordsAddTile, AVX2 bulk) give
// the bytes of putCoords then sumWords in Go, in both widths, for every
// batch size, with integers of both signs up to the 64-bit extremes and
// lengths around the eight-value steps and a last odd 4-byte coordinate.
func TestCoordsAddAVX2MatchesGo(t *testing.T) {
	if !hasAVX2 {
		t.Skip("the CPU has no AVX2: the Go path is the only one")
	}
	rng := rand.New(rand.NewPCG(7, 8)) // test data, not secrets
	src := randomTiles(rng)
	for _, w := range []int{8, 4} {
		n := tileBytes / w
		v := make([]int64, n)
		for i := range v {
			switch i % 4 {
			case 0:
				v[i] = rng.Int64N(1<<31) - 1<<30
			case 1:
				v[i] = int64(rng.Uint64())
			case 2:
				v[i] = []int64{0, -1, 1, math.MaxInt32, math.MinInt32, math.MaxInt64, math.MinInt64}[rng.IntN(7)]
			default:
				v[i] = -rng.Int64N(1 << 16)
			}
		}
		matchesGo(t, w, []int{n, n - 1, 8, 9, 15, 3}, "putCoords + sumWords",
			func(dst []byte, m, k int, c uint64) { coordsAddTile(dst, w, v[:m], c, src, k) },
			func(dst []byte, m, k int, c uint64) {
				putCoords(dst, w, v[:m])
				sumWords(dst, c, src, k)
			})
	}
}

// countTies makes tieDraw a fixed sequence for the test (the old one is
// back after it) and returns what restarts the sequence, so that the AVX2
// and the Go path see the same draws.
func countTies(t *testing.T) (restart func()) {
	old := tieDraw
	t.Cleanup(func() { tieDraw = old })
	var bits uint64
	tieDraw = func() uint64 { bits += 0x9e3779b97f4a7c15; return bits }
	return func() { bits = 0 }
}

// drawFor is a random rounding draw for the value v, or with tie the draw
// equal to the top 16 bits of v's fraction (a tie); it takes one number
// of rng either way.
func drawFor(rng *rand.Rand, v float64, tie bool) uint16 {
	d := uint16(rng.Uint32())
	if tie {
		d = uint16(int64((v - math.Floor(v)) * 0x1p16))
	}
	return d
}

// randomTiles is a batch of keystream tiles of random bytes.
func randomTiles(rng *rand.Rand) *[maskBatch][]byte {
	var src [maskBatch][]byte
	for j := range src {
		src[j] = make([]byte, tileBytes)
		for i := range src[j] {
			src[j][i] = byte(rng.Uint32())
		}
	}
	return &src
}

// matchesGo fills a destination of w-byte words with fused (the AVX2
// bulk) and another with steps (the Go path, AVX2 off) for every batch
// size k, count c of subtracted masks (none without a batch) and length m
// of lengths, and fails where their bytes differ.
func matchesGo(t *testing.T, w int, lengths []int, steps string, fused, goPath func(dst []byte, m, k int, c uint64)) {
	t.Helper()
	for k := 0; k <= maskBatch; k++ {
		for _, c := range []uint64{0, uint64(k), ^uint64(0)} {
			if k == 0 && c != 0 {
				continue // c counts subtracted masks
			}
			for _, m := range lengths {
				got, want := make([]byte, w*m), make([]byte, w*m)
				fused(got, m, k, c)
				hasAVX2 = false
				goPath(want, m, k, c)
				hasAVX2 = true
				if !bytes.Equal(got, want) {
					t.Fatalf("width %d, %d values, k=%d c=%#x: fused AVX2 differs from %s in Go", w, m, k, c, steps)
				}
			}
		}
	}
}
