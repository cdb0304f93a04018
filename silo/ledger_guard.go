package silo

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/identity"
)

// ledgerMarker is the file in a silo's data_dir naming the genesis hash of
// the ledger the silo charges. It is how a silo knows it has history: a
// missing ledger, or another ledger at the configured path, is then refused
// rather than silently replaced by one with full budgets.
const ledgerMarker = "ledger.genesis"

// openLedger opens the silo's ledger, or creates it when the silo has no
// history. A silo has history when its data_dir holds the ledger marker or
// the client state of a run it took part in; a missing ledger is then
// refused (SC5041), and so is a ledger whose genesis is not the marker's.
func openLedger(c *config.Silo, id *identity.Identity, now func() time.Time) (*dp.Ledger, error) {
	opts := &dp.Options{Silo: c.Name, Now: now}
	if err := checkLedgerKeyMode(c.Identity); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(c.Ledger), 0o700); err != nil {
		return nil, diag.New(diag.LedgerUnreadable, c.Ledger, "cannot make the ledger's folder: %v", err)
	}
	marker := filepath.Join(c.DataDir, ledgerMarker)
	want, err := readMarker(marker)
	if err != nil {
		return nil, err
	}
	var l *dp.Ledger
	if _, err := os.Lstat(c.Ledger); errors.Is(err, fs.ErrNotExist) {
		if evidence := history(c.DataDir, want); evidence != "" {
			return nil, diag.New(diag.LedgerHistory, c.Ledger, "there is no ledger at this path, but this silo has taken part in runs (%s)", evidence).
				WithHelp("restore the ledger to %s (or set ledger: back to where it is) and start again; a silo never starts over with fresh budgets. See docs/dp.md, \"A damaged ledger\"", c.Ledger)
		}
		if l, err = dp.Create(c.Ledger, id.PrivateKey(), opts); err != nil {
			return nil, err
		}
	} else if l, err = dp.Open(c.Ledger, id.PrivateKey(), opts); err != nil {
		return nil, err
	}
	snap, err := l.Snapshot()
	if err != nil {
		l.Close()
		return nil, err
	}
	genesis := snap.Entries()[0].Hash
	switch {
	case want == "":
		if err := writeMarker(marker, string(genesis)); err != nil {
			l.Close()
			return nil, diag.New(diag.WorkerConfig, c.Name, "cannot write %s: %v", marker, err).WithHelp("check data_dir in the silo config")
		}
	case want != string(genesis):
		l.Close()
		return nil, diag.New(diag.LedgerHistory, c.Ledger, "the ledger at this path (genesis %s) is not the ledger this silo has charged (genesis %s, recorded in %s)", genesis.Short(), strings.TrimPrefix(want, "sha256:")[:12], marker).
			WithHelp("point ledger: at the silo's own ledger, or restore it; a silo never switches to another ledger with fresh budgets")
	}
	if err := checkAnchor(c.DataDir, c.Ledger, snap); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// ledgerAnchor is the file in a silo's data_dir naming how many entries
// its ledger held and the hash of the last, when the silo last started or
// charged. It lives apart from the ledger, so a rolled-back copy of the
// ledger (same genesis, fewer entries: spent ε refunded) is refused at
// start-up instead of only by an external `ledger audit`.
const ledgerAnchor = "ledger.anchor"

// checkAnchor refuses a ledger shorter than the anchor says, or whose
// entry at the anchor is another (a rewritten history), then moves the
// anchor to the ledger's head. A ledger longer than the anchor is fine:
// entries appended offline (budgets) or a charge whose anchor update a
// crash cut off extend the same chain.
func checkAnchor(dataDir, ledgerPath string, snap *dp.Snapshot) error {
	path := filepath.Join(dataDir, ledgerAnchor)
	n, hash, err := readAnchor(path)
	if err != nil {
		return err
	}
	ents := snap.Entries()
	switch {
	case n > len(ents):
		return diag.New(diag.LedgerHistory, ledgerPath, "the ledger holds %d entries but this silo had charged it up to entry %d (%s, recorded in %s): it was rolled back, which refunds spent ε", len(ents), n, hash.Short(), path).
			WithHelp("restore the silo's latest ledger (the one with entry %s) and start again; never restore an older copy. See docs/dp.md, \"A damaged ledger\"", hash.Short())
	case n > 0 && ents[n-1].Hash != hash:
		return diag.New(diag.LedgerHistory, ledgerPath, "the ledger's entry %d is %s, not %s as this silo recorded in %s: its history was rewritten", n, ents[n-1].Hash.Short(), hash.Short(), path).
			WithHelp("restore the silo's own ledger and start again; a silo never accepts a rewritten history")
	}
	return writeAnchor(path, snap)
}

