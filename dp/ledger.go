package dp

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
)

// Ledger is a silo's privacy ledger, open for charging. It is an
// append-only file of signed, hash-chained entries: a genesis entry, budget
// declarations (ε_max, δ) per dataset, and charges. Charge composes a new
// charge with all earlier ones in RDP space and refuses, writing nothing, if
// the dataset's cumulative ε would exceed its budget; an accepted charge is
// fsync'd before Charge returns. There is no way to edit or delete an entry.
//
// A Ledger is safe for concurrent use by multiple goroutines, and any number
// of processes may hold the same file open: each charge runs under an
// exclusive file lock and first reads what others appended.
type Ledger struct {
	mu     sync.Mutex // serialises goroutines; taken before the file lock
	path   string
	f      *os.File
	key    ed25519.PrivateKey
	c      *chain
	size   int64 // bytes of f covered by c
	now    func() time.Time
	broken error // set once the file's state is unknown; every later call fails
	cut    []tornTail
}

// Options configure Create and Open.
type Options struct {
	// Orders is the Rényi order grid of a new ledger (Create only); nil
	// means DefaultOrders. It is fixed in the genesis entry for good.
	Orders []float64
	// Conversion from RDP to (ε, δ) of a new ledger (Create only).
	Conversion Conversion
	// Silo optionally names the silo in the genesis entry (Create only).
	Silo string
	// Now is the clock for entry times; nil means time.Now.
	Now func() time.Time
}

func (o *Options) now() func() time.Time {
	if o == nil || o.Now == nil {
		return time.Now
	}
	return o.Now
}

// ChargeRequest asks to spend privacy of one dataset for one consumer (a job
// or round ID). The mechanisms compose: a training run with two phases of
// different q or σ is one charge of two mechanisms.
type ChargeRequest struct {
	Dataset    string
	Consumer   string
	Mechanisms []Mechanism
}

// Create makes a new ledger at path signed by key, with a genesis entry
// fixing the order grid and conversion, and opens it. It refuses (SC5017) if
// path exists. Creation is atomic: the file appears complete or not at all.
func Create(path string, key ed25519.PrivateKey, opts *Options) (*Ledger, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("dp: ledger key is not an Ed25519 private key")
	}
	var orders []float64
	conv := Improved
	silo := ""
	if opts != nil {
		orders, conv, silo = opts.Orders, opts.Conversion, opts.Silo
	}
	if orders == nil {
		orders = DefaultOrders()
	}
	if err := CheckOrders(orders); err != nil {
		return nil, err
	}
	if conv != Improved && conv != Classic {
		return nil, fmt.Errorf("dp: unknown conversion %v", conv)
	}
	if silo != "" {
		if err := checkName("silo", silo); err != nil {
			return nil, err
		}
	}
	if _, err := os.Lstat(path); err == nil {
		return nil, existsDiag(path)
	}
	nonce := make([]byte, 16)
	readNonce(nonce)
	format := createFormat
	g := &Entry{
		Seq: 0, Kind: KindGenesis, Time: opts.now()().UnixNano(),
		Genesis: &Genesis{
			Format: format, PublicKey: key.Public().(ed25519.PublicKey),
			Orders: slices.Clone(orders), Conversion: conv.String(), Silo: silo, Nonce: nonce,
		},
	}
	p, err := sealEntry(g, key, format)
	if err != nil {
		return nil, err
	}
	data := appendFrame([]byte(magicOf(format)), p, format)
	if err := createFile(path, data); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, existsDiag(path)
		}
		return nil, diag.New(diag.LedgerUnreadable, path, "ledger cannot be created: %v", err)
	}
	return Open(path, key, opts)
}

// readNonce fills a genesis nonce; tests replace it for reproducible hashes.
var readNonce = func(b []byte) { rand.Read(b) }

// createFormat is the format Create writes; tests set 1 to make ledgers of
// the old format.
var createFormat = FormatVersion

func existsDiag(path string) error {
	return diag.New(diag.LedgerExists, path, "a file already exists at the ledger path").
		WithHelp("a ledger is never overwritten; choose another path, or charge the existing one")
}

