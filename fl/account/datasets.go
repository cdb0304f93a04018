package account

import (
	"math"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/silo"
)

// Charge is one ledger entry that paid for a round of the run, and what
// proves it.
type Charge struct {
	Round        int            `json:"round"`
	Status       string         `json:"status"`
	Mechanisms   []dp.Mechanism `json:"mechanisms"`
	Epsilon      float64        `json:"epsilon"`
	LedgerEntry  content.Ref    `json:"ledger_entry"`
	Receipt      uint64         `json:"receipt"`
	ReceiptHash  content.Ref    `json:"receipt_hash"` // filled by a reader of the receipt chain (privacy report)
	Contribution content.Ref    `json:"contribution"`
	// AbandonedJob: the charge is proved by a record reported to a round
	// attempt the aggregator abandoned (ByAbandoned); LateJob: by a
	// record reported late to a round job reduced without it (ByLate).
	AbandonedJob content.Ref `json:"abandoned_job,omitempty"`
	LateJob      content.Ref `json:"late_job,omitempty"`
}

// Dataset is what a run cost one silo's dataset.
type Dataset struct {
	Silo      string    `json:"silo"`
	Dataset   string    `json:"dataset"`
	Mechanism string    `json:"mechanism"`
	Sigma     []float64 `json:"sigma"`
	Q         []float64 `json:"q"`
	Rounds    int       `json:"rounds_contributed"` // rounds charged (a failed secure aggregation's included: the charge stands)
	Declined  int       `json:"rounds_declined"`    // rounds the silo declined (an attempt's receipt cites the refusal)
	PerRound  []float64 `json:"epsilon_per_round"`
	RunEps    float64   `json:"run_epsilon"` // this run's charges composed in RDP, at Delta
	Delta     float64   `json:"delta"`
	// LedgerEps is the dataset's cumulative ε in the silo's ledger (every
	// charge, all runs) as the latest of its records states it.
	LedgerEps float64  `json:"ledger_cumulative_epsilon"`
	Budget    float64  `json:"budget_epsilon"`
	Remaining float64  `json:"remaining_epsilon"`
	Charges   []Charge `json:"charges"`
	// Verified: every record behind the row carries a valid signature of
	// its silo.
	Verified bool `json:"verified"`
}

// Datasets groups records by silo and dataset and composes each one's
// charges with the accountant (the default Rényi orders, the improved
// conversion). A charge is counted once however many records name its
// ledger entry, proved by a receipt when one record has one.
func Datasets(recs []Record) ([]Dataset, error) {
	byKey := map[[2]string]*Dataset{}
	curves := map[[2]string][]float64{}
	orders := dp.DefaultOrders()
	recs = slices.Clone(recs)
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Proof == ByReceipt && recs[j].Proof != ByReceipt })
	counted := map[content.Ref]bool{}
	// silo, dataset → rounds it declined (a receipt cites the refusal),
	// and rounds it took part in (in some attempt): a round declined in
	// one attempt and contributed to in its retry is not declined.
	declined, took := map[[2]string]map[int]bool{}, map[[2]string]map[int]bool{}
	mark := func(m map[[2]string]map[int]bool, k [2]string, round int) {
		if m[k] == nil {
			m[k] = map[int]bool{}
		}
		m[k][round] = true
	}
	for _, rec := range recs {
		k := [2]string{rec.Silo, rec.Dataset}
		row := byKey[k]
		if row == nil {
			row = &Dataset{Silo: rec.Silo, Dataset: rec.Dataset, Verified: true}
			byKey[k] = row
			curves[k] = make([]float64, len(orders))
		}
		row.Verified = row.Verified && rec.Verified
		if rec.Budget > 0 && rec.Cumulative >= row.LedgerEps {
			row.LedgerEps, row.Budget = rec.Cumulative, rec.Budget
		}
		if rec.Status == silo.Contributed || rec.LedgerEntry != "" {
			mark(took, k, rec.Round)
		}
		if rec.LedgerEntry == "" {
			if rec.Status == silo.Declined && rec.Proof == ByReceipt {
				mark(declined, k, rec.Round)
			}
			continue
		}
		if counted[rec.LedgerEntry] {
			continue
		}
		counted[rec.LedgerEntry] = true
		if err := row.charge(rec, orders, curves[k]); err != nil {
			return nil, err
		}
	}
	var rows []Dataset
	for k, row := range byKey {
		for r := range declined[k] {
			if !took[k][r] {
				row.Declined++
			}
		}
		if row.Rounds > 0 && row.Delta > 0 {
			eps, _, err := dp.Epsilon(orders, curves[k], row.Delta, dp.Improved)
			if err != nil {
				return nil, err
			}
			row.RunEps = eps
		}
		row.Remaining = math.Max(0, row.Budget-row.LedgerEps)
		sort.SliceStable(row.Charges, func(i, j int) bool { return row.Charges[i].Round < row.Charges[j].Round })
		row.PerRound = []float64{}
		for _, ch := range row.Charges {
			row.PerRound = append(row.PerRound, ch.Epsilon)
		}
		rows = append(rows, *row)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Silo != rows[j].Silo {
			return rows[i].Silo < rows[j].Silo
		}
		return rows[i].Dataset < rows[j].Dataset
	})
	return rows, nil
}

