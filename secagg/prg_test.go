package secagg

import (
	"bytes"
	"crypto/aes"
	"encoding/binary"
	"runtime"
	"slices"
	"testing"

	"golang.org/x/sys/cpu"
)

func TestAESCTRIsCounterModeWithZeroIV(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	ks := make([]byte, 64)
	AESCTR.stream(key).XORKeyStream(ks, ks)
	b, _ := aes.NewCipher(key)
	for i := range 4 {
		var ctr, want [16]byte
		binary.BigEndian.PutUint64(ctr[8:], uint64(i))
		b.Encrypt(want[:], ctr[:])
		if !bytes.Equal(ks[16*i:16*i+16], want[:]) {
			t.Fatalf("block %d of the keystream is not AES(key, %d)", i, i)
		}
	}
}

// maskOnce applies one mask to a 64-bit vector through the kernel.
func maskOnce(g PRG, acc []uint64, key []byte, sign int) {
	l := layout{vals: len(acc), width: 8}
	b := make([]byte, l.size())
	for i, w := range acc {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	applyMasks(g, b, l, []mask{{key, sign}}, nil)
	for i := range acc {
		acc[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
}

// TestMaskAddSubtractCancels: adding then subtracting the same mask is the
// identity, across tile boundaries, for both keystreams; the two parties
// of a pair derive the same key; and different keys give different masks.
func TestMaskAddSubtractCancels(t *testing.T) {
	session := bytes.Repeat([]byte{1}, 32)
	const tw = tileBytes / 8
	for _, g := range []PRG{AESCTR, ChaCha20} {
		for _, n := range []int{1, 7, tw - 1, tw, tw + 1, 3*tw + 5} {
			orig := make([]uint64, n)
			for i := range orig {
				orig[i] = uint64(i) * 0x9e3779b97f4a7c15
			}
			acc := slices.Clone(orig)
			kuv := pairMaskKey(bytes.Repeat([]byte{9}, 32), session, "alice", "bob")
			kvu := pairMaskKey(bytes.Repeat([]byte{9}, 32), session, "bob", "alice")
			if !bytes.Equal(kuv, kvu) {
				t.Fatal("pair key is not symmetric")
			}
			maskOnce(g, acc, kuv, pairSign("alice", "bob"))
			if n > 4 && slices.Equal(acc, orig) {
				t.Fatal("mask changed nothing")
			}
			maskOnce(g, acc, kvu, pairSign("bob", "alice"))
			if !slices.Equal(acc, orig) {
				t.Fatalf("%s, n=%d: pairwise masks do not cancel", g, n)
			}
		}
		a, b := make([]uint64, 64), make([]uint64, 64)
		maskOnce(g, a, selfMaskKey(bytes.Repeat([]byte{2}, 32), session, "alice"), 1)
		maskOnce(g, b, selfMaskKey(bytes.Repeat([]byte{2}, 32), session, "bob"), 1)
		if slices.Equal(a, b) {
			t.Fatal("self masks of two clients from one seed coincide")
		}
		c := make([]uint64, 64)
		maskOnce(g, c, selfMaskKey(bytes.Repeat([]byte{2}, 32), bytes.Repeat([]byte{3}, 32), "alice"), 1)
		if slices.Equal(a, c) {
			t.Fatal("self masks of two sessions coincide")
		}
	}
}

func TestDefaultPRG(t *testing.T) {
	want := ChaCha20
	if cpu.X86.HasAES || cpu.ARM64.HasAES || cpu.S390X.HasAES {
		want = AESCTR
	}
	if got := DefaultPRG(); got != want {
		t.Fatalf("DefaultPRG() = %s, want %s", got, want)
	}
}

// TestStreamAtSeeks: the keystream positioned at any offset is the
// sequential keystream with that many bytes skipped (the kernel's
// segments on different cores rely on it).
func TestStreamAtSeeks(t *testing.T) {
	key := bytes.Repeat([]byte{5}, 32)
	for _, g := range []PRG{AESCTR, ChaCha20} {
		full := make([]byte, 4096)
		g.stream(key).XORKeyStream(full, full)
		for _, off := range []int{0, 1, 15, 16, 17, 63, 64, 65, 100, 1024, 4000} {
			got := make([]byte, len(full)-off)
			g.streamAt(key, off).XORKeyStream(got, got)
			if !bytes.Equal(got, full[off:]) {
				t.Fatalf("%s: keystream at %d differs from the sequential keystream", g, off)
			}
		}
	}
}

// TestKernelMatchesReference: the kernel — segments on several cores,
// tiles, both widths, the weight coordinate, fill functions — gives the
// same vector as the plain definition: each coordinate plus or minus the
// word of every mask's sequential keystream at the coordinate's bytes.
func TestKernelMatchesReference(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4)) // four segments even on a smaller machine
	session := bytes.Repeat([]byte{4}, 32)
	for _, g := range []PRG{AESCTR, ChaCha20} {
		for _, l := range []layout{
			{vals: 3, width: 4, weight: true},
			{vals: 4*parMinBytes/4 + 13, width: 4, weight: true},
			{vals: 4*parMinBytes/8 + 5, width: 8, weight: true},
			{vals: tileBytes/4 + 1, width: 4},
		} {
			if segs := l.segments(4); l.size() > 4*parMinBytes && len(segs) < 4 {
				t.Fatalf("%+v: %d segments, want the vector cut for four cores", l, len(segs))
			}
			var masks []mask
			for i := range 5 {
				masks = append(masks, mask{selfMaskKey([]byte{byte(i)}, session, "u"), 1 - 2*(i%2)})
			}
			plain := make([]byte, l.size())
			for i := range plain {
				plain[i] = byte(i*7 + 3)
			}
			got := make([]byte, l.size())
			applyMasks(g, got, l, masks, func(_ *scratch, vec []byte, lo, hi, _ int, c uint64, src *[maskBatch][]byte, k int) {
				copy(vec[lo:hi], plain[lo:hi])
				sumWords(vec[lo:hi], c, src, k) // the first batch of masks is the fill's to add
			})
			want := slices.Clone(plain)
			for _, mk := range masks {
				ks := make([]byte, l.size())
				g.stream(mk.key).XORKeyStream(ks, ks)
				refAdd(want, ks, l, mk.sign)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s %+v: kernel differs from the reference", g, l)
			}
		}
	}
}

// refAdd is the definition of a mask, word by word: the reference the
// kernel is checked against. 4-byte value coordinates go in pairs, one
// word of Z_2^64 (putCoords), a last odd one alone in Z_2^32.
func refAdd(v, ks []byte, l layout, sign int) {
	vb := l.vals * l.width
	o := 0
	for ; o+8 <= vb; o += 8 {
		binary.LittleEndian.PutUint64(v[o:], binary.LittleEndian.Uint64(v[o:])+uint64(sign)*binary.LittleEndian.Uint64(ks[o:]))
	}
	if o < vb {
		binary.LittleEndian.PutUint32(v[o:], binary.LittleEndian.Uint32(v[o:])+uint32(sign)*binary.LittleEndian.Uint32(ks[o:]))
	}
	if l.weight {
		o := l.weightOff()
		binary.LittleEndian.PutUint64(v[o:], binary.LittleEndian.Uint64(v[o:])+uint64(sign)*binary.LittleEndian.Uint64(ks[o:]))
	}
}
