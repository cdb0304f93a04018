package verify

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Tier is a job's reproducibility tier (SPEC §10).
type Tier string

const (
	// Replayable results are byte-identical on every run and every peer;
	// replicas agree when their result hashes are equal.
	Replayable Tier = "replayable"
	// Convergent results agree within a declared Tolerance; the
	// comparison runs on a verifier peer, never on the coordinator.
	Convergent Tier = "convergent"
)

// ParseTier accepts "replayable" or "convergent" ("" is replayable).
func ParseTier(s string) (Tier, error) {
	switch Tier(s) {
	case "", Replayable:
		return Replayable, nil
	case Convergent:
		return Convergent, nil
	}
	return "", fmt.Errorf("unknown reproducibility tier %q (want replayable or convergent)", s)
}

// Granularity says what a tolerance bounds.
const (
	// PerTensor compares each numeric list (vector, matrix, nested list)
	// as a whole: ‖a−b‖∞ ≤ abs + rel·‖b‖∞ over the list, so a relative
	// tolerance is scaled by the tensor's largest entry and near-zero
	// entries of a large tensor do not fail on rounding noise.
	PerTensor = "tensor"
	// PerMetric compares every number on its own:
	// |a−b| ≤ abs + rel·max(|a|, |b|).
	PerMetric = "metric"
)

// Tolerance is the convergent tier's allowed difference. Numbers outside
// lists (a metric such as {"auc": 0.81}) are compared per metric under
// either granularity.
type Tolerance struct {
	Abs float64 `cbor:"abs,omitempty" json:"abs,omitempty"`
	Rel float64 `cbor:"rel,omitempty" json:"rel,omitempty"`
	// Per is PerTensor (default when empty) or PerMetric.
	Per string `cbor:"per,omitempty" json:"per,omitempty"`
}

// IsZero reports whether no difference at all is allowed.
func (t Tolerance) IsZero() bool { return t.Abs == 0 && t.Rel == 0 }

// Check refuses a tolerance that cannot be applied: negative, not
// finite, or an unknown granularity.
func (t Tolerance) Check() error {
	for _, v := range []float64{t.Abs, t.Rel} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("tolerance %v must be a finite number ≥ 0", v)
		}
	}
	if t.IsZero() {
		return fmt.Errorf("a convergent tolerance needs abs or rel above 0 (0 is the replayable tier)")
	}
	switch t.Per {
	case "", PerTensor, PerMetric:
		return nil
	}
	return fmt.Errorf("tolerance per %q: want %q or %q", t.Per, PerTensor, PerMetric)
}

// per returns the granularity, PerTensor by default.
func (t Tolerance) per() string {
	if t.Per == "" {
		return PerTensor
	}
	return t.Per
}

// String renders the tolerance as it appears in methods and result.json:
// "abs=1e-09,rel=1e-06,per=tensor".
func (t Tolerance) String() string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	return "abs=" + f(t.Abs) + ",rel=" + f(t.Rel) + ",per=" + t.per()
}

// ParseTolerance reads what String writes.
func ParseTolerance(s string) (Tolerance, error) {
	var t Tolerance
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return t, fmt.Errorf("tolerance %q: want abs=…,rel=…,per=…", s)
		}
		var err error
		switch k {
		case "abs":
			t.Abs, err = strconv.ParseFloat(v, 64)
		case "rel":
			t.Rel, err = strconv.ParseFloat(v, 64)
		case "per":
			t.Per = v
		default:
			err = fmt.Errorf("unknown key %q", k)
		}
		if err != nil {
			return t, fmt.Errorf("tolerance %q: %w", s, err)
		}
	}
	return t, t.Check()
}

// Method names, as receipts and result.json record them. They are stable
// strings: receipts hash them.

// MethodExact is the replayable tier's redundant exact match.
func MethodExact(replicas int) string { return fmt.Sprintf("quorum-%d-exact", replicas) }

// MethodConvergent is a quorum whose replicas agree within t, judged by a
// verifier peer running the content's compare function.
func MethodConvergent(replicas int, t Tolerance) string {
	return fmt.Sprintf("quorum-%d-convergent(%s)", replicas, t)
}

// MethodFreivalds is a single execution checked by a verifier peer with k
// Freivalds rounds (false-accept probability ≤ 2^-k).
func MethodFreivalds(k int) string { return fmt.Sprintf("freivalds-k%d", k) }

// MaxFreivaldsRounds bounds k: 2^-64 is below any meaningful risk, and the
// check's cost grows linearly in k.
const MaxFreivaldsRounds = 64

// ErrorProbability is Freivalds' bound on accepting a wrong product after
// k independent rounds: 2^-k.
func ErrorProbability(k int) float64 { return math.Ldexp(1, -k) }
