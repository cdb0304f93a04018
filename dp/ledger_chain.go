package dp

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// chain is the pure state of a ledger: the entries so far and, per dataset,
// the composed RDP curve. apply is the only way to change it, and it accepts
// an entry only if it extends the chain validly. Writers and verifiers run the
// same apply, so what a writer appends is exactly what a verifier accepts.
type chain struct {
	format   int // frame and signature format, from the file's magic
	entries  []Entry
	head     content.Ref
	pub      ed25519.PublicKey
	orders   []float64
	conv     Conversion
	datasets map[string]*datasetState
}

type datasetState struct {
	budget  Budget
	rdp     []float64 // composed RDP curve of all charges
	eps     float64   // cumulative ε at budget.Delta (as stored in the last charge)
	order   float64
	charges int
}

// Limits on what one entry may hold.
const (
	maxNameLen    = 256
	maxMechanisms = 64
	maxOrders     = 1024
)

func newChain(format int) *chain {
	return &chain{format: format, datasets: map[string]*datasetState{}}
}

// verifyTolerance is the slack when a verifier recomputes floating-point
// values a writer stored (RDP curves, cumulative ε): identical on one
// platform, within a few ulps across platforms.
func closeEnough(got, want, abs float64) bool {
	return math.Abs(got-want) <= 1e-9*math.Abs(want)+abs
}

// apply validates e as the next entry and, if valid, appends it. The error
// says why an invalid entry does not extend the chain; the chain is then
// unchanged.
func (c *chain) apply(e *Entry) error { return c.applyEntry(e, true) }

// applyEntry is apply; recompute false skips recomputing a charge's RDP
// curve from its mechanisms, for the entry a writer has just built from that
// very computation. Every other check still runs.
func (c *chain) applyEntry(e *Entry, recompute bool) error {
	if e.Seq != uint64(len(c.entries)) {
		return fmt.Errorf("sequence number %d, expected %d: an entry is missing or out of order", e.Seq, len(c.entries))
	}
	if e.Prev != c.head {
		if e.Seq == 0 {
			return fmt.Errorf("genesis names a previous entry %s", e.Prev)
		}
		return fmt.Errorf("previous-hash %s does not match entry %d (%s): an entry was edited, removed or reordered", e.Prev.Short(), e.Seq-1, c.head.Short())
	}
	n := 0
	for _, set := range []bool{e.Genesis != nil, e.Budget != nil, e.Charge != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("entry of kind %q holds %d payloads, want 1", e.Kind, n)
	}
	pub := c.pub
	if e.Seq == 0 {
		if e.Kind != KindGenesis || e.Genesis == nil {
			return fmt.Errorf("entry 0 is a %q entry, not the genesis", e.Kind)
		}
		pub = e.Genesis.PublicKey
		if len(pub) != ed25519.PublicKeySize {
			return fmt.Errorf("genesis public key has %d bytes", len(pub))
		}
	}
	if !verifySig(pub, e.Hash, e.Sig, c.format) {
		return fmt.Errorf("signature does not verify under the ledger key %s", PublicKeyString(pub))
	}
	switch e.Kind {
	case KindGenesis:
		if e.Seq != 0 || e.Genesis == nil {
			return fmt.Errorf("a second genesis entry")
		}
		return c.applyGenesis(e)
	case KindBudget:
		if e.Budget == nil {
			return fmt.Errorf("budget entry without a budget")
		}
		return c.applyBudget(e)
	case KindCharge:
		if e.Charge == nil {
			return fmt.Errorf("charge entry without a charge")
		}
		return c.applyCharge(e, recompute)
	}
	return fmt.Errorf("unknown entry kind %q", e.Kind)
}

func (c *chain) push(e *Entry) {
	c.entries = append(c.entries, *e)
	c.head = e.Hash
}

func (c *chain) applyGenesis(e *Entry) error {
	g := e.Genesis
	if g.Format != c.format {
		return fmt.Errorf("genesis says format %d, the file's magic format %d", g.Format, c.format)
	}
	if err := CheckOrders(g.Orders); err != nil {
		return fmt.Errorf("genesis orders: %v", err)
	}
	conv, err := ParseConversion(g.Conversion)
	if err != nil || g.Conversion != conv.String() {
		return fmt.Errorf("genesis conversion %q is unknown", g.Conversion)
	}
	if len(g.Nonce) != 16 {
		return fmt.Errorf("genesis nonce has %d bytes, want 16", len(g.Nonce))
	}
	if g.Silo != "" {
		if err := checkName("silo", g.Silo); err != nil {
			return err
		}
	}
	c.pub = ed25519.PublicKey(bytes.Clone(g.PublicKey))
	c.orders = slices.Clone(g.Orders)
	c.conv = conv
	c.push(e)
	return nil
}

func (c *chain) applyBudget(e *Entry) error {
	b := e.Budget
	if err := checkName("dataset", b.Dataset); err != nil {
		return err
	}
	if err := checkEpsilon(b.Epsilon); err != nil {
		return err
	}
	if err := checkDelta(b.Delta); err != nil {
		return err
	}
	if _, dup := c.datasets[b.Dataset]; dup {
		return diag.New(diag.LedgerBudgetExists, "dataset "+b.Dataset, "dataset %q already has a budget", b.Dataset).
			WithHelp("a budget is declared once and never raised; use a new dataset name for new data")
	}
	c.datasets[b.Dataset] = &datasetState{budget: *b, rdp: make([]float64, len(c.orders))}
	c.push(e)
	return nil
}

