package secagg

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestSumWordsMatchesDefinition: the batch addition (AVX2 on amd64 where
// the CPU has it, Go elsewhere) adds c and every source word to each
// 8-byte word, a last 4-byte word in 32 bits, for every batch size and
// for lengths around its 64-byte blocks, with carries that wrap.
func TestSumWordsMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2)) // test data, not secrets
	fill := func(b []byte) {
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
	}
	for k := 1; k <= maskBatch; k++ {
		for _, n := range []int{0, 4, 8, 60, 64, 68, 128, 200, tileBytes - 4, tileBytes} {
			for _, c := range []uint64{0, 1, 3, ^uint64(0)} {
				var src [maskBatch][]byte
				for i := range k {
					src[i] = make([]byte, n)
					fill(src[i])
				}
				dst := make([]byte, n)
				fill(dst)
				want := bytes.Clone(dst)
				o := 0
				for ; o+8 <= n; o += 8 {
					v := le.Uint64(want[o:]) + c
					for i := range k {
						v += le.Uint64(src[i][o:])
					}
					le.PutUint64(want[o:], v)
				}
				if o+4 <= n {
					v := le.Uint32(want[o:]) + uint32(c)
					for i := range k {
						v += le.Uint32(src[i][o:])
					}
					le.PutUint32(want[o:], v)
				}
				sumWords(dst, c, &src, k)
				if !bytes.Equal(dst, want) {
					t.Fatalf("k=%d n=%d c=%#x: sum differs from the definition", k, n, c)
				}
			}
		}
	}
}