// Open opens the ledger at path for charging with the silo's key. It reads
// and verifies every entry (hash chain, signatures, budgets), cuts off a
// torn last entry left by a crash (saving its bytes to path.torn-OFFSET),
// and refuses with a diagnostic a file that is not a ledger (SC5013), fails
// verification (SC5014), or is signed by another key (SC5015).
func Open(path string, key ed25519.PrivateKey, opts *Options) (*Ledger, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("dp: ledger key is not an Ed25519 private key")
	}
	f, _, err := safefile.Open(path, os.O_RDWR, safefile.MaxLedger)
	if err != nil {
		return nil, openDiag(path, err)
	}
	l := &Ledger{path: path, f: f, key: key, now: opts.now()}
	unlock, err := lockFile(f, true)
	if err != nil {
		f.Close()
		return nil, err
	}
	defer unlock()
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	head, err := readRange(f, 0, min(fi.Size(), int64(len(fileMagic))))
	format := 0
	if err == nil {
		format, err = checkMagic(path, head)
	}
	if err == nil {
		err = checkLedgerMode(path, fi)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	l.c = newChain(format)
	l.size = int64(len(fileMagic))
	if err := l.catchUp(); err != nil {
		f.Close()
		return nil, err
	}
	if len(l.c.entries) == 0 {
		f.Close()
		return nil, diag.New(diag.LedgerNotLedger, path, "ledger has no genesis entry").
			WithHelp("the file was never completely created; create a new ledger with `scellis ledger init`")
	}
	if !l.c.pub.Equal(key.Public()) {
		f.Close()
		return nil, diag.New(diag.LedgerKeyMismatch, path, "the key %s does not match the ledger's key %s",
			PublicKeyString(key.Public().(ed25519.PublicKey)), PublicKeyString(l.c.pub)).
			WithHelp("charge with the silo key the ledger was created with (by default PATH.key)")
	}
	return l, nil
}

// checkLedgerMode refuses a ledger file that others may read or write: a
// writer must be the only one able to append, and the file says which
// datasets a silo holds and how much it spends.
func checkLedgerMode(path string, fi os.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return diag.New(diag.LedgerNotLedger, path, "is not a regular file")
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return diag.New(diag.LedgerInsecure, path, "the ledger file is accessible to others (mode %04o); refusing to charge it", perm).
			WithHelp("run: chmod 600 %s (ledgers are created 0600; check who could have changed it)", path)
	}
	return nil
}

func openDiag(path string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return diag.New(diag.LedgerUnreadable, path, "no ledger at this path").
			WithHelp("create one with `scellis ledger init --ledger %s`", path)
	}
	return diag.New(diag.LedgerUnreadable, path, "ledger cannot be opened: %v", err)
}

// catchUp applies whatever was appended to the file since l.size (by this or
// another process) and cuts a torn tail. The caller holds l.mu (or owns l
// exclusively) and the exclusive file lock.
func (l *Ledger) catchUp() error {
	fi, err := l.f.Stat()
	if err != nil {
		return err
	}
	if pfi, err := os.Stat(l.path); err != nil || !os.SameFile(fi, pfi) {
		return l.fail(diag.New(diag.LedgerCorrupt, l.path, "the ledger file was removed or replaced while open").
			WithHelp("find out who replaced it; verify both files with `scellis ledger verify`"))
	}
	size := fi.Size()
	switch {
	case size < l.size:
		return l.fail(diag.New(diag.LedgerCorrupt, l.path, "the ledger shrank from %d to %d bytes while open: entries were removed", l.size, size).
			WithHelp("restore the ledger from a backup and verify it with `scellis ledger verify`"))
	case size == l.size:
		return nil
	}
	data, err := readRange(l.f, l.size, size)
	if err != nil {
		return err
	}
	end, torn, err := scan(l.c, data, l.size)
	l.size = end
	if err != nil {
		return l.fail(diag.New(diag.LedgerCorrupt, l.path, "ledger fails verification at %v", err).
			WithHelp("the ledger is fenced: no charge is written until an operator restores it (docs/dp.md, \"A damaged ledger\"); run `scellis ledger verify --ledger %s`", l.path))
	}
	if torn != nil {
		if err := cutTail(l.f, l.path, torn); err != nil {
			return l.fail(err)
		}
		l.cut = append(l.cut, *torn)
	}
	return nil
}

// fail records that the ledger can no longer be written safely.
func (l *Ledger) fail(err error) error {
	if l.broken == nil {
		l.broken = err
	}
	return err
}