// readAnchor returns the anchor's entry count and last hash (0 and ""
// when there is none yet).
func readAnchor(path string) (int, content.Ref, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, "", nil
	}
	var n int
	var h string
	if err == nil {
		_, err = fmt.Sscanf(string(b), "%d %s", &n, &h)
	}
	if err != nil || n < 1 || !content.IsRef(h) {
		return 0, "", diag.New(diag.SiloStateUnavailable, path, "the ledger anchor is unreadable or does not hold an entry count and hash").
			WithHelp("restore %s from a backup, or, only if the ledger is known to be the silo's latest, delete it: the silo writes it again from the ledger", path)
	}
	return n, content.Ref(h), nil
}

// writeAnchor records snap's entry count and head, durably.
func writeAnchor(path string, snap *dp.Snapshot) error {
	ents := snap.Entries()
	if len(ents) == 0 {
		return nil
	}
	if err := writeFileSync(path, fmt.Sprintf("%d %s\n", len(ents), ents[len(ents)-1].Hash)); err != nil {
		return diag.New(diag.SiloStateUnavailable, path, "cannot write the ledger anchor: %v", err).WithHelp("check data_dir in the silo config")
	}
	return nil
}

// anchorLedger moves the anchor to the ledger's head after a charge; a
// failure is logged (the charge stands, and the next start re-anchors).
func (a *Appliance) anchorLedger() {
	snap, err := a.Ledger.Snapshot()
	if err == nil {
		err = writeAnchor(filepath.Join(a.Config.DataDir, ledgerAnchor), snap)
	}
	if err != nil {
		a.logf("ledger anchor: %v", err)
	}
}

// checkLedgerKeyMode refuses an identity key file that its group or others
// may access: the silo signs its ledger with it, and whoever reads it can
// forge ledger entries (the same rule as dp.ReadPrivateKeyFile for a
// ledger key of its own). That holds for an age-encrypted key too:
// identity.Load only warns about one (a node's TLS key behind a strong
// passphrase may be shared read-only with a group), but a readable
// encrypted ledger key is open to an offline guess of its passphrase, and
// a ledger key is refused on every path that reads one.
func checkLedgerKeyMode(path string) error {
	if path == "" {
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 == 0 {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	head := make([]byte, 40)
	n, _ := f.Read(head)
	f.Close()
	h := strings.TrimSpace(string(head[:n]))
	kind := "the identity key"
	switch {
	case strings.HasPrefix(h, "-----BEGIN PRIVATE KEY"):
	case strings.HasPrefix(h, "-----BEGIN AGE ENCRYPTED FILE"), strings.HasPrefix(string(head[:n]), "age-encryption.org/"):
		kind = "the identity key (age-encrypted)"
	default:
		return nil // not a key file: identity.Load says what is wrong with it
	}
	return diag.New(diag.LedgerInsecure, path, "%s signs the privacy ledger and is accessible to others (mode %04o); refusing to charge with it", kind, fi.Mode().Perm()).
		WithHelp("run: chmod 600 %s, and consider the key exposed if others may have read it", path)
}

func readMarker(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", diag.New(diag.SiloStateUnavailable, path, "cannot read the ledger marker: %v", err)
	}
	s := strings.TrimSpace(string(b))
	if !strings.HasPrefix(s, "sha256:") || len(s) != len("sha256:")+64 {
		return "", diag.New(diag.SiloStateUnavailable, path, "the ledger marker does not hold a genesis hash").
			WithHelp("restore %s from a backup; it names the genesis hash of the silo's ledger", path)
	}
	return s, nil
}

func writeMarker(path, genesis string) error { return writeFileSync(path, genesis+"\n") }

// writeFileSync replaces path with body durably (a synced temporary file
// renamed over it).
func writeFileSync(path, body string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		return err
	}
	f, err := os.Open(tmp)
	if err == nil {
		err = f.Sync()
		f.Close()
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// history says what in dataDir shows the silo has taken part in runs: the
// ledger marker, or a run's client-state folder (named by the run's hash).
func history(dataDir, marker string) string {
	if marker != "" {
		return fmt.Sprintf("%s names ledger genesis %s", filepath.Join(dataDir, ledgerMarker), strings.TrimPrefix(marker, "sha256:")[:12])
	}
	ents, err := os.ReadDir(dataDir)
	if err != nil {
		return ""
	}
	for _, e := range ents {
		if _, err := hex.DecodeString(e.Name()); err == nil && len(e.Name()) == 64 && e.IsDir() {
			return fmt.Sprintf("%s holds the state of run %s", dataDir, e.Name()[:12])
		}
	}
	return ""
}
