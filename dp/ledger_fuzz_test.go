package dp

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/scellis/scellis/content"
)

// seedLedger writes a small real ledger and returns its bytes and the
// payloads of its frames: the fuzzers' seed corpus.
func seedLedger(f *testing.F) (file []byte, payloads [][]byte) {
	path := filepath.Join(f.TempDir(), "seed.ledger")
	l, err := Create(path, testKey(1), &Options{Orders: []float64{1.5, 2, 8, 32}, Silo: "st-mary", Now: stepClock()})
	if err != nil {
		f.Fatal(err)
	}
	if _, err := l.DeclareBudget("icu", 3, 1e-5); err != nil {
		f.Fatal(err)
	}
	if _, err := l.Charge(ChargeRequest{Dataset: "icu", Consumer: "round-1", Mechanisms: []Mechanism{SubsampledGaussian(2, 0.01, 100), SubsampledGaussian(5, 1, 1)}}); err != nil {
		f.Fatal(err)
	}
	l.Close()
	file, err = os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	off := len(fileMagic)
	for {
		p, size, res, _ := nextFrame(file[off:], FormatVersion)
		if res != frameOK {
			break
		}
		payloads = append(payloads, p)
		off += size
	}
	if len(payloads) != 3 {
		f.Fatalf("seed ledger has %d entries, want 3: the corpus vanished", len(payloads))
	}
	return file, payloads
}

// FuzzDecodeRecord: the entry decoder never panics, and whatever it accepts
// re-encodes to exactly the same bytes (one encoding per entry, so no
// malleability).
func FuzzDecodeRecord(f *testing.F) {
	_, payloads := seedLedger(f)
	for _, p := range payloads {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		e, err := decodeRecord(p)
		if err != nil {
			return
		}
		body, err := content.Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		again, err := content.Encode(record{Body: body, Hash: e.Hash, Sig: e.Sig})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, p) {
			t.Fatalf("accepted bytes do not round-trip:\n in %x\nout %x", p, again)
		}
	})
}

// FuzzVerifyLedger: verifying arbitrary file bytes never panics; a file that
// verifies is a sequence of frames that re-frame to exactly its bytes.
func FuzzVerifyLedger(f *testing.F) {
	file, _ := seedLedger(f)
	f.Add(file)
	f.Add(file[:len(file)-7])
	f.Add(append(bytes.Clone(file), 0, 0, 0))
	f.Add([]byte(fileMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := verifyBytes("fuzz.ledger", data, nil)
		if err != nil {
			return
		}
		v := formatOfMagic(data)
		out := []byte(magicOf(v))
		for _, e := range s.Entries() {
			body, _ := content.Encode(&e)
			p, _ := content.Encode(record{Body: body, Hash: e.Hash, Sig: e.Sig})
			out = appendFrame(out, p, v)
		}
		if want := data[:len(data)-int(s.TornBytes)]; !bytes.Equal(out, want) {
			t.Fatalf("verified ledger does not re-frame to its bytes")
		}
	})
}