// begin takes l.mu and the exclusive file lock and catches up; end releases
// both.
func (l *Ledger) begin() (end func(), err error) {
	l.mu.Lock()
	if l.broken != nil {
		l.mu.Unlock()
		return nil, l.broken
	}
	if l.f == nil {
		l.mu.Unlock()
		return nil, errors.New("dp: ledger is closed")
	}
	unlock, err := lockFile(l.f, true)
	if err != nil {
		l.mu.Unlock()
		return nil, err
	}
	end = func() { unlock(); l.mu.Unlock() }
	if err := l.catchUp(); err != nil {
		end()
		return nil, err
	}
	return end, nil
}

// appendEntry seals e, appends its frame and fsyncs, then applies it. The
// caller holds the lock and has validated e's content.
func (l *Ledger) appendEntry(e *Entry) (*Entry, error) {
	e.Seq = uint64(len(l.c.entries))
	e.Prev = l.c.head
	e.Time = l.now().UnixNano()
	p, err := sealEntry(e, l.key, l.c.format)
	if err != nil {
		return nil, err
	}
	frame := appendFrame(nil, p, l.c.format)
	if _, err := l.f.WriteAt(frame, l.size); err != nil {
		// Cut whatever part reached the file; if that fails too, the file's
		// state is unknown.
		if terr := l.f.Truncate(l.size); terr != nil {
			l.fail(fmt.Errorf("dp: ledger write failed (%v) and could not be undone: %w", err, terr))
		}
		return nil, fmt.Errorf("dp: appending to ledger: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		// After a failed fsync nobody knows what is on disk: stop writing.
		l.fail(fmt.Errorf("dp: ledger fsync failed, reopen the ledger: %w", err))
		return nil, l.broken
	}
	l.size += int64(len(frame))
	if err := l.c.applyEntry(e, false); err != nil {
		panic(fmt.Sprintf("dp: ledger rejected its own entry %d: %v", e.Seq, err))
	}
	out := *e
	return &out, nil
}

// ValidateBudget checks a budget declaration's values without a ledger: a
// printable dataset name, ε finite and ≥ 0, δ in (0, 1).
func ValidateBudget(dataset string, epsilon, delta float64) error {
	if err := checkName("dataset", dataset); err != nil {
		return err
	}
	if err := checkEpsilon(epsilon); err != nil {
		return err
	}
	return checkDelta(delta)
}

// DeclareBudget records dataset's budget: its cumulative ε at delta may never
// exceed epsilon. A dataset's budget is declared once and never changed.
func (l *Ledger) DeclareBudget(dataset string, epsilon, delta float64) (*Entry, error) {
	if err := ValidateBudget(dataset, epsilon, delta); err != nil {
		return nil, err
	}
	end, err := l.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	if _, dup := l.c.datasets[dataset]; dup {
		return nil, diag.New(diag.LedgerBudgetExists, "dataset "+dataset, "dataset %q already has a budget", dataset).
			WithHelp("a budget is declared once and never raised; use a new dataset name for new data")
	}
	return l.appendEntry(&Entry{Kind: KindBudget, Budget: &Budget{Dataset: dataset, Epsilon: epsilon, Delta: delta}})
}

// Charge spends privacy: it computes the RDP curve of req's mechanisms on the
// ledger's orders, composes it with every earlier charge of the dataset, and
// converts the total to ε at the dataset's δ. If that ε exceeds the budget,
// Charge returns a diagnostic (SC5010) stating spent, requested and remaining
// ε, and writes nothing. Otherwise it appends a signed entry, fsyncs it, and
// returns it; only then may the caller release what the charge pays for.
//
// Refusals are *diag.Diagnostic values; test them with diag.As and Code.
func (l *Ledger) Charge(req ChargeRequest) (*Entry, error) {
	if err := checkName("dataset", req.Dataset); err != nil {
		return nil, err
	}
	if err := checkName("consumer", req.Consumer); err != nil {
		return nil, err
	}
	if len(req.Mechanisms) == 0 || len(req.Mechanisms) > maxMechanisms {
		return nil, diag.New(diag.DPUnknownMechanism, "charge", "a charge needs 1 to %d mechanisms, got %d", maxMechanisms, len(req.Mechanisms))
	}
	for _, m := range req.Mechanisms {
		if err := m.Validate(); err != nil {
			return nil, err
		}
	}
	end, err := l.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	ds, ok := l.c.datasets[req.Dataset]
	if !ok {
		return nil, diag.New(diag.LedgerNoBudget, "dataset "+req.Dataset, "dataset %q has no budget in this ledger", req.Dataset).
			WithHelp("declare one first: `scellis ledger budget --dataset %s --epsilon E --delta D`", req.Dataset)
	}
	curve, _, err := l.c.curveOf(req.Mechanisms)
	if err != nil {
		return nil, err
	}
	delta := ds.budget.Delta
	alone, _, err := Epsilon(l.c.orders, curve, delta, l.c.conv)
	if err != nil {
		return nil, err
	}
	total := addCurves(ds.rdp, curve)
	cum, order, err := Epsilon(l.c.orders, total, delta, l.c.conv)
	if err != nil {
		return nil, err
	}
	if cum > ds.budget.Epsilon || math.IsNaN(cum) {
		return nil, l.overdraft(req, ds, alone, cum)
	}
	if cum < ds.eps {
		// RDP curves are non-negative and the conversion is monotone in them.
		panic(fmt.Sprintf("dp: cumulative epsilon decreases (%v → %v)", ds.eps, cum))
	}
	return l.appendEntry(&Entry{Kind: KindCharge, Charge: &Charge{
		Dataset: req.Dataset, Consumer: req.Consumer,
		Mechanisms: slices.Clone(req.Mechanisms), RDP: curve,
		Epsilon: alone, Cumulative: cum, Order: order,
	}})
}

func (l *Ledger) overdraft(req ChargeRequest, ds *datasetState, alone, cum float64) error {
	b := ds.budget
	remaining := math.Max(0, b.Epsilon-ds.eps)
	d := diag.New(diag.LedgerOverdraft, "dataset "+req.Dataset,
		"charge for %s refused: spent ε=%.6g, requested ε=%.6g, remaining ε=%.6g of budget ε=%g at δ=%g (composed, the total would be ε=%.6g)",
		req.Consumer, ds.eps, alone, remaining, b.Epsilon, b.Delta, cum)
	help := "nothing was written; do not release the update. Use more noise (`scellis privacy calibrate`), fewer steps or a lower q"
	if len(req.Mechanisms) == 1 {
		m := req.Mechanisms[0]
		if n, err := MaxSteps(l.c.orders, ds.rdp, m.Q, m.Sigma, b.Epsilon, b.Delta, l.c.conv); err == nil {
			help = fmt.Sprintf("nothing was written; do not release the update. At most %d steps at σ=%g, q=%g fit in the remaining budget", n, m.Sigma, m.Q)
		}
	}
	return d.WithHelp("%s", help)
}

// Status returns a dataset's budget and spending, after reading what other
// processes appended.
func (l *Ledger) Status(dataset string) (DatasetStatus, error) {
	end, err := l.begin()
	if err != nil {
		return DatasetStatus{}, err
	}
	defer end()
	st, ok := l.c.status(dataset)
	if !ok {
		return st, diag.New(diag.LedgerNoBudget, "dataset "+dataset, "dataset %q has no budget in this ledger", dataset)
	}
	return st, nil
}

// MaxSteps returns how many more steps of the Poisson-subsampled Gaussian
// (rate q, noise multiplier sigma) the dataset's remaining budget allows.
func (l *Ledger) MaxSteps(dataset string, q, sigma float64) (int64, error) {
	end, err := l.begin()
	if err != nil {
		return 0, err
	}
	defer end()
	ds, ok := l.c.datasets[dataset]
	if !ok {
		return 0, diag.New(diag.LedgerNoBudget, "dataset "+dataset, "dataset %q has no budget in this ledger", dataset)
	}
	return MaxSteps(l.c.orders, ds.rdp, q, sigma, ds.budget.Epsilon, ds.budget.Delta, l.c.conv)
}

// Snapshot returns an immutable copy of the ledger's current state, after
// reading what other processes appended.
func (l *Ledger) Snapshot() (*Snapshot, error) {
	end, err := l.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	return &Snapshot{c: l.c.clone()}, nil
}

// Path returns the ledger's file path.
func (l *Ledger) Path() string { return l.path }

// PublicKey returns the key the ledger's entries are signed with.
func (l *Ledger) PublicKey() ed25519.PublicKey { return l.key.Public().(ed25519.PublicKey) }

// TornTails reports the torn writes this Ledger cut off (offset and size),
// for logging.
func (l *Ledger) TornTails() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, t := range l.cut {
		out = append(out, fmt.Sprintf("%d bytes at offset %d (%s), saved to %s.torn-%d", t.Bytes, t.Offset, t.Why, l.path, t.Offset))
	}
	return out
}

