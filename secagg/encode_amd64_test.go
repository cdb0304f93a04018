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
	defer func(f func() uint64) { tieDraw = f }(tieDraw)
	rng := rand.New(rand.NewPCG(3, 4)) // test data, not secrets
	tieBits := uint64(0)
	tieDraw = func() uint64 { tieBits += 0x9e3779b97f4a7c15; return tieBits }
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
			d := uint16(rng.Uint32())
			if i%5 == 0 { // a tie: the draw equal to the top 16 bits of the fraction
				v := x[i] * scale
				d = uint16(int64((v - math.Floor(v)) * 0x1p16))
			}
			le.PutUint16(draws[2*i:], d)
		}
		for _, w := range []int{8, 4} {
			for _, m := range []int{n, 4, 5, 7} {
				got, want := make([]byte, w*m), make([]byte, w*m)
				tieBits = 0
				encodeTile(got, w, x[:m], scale, draws)
				hasAVX2 = false
				tieBits = 0
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
	defer func(f func() uint64) { tieDraw = f }(tieDraw)
	rng := rand.New(rand.NewPCG(5, 6)) // test data, not secrets
	tieBits := uint64(0)
	tieDraw = func() uint64 { tieBits += 0x9e3779b97f4a7c15; return tieBits }
	const scale = 1 << 20
	for _, w := range []int{8, 4} {
		n := tileBytes / w // a whole tile, the kernel's unit
		x := make([]float64, n)
		draws := make([]byte, roundBytes*n)
		for i := range x {
			x[i] = math.Ldexp(rng.Float64()*2-1, rng.IntN(20)-10)
			d := uint16(rng.Uint32())
			if i%7 == 0 {
				v := x[i] * scale
				d = uint16(int64((v - math.Floor(v)) * 0x1p16))
			}
			le.PutUint16(draws[2*i:], d)
		}
		var src [maskBatch][]byte
		for j := range src {
			src[j] = make([]byte, tileBytes)
			for i := range src[j] {
				src[j][i] = byte(rng.Uint32())
			}
		}
		for k := 0; k <= maskBatch; k++ {
			for _, c := range []uint64{0, uint64(k), ^uint64(0)} {
				if k == 0 && c != 0 {
					continue // c counts subtracted masks
				}
				for _, m := range []int{n, n - 1, 4, 5, 7, 1} {
					got, want := make([]byte, w*m), make([]byte, w*m)
					tieBits = 0
					encodeAddTile(got, w, x[:m], scale, draws, c, &src, k)
					hasAVX2 = false
					tieBits = 0
					encodeTile(want, w, x[:m], scale, draws)
					sumWords(want, c, &src, k)
					hasAVX2 = true
					if !bytes.Equal(got, want) {
						t.Fatalf("width %d, %d values, k=%d c=%#x: fused AVX2 differs from encodeTile + sumWords in Go", w, m, k, c)
					}
				}
			}
		}
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
	var src [maskBatch][]byte
	for j := range src {
		src[j] = make([]byte, tileBytes)
		for i := range src[j] {
			src[j][i] = byte(rng.Uint32())
		}
	}
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
		for k := 0; k <= maskBatch; k++ {
			for _, c := range []uint64{0, uint64(k), ^uint64(0)} {
				if k == 0 && c != 0 {
					continue // c counts subtracted masks
				}
				for _, m := range []int{n, n - 1, 8, 9, 15, 3} {
					got, want := make([]byte, w*m), make([]byte, w*m)
					coordsAddTile(got, w, v[:m], c, &src, k)
					hasAVX2 = false
					putCoords(want, w, v[:m])
					sumWords(want, c, &src, k)
					hasAVX2 = true
					if !bytes.Equal(got, want) {
						t.Fatalf("width %d, %d values, k=%d c=%#x: fused AVX2 differs from putCoords + sumWords", w, m, k, c)
					}
				}
			}
		}
	}
}
