package silo_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/silo"
)

// A silo with history never starts over with fresh budgets: a removed
// ledger, or another ledger put at its path, is refused with SC5041; the
// silo's own ledger, restored, opens again. Its ledger file is 0600.
func TestSiloRefusesLedgerWithoutHistory(t *testing.T) {
	t.Parallel()
	w := newRoundWorld(t)
	const name = "hospital-a"
	a := w.openSilo(name, nil)
	c := a.Config
	a.Close()
	if fi, err := os.Stat(c.Ledger); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ledger mode: %v %v", fi.Mode(), err)
	}
	own, _ := os.ReadFile(c.Ledger)
	open := func() error {
		a, err := silo.Open(c, w.ids[name], w.fed, silo.Options{})
		if err == nil {
			a.Close()
		}
		return err
	}
	wantHistory := func(err error) {
		t.Helper()
		ds, ok := diag.As(err)
		if !ok || ds[0].Code != diag.LedgerHistory {
			t.Fatalf("got %v, want SC5041", err)
		}
	}
	os.Remove(c.Ledger)
	wantHistory(open())
	if _, err := os.Stat(c.Ledger); err == nil {
		t.Fatal("a refused open created a ledger")
	}
	// Another silo's ledger (a fresh one) at the path: refused too.
	other := w.siloConfig("hospital-b", nil)
	b, err := silo.Open(other, w.ids["hospital-b"], w.fed, silo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	theirs, _ := os.ReadFile(other.Ledger)
	os.WriteFile(c.Ledger, theirs, 0o600)
	if err := open(); err == nil {
		t.Fatal("a silo opened another silo's ledger")
	}
	// Without the marker, a run's client state is history enough.
	os.Remove(c.Ledger)
	os.Remove(filepath.Join(c.DataDir, "ledger.genesis"))
	os.MkdirAll(filepath.Join(c.DataDir, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"), 0o700)
	wantHistory(open())
	// Restored, the silo's own ledger opens.
	os.WriteFile(c.Ledger, own, 0o600)
	if err := open(); err != nil {
		t.Fatal(err)
	}
}

// A silo does not start on a ledger that fails verification: one flipped
// byte in an entry's length field fences it (SC5014), and nothing is cut.
func TestSiloRefusesDamagedLedger(t *testing.T) {
	t.Parallel()
	w := newRoundWorld(t)
	a := w.openSilo("hospital-a", nil)
	c := a.Config
	a.Close()
	good, _ := os.ReadFile(c.Ledger)
	bad := append([]byte(nil), good...)
	bad[8+1] ^= 0x10 // the genesis frame's length field
	os.WriteFile(c.Ledger, bad, 0o600)
	_, err := silo.Open(c, w.ids["hospital-a"], w.fed, silo.Options{})
	if ds, ok := diag.As(err); !ok || ds[0].Code != diag.LedgerCorrupt {
		t.Fatalf("got %v, want SC5014", err)
	}
	if now, _ := os.ReadFile(c.Ledger); string(now) != string(bad) {
		t.Fatal("the refused start changed the ledger")
	}
}

// The identity key signs the ledger: a key its group can read is refused
// before the ledger is touched (SC5040), plaintext or age-encrypted
// (identity.Load alone only warns about an encrypted one).
func TestSiloRefusesLooseLedgerKey(t *testing.T) {
	t.Parallel()
	w := newRoundWorld(t)
	c := w.siloConfig("hospital-a", nil)
	c.Identity = filepath.Join(w.dir, "hospital-a", "identity.key")
	if err := identity.Save(c.Identity, w.ids["hospital-a"], identity.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	os.Chmod(c.Identity, 0o640)
	_, err := silo.Open(c, w.ids["hospital-a"], w.fed, silo.Options{})
	if ds, ok := diag.As(err); !ok || ds[0].Code != diag.LedgerInsecure {
		t.Fatalf("got %v, want SC5040", err)
	}
	if _, err := os.Stat(c.Ledger); err == nil {
		t.Fatal("a ledger was created with a loose key")
	}
	os.Chmod(c.Identity, 0o600)
	a, err := silo.Open(c, w.ids["hospital-a"], w.fed, silo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()

	ageID, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	c.Identity = filepath.Join(w.dir, "hospital-a", "identity-age.key")
	if err := identity.Save(c.Identity, w.ids["hospital-a"], identity.SaveOptions{Recipient: ageID.Recipient().String()}); err != nil {
		t.Fatal(err)
	}
	os.Chmod(c.Identity, 0o640)
	_, err = silo.Open(c, w.ids["hospital-a"], w.fed, silo.Options{})
	if ds, ok := diag.As(err); !ok || ds[0].Code != diag.LedgerInsecure || !strings.Contains(ds[0].Message, "age-encrypted") {
		t.Fatalf("age-encrypted key with mode 0640: got %v, want SC5040", err)
	}
	os.Chmod(c.Identity, 0o600)
	if a, err = silo.Open(c, w.ids["hospital-a"], w.fed, silo.Options{}); err != nil {
		t.Fatal(err)
	}
	a.Close()
}
