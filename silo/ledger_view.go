package silo

import (
	"fmt"
	"math"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/dp"
)

// LedgerView is the read side of a silo's privacy ledger that the policy
// needs. Account returns a dataset's budget and spending and the RDP curve
// its charges compose to, on the ledger's order grid and with its
// conversion — what it takes to compute, with the accountant, what one more
// charge would cost exactly as dp.Ledger.Charge will. A dataset the ledger
// has no budget for is diag.LedgerNoBudget. Implementations must be safe to
// call concurrently. LedgerOf adapts a *dp.Ledger.
type LedgerView interface {
	Account(dataset string) (Account, error)
}

// Account is one dataset's state in a ledger.
type Account struct {
	Status     dp.DatasetStatus
	Orders     []float64
	Conversion dp.Conversion
	// RDP is the composed curve of every charge so far (zeros before the
	// first), element i at Orders[i].
	RDP []float64
}

// Quote is what a charge would cost a dataset, at the dataset's δ.
type Quote struct {
	Requested float64 // ε of the charge alone
	Total     float64 // cumulative ε with every earlier charge composed in RDP
}

// Quote computes, with the RDP accountant, what charging ms would cost: the
// same arithmetic as dp.Ledger.Charge, so a charge quoted within budget is
// one the ledger accepts (unless another charge lands first).
func (a Account) Quote(ms []dp.Mechanism) (Quote, error) {
	if len(a.RDP) != len(a.Orders) {
		return Quote{}, fmt.Errorf("silo: account has %d RDP values for %d orders", len(a.RDP), len(a.Orders))
	}
	curve := make([]float64, len(a.Orders))
	for _, m := range ms {
		r, err := m.RDP(a.Orders)
		if err != nil {
			return Quote{}, err
		}
		for i := range curve {
			curve[i] += r[i]
		}
	}
	alone, _, err := dp.Epsilon(a.Orders, curve, a.Status.Delta, a.Conversion)
	if err != nil {
		return Quote{}, err
	}
	total := make([]float64, len(a.Orders))
	for i := range total {
		total[i] = a.RDP[i] + curve[i]
	}
	cum, _, err := dp.Epsilon(a.Orders, total, a.Status.Delta, a.Conversion)
	if err != nil {
		return Quote{}, err
	}
	if math.IsNaN(cum) {
		cum = math.Inf(1)
	}
	return Quote{Requested: alone, Total: cum}, nil
}

// ledgerView reads accounts from a ledger's snapshots.
type ledgerView struct {
	snapshot func() (*dp.Snapshot, error)
}

// LedgerOf returns the view of an open ledger. Each Account call takes a
// fresh snapshot, so it sees the charges other processes appended.
func LedgerOf(l *dp.Ledger) LedgerView { return ledgerView{snapshot: l.Snapshot} }

// SnapshotView returns the view of one ledger snapshot (for example what
// dp.Verify returned for a ledger file read without its key).
func SnapshotView(s *dp.Snapshot) LedgerView {
	return ledgerView{snapshot: func() (*dp.Snapshot, error) { return s, nil }}
}

func (v ledgerView) Account(dataset string) (Account, error) {
	s, err := v.snapshot()
	if err != nil {
		return Account{}, err
	}
	st, ok := s.Dataset(dataset)
	if !ok {
		return Account{}, diag.New(diag.LedgerNoBudget, "dataset "+dataset, "dataset %q has no budget in the ledger", dataset).
			WithHelp("the silo declares the budgets of its config's datasets when it starts; or declare one: `scellis ledger budget --dataset %s --epsilon E --delta D`", dataset)
	}
	a := Account{Status: st, Orders: s.Orders(), Conversion: s.Conversion()}
	a.RDP = make([]float64, len(a.Orders))
	for _, e := range s.Entries() {
		if e.Kind != dp.KindCharge || e.Charge == nil || e.Charge.Dataset != dataset {
			continue
		}
		if len(e.Charge.RDP) != len(a.RDP) {
			return Account{}, fmt.Errorf("silo: ledger charge %d has %d RDP values for %d orders", e.Seq, len(e.Charge.RDP), len(a.RDP))
		}
		// The ledger composes charges in this order with this addition;
		// doing the same keeps quotes bit-identical to Charge's sums.
		for i, v := range e.Charge.RDP {
			a.RDP[i] += v
		}
	}
	return a, nil
}
