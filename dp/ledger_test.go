package dp

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
)

func testKey(b byte) ed25519.PrivateKey {
	var seed [32]byte
	seed[0] = b
	return ed25519.NewKeyFromSeed(seed[:])
}

// stepClock is a deterministic clock advancing one second per reading.
func stepClock() func() time.Time {
	var mu sync.Mutex
	t := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Second)
		return t
	}
}

func newTestLedger(t *testing.T, eps float64) (*Ledger, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "privacy.ledger")
	l, err := Create(path, testKey(1), &Options{Orders: []float64{1.5, 2, 4, 8, 16, 32, 64}, Now: stepClock()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if _, err := l.DeclareBudget("icu", eps, 1e-5); err != nil {
		t.Fatal(err)
	}
	return l, path
}

func charge(consumer string, sigma, q float64, steps int64) ChargeRequest {
	return ChargeRequest{Dataset: "icu", Consumer: consumer, Mechanisms: []Mechanism{SubsampledGaussian(sigma, q, steps)}}
}

func wantCode(t *testing.T, err error, code diag.Code) *diag.Diagnostic {
	t.Helper()
	ds, ok := diag.As(err)
	if !ok || ds[0].Code != code {
		t.Fatalf("got %v, want a %s diagnostic", err, code)
	}
	return ds[0]
}

func TestLedgerChargeReopenVerify(t *testing.T) {
	l, path := newTestLedger(t, 2)
	var last float64
	for i := range 5 {
		e, err := l.Charge(charge("round-"+string(rune('a'+i)), 1.1, 0.01, 200))
		if err != nil {
			t.Fatal(err)
		}
		if e.Charge.Cumulative < last {
			t.Fatalf("cumulative ε decreased: %v after %v", e.Charge.Cumulative, last)
		}
		last = e.Charge.Cumulative
	}
	st, _ := l.Status("icu")
	l.Close()
	l2, err := Open(path, testKey(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	st2, _ := l2.Status("icu")
	if st != st2 || st.Charges != 5 || st.Spent != last {
		t.Fatalf("status before reopen %+v, after %+v", st, st2)
	}
	s, err := Verify(path, testKey(1).Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 7 || s.TornBytes != 0 {
		t.Fatalf("verified %d entries, torn %d", s.Len(), s.TornBytes)
	}
	// The cumulative ε is the composition, not the sum, of the charges.
	var sum float64
	for _, e := range s.Entries() {
		if e.Charge != nil {
			sum += e.Charge.Epsilon
		}
	}
	if !(last < sum) {
		t.Fatalf("composed ε %v is not below the sum of charges %v", last, sum)
	}
}

func TestLedgerOverdraftWritesNothing(t *testing.T) {
	l, path := newTestLedger(t, 1)
	if _, err := l.Charge(charge("r1", 1.5, 0.02, 100)); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)
	_, err := l.Charge(charge("r2", 0.8, 0.05, 5000))
	d := wantCode(t, err, diag.LedgerOverdraft)
	for _, w := range []string{"spent ε=", "requested ε=", "remaining ε="} {
		if !strings.Contains(d.Message, w) {
			t.Errorf("overdraft message %q lacks %q", d.Message, w)
		}
	}
	if !strings.Contains(d.Help, "steps at σ=0.8") {
		t.Errorf("help %q does not say how many steps fit", d.Help)
	}
	after, _ := os.Stat(path)
	if before.Size() != after.Size() {
		t.Fatalf("a refused charge wrote %d bytes", after.Size()-before.Size())
	}
	n, err := l.MaxSteps("icu", 0.02, 1.5)
	if err != nil || n < 1 {
		t.Fatal(n, err)
	}
	if _, err := l.Charge(charge("r3", 1.5, 0.02, n)); err != nil {
		t.Fatalf("MaxSteps said %d steps fit: %v", n, err)
	}
	if _, err := l.Charge(charge("r4", 1.5, 0.02, 1)); err == nil {
		t.Fatal("a step beyond MaxSteps was accepted")
	}
}

func TestLedgerRefusals(t *testing.T) {
	l, path := newTestLedger(t, 1)
	_, err := l.Charge(ChargeRequest{Dataset: "nope", Consumer: "r", Mechanisms: []Mechanism{SubsampledGaussian(1, 0.1, 1)}})
	wantCode(t, err, diag.LedgerNoBudget)
	_, err = l.DeclareBudget("icu", 5, 1e-5)
	wantCode(t, err, diag.LedgerBudgetExists)
	_, err = l.Charge(charge("r", -1, 0.1, 1))
	wantCode(t, err, diag.DPBadSigma)
	_, err = l.Charge(charge("", 1, 0.1, 1))
	wantCode(t, err, diag.LedgerBadName)
	_, err = l.Charge(charge("bad\nname", 1, 0.1, 1))
	wantCode(t, err, diag.LedgerBadName)
	_, err = l.DeclareBudget("x", 1, 1)
	wantCode(t, err, diag.DPBadDelta)

	_, err = Open(path, testKey(2), nil)
	wantCode(t, err, diag.LedgerKeyMismatch)
	_, err = Create(path, testKey(1), nil)
	wantCode(t, err, diag.LedgerExists)
	_, err = Open(filepath.Join(t.TempDir(), "missing"), testKey(1), nil)
	wantCode(t, err, diag.LedgerUnreadable)

	junk := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(junk, []byte("hello, not a ledger\n"), 0o644)
	_, err = Open(junk, testKey(1), nil)
	wantCode(t, err, diag.LedgerNotLedger)
	_, err = Verify(junk, nil)
	wantCode(t, err, diag.LedgerNotLedger)
}

// Entries removed behind an open Ledger's back are noticed on the next
// charge, and no charge is accepted after that.
func TestLedgerNoticesShrink(t *testing.T) {
	l, path := newTestLedger(t, 5)
	if _, err := l.Charge(charge("r1", 1, 0.01, 10)); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	os.Truncate(path, fi.Size()-10)
	_, err := l.Charge(charge("r2", 1, 0.01, 10))
	wantCode(t, err, diag.LedgerCorrupt)
	os.Truncate(path, fi.Size()) // even restored, this handle stays refused
	_, err = l.Charge(charge("r3", 1, 0.01, 10))
	wantCode(t, err, diag.LedgerCorrupt)
}

// Goroutines on two Ledger handles (two open file descriptions, like two
// processes) race to charge one dataset: the budget holds and every
// accepted charge is in the file.
func TestLedgerConcurrentCharges(t *testing.T) {
	l1, path := newTestLedger(t, 1)
	l2, err := Open(path, testKey(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	var accepted atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		l := l1
		if g%2 == 1 {
			l = l2
		}
		wg.Go(func() {
			for i := 0; ; i++ {
				_, err := l.Charge(charge("g", 3, 0.01, 100))
				if err != nil {
					if ds, ok := diag.As(err); ok && ds[0].Code == diag.LedgerOverdraft {
						return
					}
					t.Error(err)
					return
				}
				accepted.Add(1)
			}
		})
	}
	wg.Wait()
	s, err := Verify(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := s.Dataset("icu")
	if st.Spent > 1 || int64(st.Charges) != accepted.Load() || accepted.Load() < 2 {
		t.Fatalf("spent %v of 1 in %d charges, %d accepted", st.Spent, st.Charges, accepted.Load())
	}
}

// A torn last write (a crash mid-append) is cut on open, saved aside, and
// no complete entry is lost. A full-length last frame failing its checksum
// is not a torn write: verification fails, and a writer refuses to open the
// ledger and cuts nothing.
func TestLedgerCutsTornTail(t *testing.T) {
	l, path := newTestLedger(t, 5)
	if _, err := l.Charge(charge("r1", 1, 0.01, 10)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	good, _ := os.ReadFile(path)
	short := appendFrame(nil, bytes.Repeat([]byte{0xa1}, 100), FormatVersion)[:30] // valid header, payload cut
	damaged := appendFrame(nil, []byte("abcde"), FormatVersion)
	damaged[len(damaged)-1] ^= 1
	for _, tail := range [][]byte{{0, 0}, {0, 0, 1, 0, 0xa1}, make([]byte, 4096), short, damaged} {
		os.WriteFile(path, append(append([]byte{}, good...), tail...), 0o600)
		s, err := Verify(path, nil)
		if bytes.Equal(tail, damaged) {
			if err == nil || !strings.Contains(err.Error(), "fails its checksum") {
				t.Fatalf("tail %q: damaged last frame verified: %v", tail, err)
			}
			if _, err := Open(path, testKey(1), nil); err == nil {
				t.Fatalf("tail %q: a writer opened a ledger with a damaged last frame", tail)
			}
			if now, _ := os.ReadFile(path); len(now) != len(good)+len(tail) {
				t.Fatalf("tail %q: a refused open changed the file", tail)
			}
			continue
		}
		if err != nil || s.TornBytes != int64(len(tail)) || s.Len() != 3 {
			t.Fatalf("tail %q: verify %v, torn %d", tail, err, s.TornBytes)
		}
		l, err := Open(path, testKey(1), nil)
		if err != nil {
			t.Fatalf("tail %q: %v", tail, err)
		}
		if len(l.TornTails()) != 1 {
			t.Fatalf("tail %q: not reported as cut", tail)
		}
		l.Close()
		now, _ := os.ReadFile(path)
		if string(now) != string(good) {
			t.Fatalf("tail %q: ledger not restored to its complete entries", tail)
		}
		saved, err := os.ReadFile(fmt.Sprintf("%s.torn-%d", path, len(good)))
		if err != nil || string(saved) != string(tail) {
			t.Fatalf("tail %q: torn bytes not saved aside (%v)", tail, err)
		}
		os.Remove(fmt.Sprintf("%s.torn-%d", path, len(good)))
	}
}

// BenchmarkLedgerCharge measures charges per second with fsync. The
// default grid's 151 orders make the accountant most of the cost; six
// integer orders show the cost of locking, signing, writing and fsync.
func BenchmarkLedgerCharge(b *testing.B) {
	for _, bc := range []struct {
		name   string
		orders []float64
	}{{"default-orders", nil}, {"6-integer-orders", []float64{2, 4, 8, 16, 32, 64}}} {
		b.Run(bc.name, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "bench.ledger")
			l, err := Create(path, testKey(1), &Options{Orders: bc.orders})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			l.DeclareBudget("icu", 1e9, 1e-5)
			req := charge("bench", 5, 0.001, 1)
			for b.Loop() {
				if _, err := l.Charge(req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "charges/s")
		})
	}
}