func (c *chain) applyCharge(e *Entry, recompute bool) error {
	ch := e.Charge
	ds, ok := c.datasets[ch.Dataset]
	if !ok {
		return diag.New(diag.LedgerNoBudget, "dataset "+ch.Dataset, "dataset %q has no budget in this ledger", ch.Dataset)
	}
	if err := checkName("consumer", ch.Consumer); err != nil {
		return err
	}
	if len(ch.Mechanisms) == 0 || len(ch.Mechanisms) > maxMechanisms {
		return fmt.Errorf("charge lists %d mechanisms, want 1 to %d", len(ch.Mechanisms), maxMechanisms)
	}
	if len(ch.RDP) != len(c.orders) {
		return fmt.Errorf("RDP curve has %d values for %d orders", len(ch.RDP), len(c.orders))
	}
	for _, m := range ch.Mechanisms {
		if err := m.Validate(); err != nil {
			return err
		}
	}
	if recompute {
		want, steps, err := c.curveOf(ch.Mechanisms)
		if err != nil {
			return err
		}
		for i, v := range ch.RDP {
			if !(v >= 0) || !closeEnough(v, want[i], 1e-13*steps) {
				return fmt.Errorf("RDP at order %v is %v, but the mechanisms give %v", c.orders[i], v, want[i])
			}
		}
	}
	total := addCurves(ds.rdp, ch.RDP)
	cum, _, err := Epsilon(c.orders, total, ds.budget.Delta, c.conv)
	if err != nil {
		return err
	}
	alone, _, err := Epsilon(c.orders, ch.RDP, ds.budget.Delta, c.conv)
	if err != nil {
		return err
	}
	if !closeEnough(ch.Cumulative, cum, 1e-12) || !closeEnough(ch.Epsilon, alone, 1e-12) {
		return fmt.Errorf("stored ε (charge %v, cumulative %v) differs from the recomputed (charge %v, cumulative %v)", ch.Epsilon, ch.Cumulative, alone, cum)
	}
	if ch.Cumulative < ds.eps {
		return fmt.Errorf("cumulative ε decreases from %v to %v", ds.eps, ch.Cumulative)
	}
	if ch.Cumulative > ds.budget.Epsilon || cum > ds.budget.Epsilon*(1+1e-9) {
		return fmt.Errorf("cumulative ε %v exceeds the budget %v of dataset %q", ch.Cumulative, ds.budget.Epsilon, ch.Dataset)
	}
	ds.rdp = total
	ds.eps, ds.order = ch.Cumulative, ch.Order
	ds.charges++
	c.push(e)
	return nil
}

// curveOf composes the RDP curves of ms on the ledger's orders and returns
// the total number of steps (for the verification tolerance).
func (c *chain) curveOf(ms []Mechanism) ([]float64, float64, error) {
	sum := make([]float64, len(c.orders))
	var steps float64
	for _, m := range ms {
		r, err := m.RDP(c.orders)
		if err != nil {
			return nil, 0, err
		}
		sum = addCurves(sum, r)
		steps += float64(m.Steps)
	}
	return sum, steps, nil
}

func addCurves(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

// checkName accepts printable UTF-8 of 1 to 256 bytes without surrounding
// space; names appear in tables and CSV exports.
func checkName(what, s string) error {
	bad := func(why string) error {
		return diag.New(diag.LedgerBadName, what, "%s name %q %s", what, s, why).
			WithHelp("use 1 to %d printable characters, e.g. icu-2024 or round:7", maxNameLen)
	}
	switch {
	case s == "":
		return bad("is empty")
	case len(s) > maxNameLen:
		return bad("is too long")
	case !utf8.ValidString(s):
		return bad("is not UTF-8")
	case strings.TrimSpace(s) != s:
		return bad("has surrounding spaces")
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return bad("holds a control character")
		}
	}
	return nil
}

// DatasetStatus is one dataset's budget and spending.
type DatasetStatus struct {
	Dataset   string  `json:"dataset"`
	Budget    float64 `json:"budget_epsilon"`
	Delta     float64 `json:"delta"`
	Spent     float64 `json:"spent_epsilon"`
	Remaining float64 `json:"remaining_epsilon"`
	Order     float64 `json:"order,omitempty"` // order attaining Spent
	Charges   int     `json:"charges"`
}

func (c *chain) status(name string) (DatasetStatus, bool) {
	ds, ok := c.datasets[name]
	if !ok {
		return DatasetStatus{}, false
	}
	return DatasetStatus{
		Dataset: name, Budget: ds.budget.Epsilon, Delta: ds.budget.Delta,
		Spent: ds.eps, Remaining: math.Max(0, ds.budget.Epsilon-ds.eps),
		Order: ds.order, Charges: ds.charges,
	}, true
}

func (c *chain) statuses() []DatasetStatus {
	names := make([]string, 0, len(c.datasets))
	for n := range c.datasets {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]DatasetStatus, len(names))
	for i, n := range names {
		out[i], _ = c.status(n)
	}
	return out
}

// clone returns a deep enough copy for a read-only Snapshot: entries are
// never modified after apply, so sharing their payload pointers is safe.
func (c *chain) clone() *chain {
	d := &chain{
		format: c.format, entries: slices.Clone(c.entries), head: c.head, pub: c.pub,
		orders: slices.Clone(c.orders), conv: c.conv,
		datasets: make(map[string]*datasetState, len(c.datasets)),
	}
	for k, v := range c.datasets {
		cp := *v
		cp.rdp = slices.Clone(v.rdp)
		d.datasets[k] = &cp
	}
	return d
}
