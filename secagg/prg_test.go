package secagg

import (
	"bytes"
	"crypto/aes"
	"encoding/binary"
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

// TestMaskAddSubtractCancels: adding then subtracting the same mask is the
// identity, across chunk boundaries, for both keystreams; the two parties
// of a pair derive the same key; and different keys give different masks.
func TestMaskAddSubtractCancels(t *testing.T) {
	session := bytes.Repeat([]byte{1}, 32)
	for _, g := range []PRG{AESCTR, ChaCha20} {
		m := &masker{prg: g}
		for _, n := range []int{1, 7, chunkWords - 1, chunkWords, chunkWords + 1, 3*chunkWords + 5} {
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
			m.add(acc, kuv, pairSign("alice", "bob"))
			if n > 4 && slices.Equal(acc, orig) {
				t.Fatal("mask changed nothing")
			}
			m.add(acc, kvu, pairSign("bob", "alice"))
			if !slices.Equal(acc, orig) {
				t.Fatalf("%s, n=%d: pairwise masks do not cancel", g, n)
			}
		}
		a, b := make([]uint64, 64), make([]uint64, 64)
		m.add(a, selfMaskKey(bytes.Repeat([]byte{2}, 32), session, "alice"), 1)
		m.add(b, selfMaskKey(bytes.Repeat([]byte{2}, 32), session, "bob"), 1)
		if slices.Equal(a, b) {
			t.Fatal("self masks of two clients from one seed coincide")
		}
		c := make([]uint64, 64)
		m.add(c, selfMaskKey(bytes.Repeat([]byte{2}, 32), bytes.Repeat([]byte{3}, 32), "alice"), 1)
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

// TestApplyTiledEqualsOneByOne: applying many masks tile by tile gives the
// same vector as applying them one after the other.
func TestApplyTiledEqualsOneByOne(t *testing.T) {
	session := bytes.Repeat([]byte{4}, 32)
	for _, g := range []PRG{AESCTR, ChaCha20} {
		var masks []mask
		for i := range 7 {
			masks = append(masks, mask{selfMaskKey([]byte{byte(i)}, session, "u"), 1 - 2*(i%2)})
		}
		n := 3*chunkWords + 5
		a, b := make([]uint64, n), make([]uint64, n)
		m := &masker{prg: g}
		m.apply(a, masks)
		for _, mk := range masks {
			m.add(b, mk.key, mk.sign)
		}
		if !slices.Equal(a, b) {
			t.Fatalf("%s: tiled masking differs from one mask at a time", g)
		}
	}
}