// Close releases the file. Entries are already durable.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Snapshot is a read-only, verified view of a ledger at one moment.
type Snapshot struct {
	c *chain
	// TornBytes is the size of a torn last write after the last complete
	// entry (left by a crash; the next writer cuts it off), 0 if none.
	TornBytes int64
}

// Entries returns the ledger's entries in order.
func (s *Snapshot) Entries() []Entry { return slices.Clone(s.c.entries) }

// Len returns the number of entries, genesis included.
func (s *Snapshot) Len() int { return len(s.c.entries) }

// Head returns the hash of the last entry: anchoring it elsewhere (a receipt,
// a printout) makes later truncation of the ledger detectable.
func (s *Snapshot) Head() content.Ref { return s.c.head }

// PublicKey returns the key the entries are signed with (from the genesis).
func (s *Snapshot) PublicKey() ed25519.PublicKey { return s.c.pub }

// Orders returns the ledger's Rényi order grid.
func (s *Snapshot) Orders() []float64 { return slices.Clone(s.c.orders) }

// Conversion returns the ledger's RDP to (ε, δ) conversion.
func (s *Snapshot) Conversion() Conversion { return s.c.conv }

// Silo returns the silo name from the genesis entry, if any.
func (s *Snapshot) Silo() string {
	if len(s.c.entries) == 0 {
		return ""
	}
	return s.c.entries[0].Genesis.Silo
}

