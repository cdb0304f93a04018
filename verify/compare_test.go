package verify

import (
	"math"
	"strings"
	"testing"
)

func TestCompare(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	vec := func(xs ...float64) []any {
		out := make([]any, len(xs))
		for i, x := range xs {
			out[i] = x
		}
		return out
	}
	abs := Tolerance{Abs: 1e-3}
	rel := Tolerance{Rel: 1e-3}
	relMetric := Tolerance{Rel: 1e-3, Per: PerMetric}
	cases := []struct {
		name   string
		a, b   any
		tol    Tolerance
		within bool
		where  string // the failing path, when not within
		reason string // a word of the reason
	}{
		{"equal scalars", 1.0, 1.0, abs, true, "", ""},
		{"abs inside", 1.0, 1.0009, abs, true, "", ""},
		{"abs outside", 1.0, 1.0011, abs, false, "(the value)", "over the tolerance"},
		{"rel scales with the value", 1000.0, 1000.9, rel, true, "", ""},
		{"rel outside", 1000.0, 1001.1, rel, false, "(the value)", "over"},
		{"int against float", int64(3), 3.0, abs, true, "", ""},
		// Per tensor: the relative tolerance scales with the tensor's
		// largest entry, so a near-zero entry of a large tensor may move
		// by rounding noise of the large ones.
		{"per tensor scales by the max", vec(1000, 1e-9), vec(1000, 0.5), rel, true, "", ""},
		{"per metric does not", vec(1000, 1e-9), vec(1000, 0.5), relMetric, false, "[1]", "over"},
		{"per tensor outside", vec(1, 2, 3), vec(1, 2, 3.01), rel, false, "[2]", "over"},
		{"matrix per tensor", []any{vec(1, 2), vec(3, 4)}, []any{vec(1, 2), vec(3, 4.001)}, Tolerance{Abs: 0.01}, true, "", ""},
		{"metrics dict", map[string]any{"auc": 0.81, "loss": 0.5}, map[string]any{"auc": 0.8105, "loss": 0.5}, abs, true, "", ""},
		{"metrics dict outside", map[string]any{"auc": 0.81, "loss": 0.5}, map[string]any{"auc": 0.82, "loss": 0.5}, abs, false, "auc", "over"},
		{"nested path", map[string]any{"m": map[string]any{"w": vec(1, 2)}}, map[string]any{"m": map[string]any{"w": vec(1, 3)}}, abs, false, "m.w[1]", "over"},
		// NaN agrees only with NaN at the same place; Inf with the same Inf.
		{"NaN with NaN", vec(1, nan), vec(1, nan), abs, true, "", ""},
		{"NaN against number", vec(1, nan), vec(1, 2), abs, false, "[1]", "NaN"},
		{"number against NaN", 2.0, nan, abs, false, "(the value)", "NaN"},
		{"NaN metric", map[string]any{"x": nan}, map[string]any{"x": nan}, relMetric, true, "", ""},
		{"Inf with Inf", vec(inf), vec(inf), abs, true, "", ""},
		{"Inf against -Inf", vec(inf), vec(-inf), abs, false, "[0]", "Inf"},
		// Shape mismatches are disagreements, not errors.
		{"vector lengths", vec(1, 2), vec(1, 2, 3), abs, false, "(the value)", "shape mismatch"},
		{"matrix shapes", []any{vec(1, 2), vec(3, 4)}, []any{vec(1, 2, 3, 4)}, abs, false, "(the value)", "shape mismatch"},
		{"matrix rows vs flat", []any{vec(1, 2)}, vec(1, 2), abs, false, "(the value)", "shape mismatch"},
		{"missing key", map[string]any{"a": 1.0}, map[string]any{"b": 1.0}, abs, false, "a", "only one"},
		{"dict against list", map[string]any{}, vec(1), abs, false, "(the value)", "a dict against a list"},
		{"number against string", 1.0, "1", abs, false, "(the value)", "a number against a string"},
		{"strings equal", "ok", "ok", abs, true, "", ""},
		{"strings differ", map[string]any{"model": "a"}, map[string]any{"model": "b"}, abs, false, "model", "differs"},
		{"bools", true, false, abs, false, "(the value)", "differs"},
		{"nil", nil, nil, abs, true, "", ""},
		{"mixed list per tensor", []any{1.0, "x"}, []any{1.0005, "x"}, abs, true, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Compare(c.a, c.b, c.tol)
			if got.Within != c.within {
				t.Fatalf("within %v, want %v (%+v)", got.Within, c.within, got)
			}
			if !c.within && (got.Where != c.where || !strings.Contains(got.Reason, c.reason)) {
				t.Fatalf("failed at %q (%s), want %q mentioning %q", got.Where, got.Reason, c.where, c.reason)
			}
			// Symmetric in verdict (the scale of a relative tolerance is
			// taken from b per tensor, so only the verdict is compared).
			if c.tol.Per == PerMetric || c.tol.Rel == 0 {
				if back := Compare(c.b, c.a, c.tol); back.Within != got.Within {
					t.Fatalf("not symmetric: %+v then %+v", got, back)
				}
			}
		})
	}
}

func TestCompareReportsLargestDifference(t *testing.T) {
	got := Compare([]any{1.0, 2.0, 3.0}, []any{1.0, 2.0004, 3.0001}, Tolerance{Abs: 1e-3})
	if !got.Within || math.Abs(got.MaxAbs-4e-4) > 1e-12 {
		t.Fatalf("%+v", got)
	}
}

func TestTolerance(t *testing.T) {
	for _, bad := range []Tolerance{{}, {Abs: -1}, {Rel: math.NaN()}, {Abs: math.Inf(1)}, {Abs: 1, Per: "row"}} {
		if bad.Check() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if err := (Tolerance{Abs: 1e-9, Per: PerMetric}).Check(); err != nil {
		t.Fatal(err)
	}
	if s := (Tolerance{Abs: 1e-9, Rel: 0.5}).String(); s != "abs=1e-09,rel=0.5,per=tensor" {
		t.Fatalf("String: %s", s)
	}
	for _, tol := range []Tolerance{{Abs: 1e-9, Rel: 0.5, Per: PerTensor}, {Rel: 1e-3, Per: PerMetric}} {
		if back, err := ParseTolerance(tol.String()); err != nil || back != tol {
			t.Fatalf("ParseTolerance(%q) = %+v, %v", tol, back, err)
		}
	}
	for _, bad := range []string{"", "abs=x", "abs=1,size=2", "abs=0,rel=0,per=tensor"} {
		if _, err := ParseTolerance(bad); err == nil {
			t.Fatalf("ParseTolerance(%q) accepted", bad)
		}
	}
	for in, want := range map[string]Tier{"": Replayable, "replayable": Replayable, "convergent": Convergent} {
		if got, err := ParseTier(in); err != nil || got != want {
			t.Fatalf("ParseTier(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseTier("fast"); err == nil {
		t.Fatal("unknown tier accepted")
	}
	if ErrorProbability(20) != 1.0/(1<<20) {
		t.Fatal("2^-20")
	}
}