// charge adds one ledger charge to the row and its RDP curve.
func (row *Dataset) charge(rec Record, orders, curve []float64) error {
	row.Rounds++
	ch := Charge{Round: rec.Round, Status: rec.Status, Mechanisms: rec.Mechanisms, Epsilon: rec.Epsilon,
		LedgerEntry: rec.LedgerEntry, Contribution: rec.Ref}
	switch rec.Proof {
	case ByReceipt:
		ch.Receipt = rec.Receipt
	case ByLate:
		ch.Status, ch.LateJob = rec.Status+" (late record)", rec.ReportedTo
	default:
		ch.Status, ch.AbandonedJob = rec.Status+" (abandoned attempt)", rec.ReportedTo
	}
	row.Charges = append(row.Charges, ch)
	for _, m := range rec.Mechanisms {
		if !slices.Contains(row.Sigma, m.Sigma) {
			row.Sigma = append(row.Sigma, m.Sigma)
		}
		if !slices.Contains(row.Q, m.Q) {
			row.Q = append(row.Q, m.Q)
		}
		if row.Mechanism == "" {
			row.Mechanism = m.Kind
		} else if !strings.Contains(row.Mechanism, m.Kind) {
			row.Mechanism += "+" + m.Kind
		}
		c, err := rdpOf(m, orders)
		if err != nil {
			return err
		}
		for i := range c {
			curve[i] += c[i]
		}
	}
	if rec.Delta > 0 {
		row.Delta = rec.Delta
	}
	return nil
}

// curves memoises the RDP curve of each mechanism on the default orders:
// computing one costs about 3 ms (a subsampled Gaussian's series), and a
// run charges the same mechanism every round, so the Studio, which
// composes every run's charges for each picture, would spend its time
// there. Bounded: records are the silos', and a memo must not grow with
// whatever they claim.
var curves = struct {
	sync.Mutex
	m map[dp.Mechanism][]float64
}{m: map[dp.Mechanism][]float64{}}

const maxCurves = 1024

// rdpOf is m.RDP(orders), memoised; orders must be dp.DefaultOrders().
func rdpOf(m dp.Mechanism, orders []float64) ([]float64, error) {
	curves.Lock()
	c, ok := curves.m[m]
	curves.Unlock()
	if ok {
		return c, nil
	}
	c, err := m.RDP(orders)
	if err != nil {
		return nil, err
	}
	curves.Lock()
	if len(curves.m) >= maxCurves {
		clear(curves.m)
	}
	curves.m[m] = c
	curves.Unlock()
	return c, nil
}