// Datasets returns every dataset's status, sorted by name.
func (s *Snapshot) Datasets() []DatasetStatus { return s.c.statuses() }

// Dataset returns one dataset's status.
func (s *Snapshot) Dataset(name string) (DatasetStatus, bool) { return s.c.status(name) }

// Find returns the entry whose hash is ref.
func (s *Snapshot) Find(ref content.Ref) (Entry, bool) {
	for _, e := range s.c.entries {
		if e.Hash == ref {
			return e, true
		}
	}
	return Entry{}, false
}

// Verify reads the ledger at path under a shared lock and checks every entry:
// framing, canonical encoding, hash, previous-hash link, sequence, signature,
// and that each charge's RDP curve and cumulative ε follow from its
// mechanisms and never exceed the budget. If pub is not nil the genesis key
// must equal it — without it, Verify proves only that the ledger is
// internally consistent, not who wrote it.
//
// On success it returns a Snapshot. A torn last write — shorter than its
// frame and holding no complete entry, as a crash or kill -9 leaves it — is
// reported in TornBytes, not as an error; anything else that does not parse
// (a damaged length field, a full-length last frame failing its checksum,
// a "torn" frame holding a complete entry) is an error at its offset. A broken chain returns the Snapshot of the valid
// prefix and a *VerifyError naming the first bad entry. A file that is not a
// ledger or cannot be read returns a diagnostic.
func Verify(path string, pub ed25519.PublicKey) (*Snapshot, error) {
	f, _, err := safefile.Open(path, os.O_RDONLY, safefile.MaxLedger)
	if err != nil {
		return nil, openDiag(path, err)
	}
	defer f.Close()
	unlock, err := lockFile(f, false)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		unlock()
		return nil, err
	}
	if fi.IsDir() {
		unlock()
		return nil, diag.New(diag.LedgerNotLedger, path, "is a directory, not a ledger file")
	}
	data, err := readRange(f, 0, fi.Size())
	unlock()
	if err != nil {
		return nil, err
	}
	return verifyBytes(path, data, pub)
}

func verifyBytes(path string, data []byte, pub ed25519.PublicKey) (*Snapshot, error) {
	format, err := checkMagic(path, data)
	if err != nil {
		return nil, err
	}
	c := newChain(format)
	_, torn, err := scan(c, data[len(fileMagic):], int64(len(fileMagic)))
	s := &Snapshot{c: c}
	if err != nil {
		return s, err
	}
	if torn != nil {
		s.TornBytes = torn.Bytes
	}
	if len(c.entries) == 0 {
		return nil, diag.New(diag.LedgerNotLedger, path, "ledger has no genesis entry")
	}
	if pub != nil && !c.pub.Equal(pub) {
		return s, &VerifyError{Seq: 0, Offset: int64(len(fileMagic)),
			Reason: fmt.Sprintf("ledger is signed by %s, not by the expected key %s", PublicKeyString(c.pub), PublicKeyString(pub))}
	}
	return s, nil
}
