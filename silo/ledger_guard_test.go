package silo_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
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
	open := opener(w, c, name)
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

// A rolled-back copy of the silo's own ledger (same genesis, fewer
// entries: spent ε refunded) is refused at start-up (SC5041), and so is a
// copy whose history was rewritten past the anchor; the silo's latest
// ledger opens. Before, both opened and only an external `ledger audit`
// could tell.
func TestSiloRefusesRolledBackLedger(t *testing.T) {
	t.Parallel()
	w := newRoundWorld(t)
	const name = "hospital-a"
	a := w.openSilo(name, nil)
	c := a.Config
	a.Close()
	old, _ := os.ReadFile(c.Ledger)
	appendEntry := func(dataset string) {
		t.Helper()
		l, err := dp.Open(c.Ledger, w.ids[name].PrivateKey(), &dp.Options{Silo: name})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if _, err := l.DeclareBudget(dataset, 1, 1e-6); err != nil {
			t.Fatal(err)
		}
	}
	open := opener(w, c, name)
	appendEntry("later") // as a charge would, then the silo starts on it
	if err := open(); err != nil {
		t.Fatal(err)
	}
	latest, _ := os.ReadFile(c.Ledger)
	wantRefused := func(what, word string) {
		t.Helper()
		err := open()
		if ds, ok := diag.As(err); !ok || ds[0].Code != diag.LedgerHistory || !strings.Contains(ds[0].Message, word) {
			t.Fatalf("%s: got %v, want SC5041 saying %q", what, err, word)
		}
	}
	os.WriteFile(c.Ledger, old, 0o600)
	wantRefused("a rolled-back copy", "rolled back")
	appendEntry("another") // same length as the latest, another history
	wantRefused("a rewritten copy", "rewritten")
	os.WriteFile(c.Ledger, latest, 0o600)
	if err := open(); err != nil {
		t.Fatalf("the silo's latest ledger: %v", err)
	}
}

// opener opens and closes silo name with config c, returning why not.
func opener(w *roundWorld, c *config.Silo, name string) func() error {
	return func() error {
		a, err := silo.Open(c, w.ids[name], w.fed, silo.Options{})
		if err == nil {
			a.Close()
		}
		return err
	}
}
