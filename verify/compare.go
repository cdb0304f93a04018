package verify

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Comparison is the outcome of comparing two result values.
type Comparison struct {
	// Within is true when the values have the same shape, equal
	// non-numeric leaves and every number or tensor within tolerance.
	Within bool `json:"within"`
	// MaxAbs and MaxRel are the largest absolute and relative differences
	// seen (relative to the scale the tolerance uses).
	MaxAbs float64 `json:"max_abs"`
	MaxRel float64 `json:"max_rel"`
	// Where is the path of the first failing element ("sums[3]"), and
	// Reason says why it failed; both empty when Within.
	Where  string `json:"where,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Compare compares two canonical result values (what content.Decode gives:
// maps with string keys, lists, int64, float64, strings, bools, nil) under
// t. Shapes must match exactly: a missing key, a list of another length or
// a different type is a disagreement, never an error. NaN agrees only with
// NaN at the same place, and an infinity only with the same infinity: a
// tolerance bounds rounding, and rounding never turns a number into NaN.
func Compare(a, b any, t Tolerance) Comparison {
	c := &comparer{tol: t, per: t.per()}
	c.value("", a, b)
	c.out.Within = c.out.Reason == ""
	return c.out
}

type comparer struct {
	tol Tolerance
	per string
	out Comparison
}

func (c *comparer) fail(where, format string, args ...any) {
	if c.out.Reason == "" {
		if where == "" {
			where = "(the value)"
		}
		c.out.Where, c.out.Reason = where, fmt.Sprintf(format, args...)
	}
}

func (c *comparer) value(where string, a, b any) {
	if c.per == PerTensor {
		if va, ok := numericList(a); ok {
			if vb, ok := numericList(b); ok {
				c.tensor(where, a, b, va, vb)
				return
			}
		}
	}
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			c.fail(where, "a dict against %s", kind(b))
			return
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		for k := range y {
			if _, ok := x[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			va, oka := x[k]
			vb, okb := y[k]
			p := join(where, k)
			if !oka || !okb {
				c.fail(p, "key %q is in only one of the results", k)
				continue
			}
			c.value(p, va, vb)
		}
	case []any:
		y, ok := b.([]any)
		if !ok {
			c.fail(where, "a list against %s", kind(b))
			return
		}
		if len(x) != len(y) {
			c.fail(where, "shape mismatch: %d elements against %d", len(x), len(y))
			return
		}
		for i := range x {
			c.value(fmt.Sprintf("%s[%d]", where, i), x[i], y[i])
		}
	default:
		na, oka := number(a)
		nb, okb := number(b)
		switch {
		case oka && okb:
			c.scalar(where, na, nb, math.Max(math.Abs(na), math.Abs(nb)))
		case oka || okb:
			c.fail(where, "%s against %s", kind(a), kind(b))
		default:
			if !equalLeaf(a, b) {
				c.fail(where, "%s differs: %.40v against %.40v", kind(a), a, b)
			}
		}
	}
}

// tensor compares two numeric lists as a whole (PerTensor).
func (c *comparer) tensor(where string, a, b any, va, vb []float64) {
	if !sameShape(a, b) {
		c.fail(where, "shape mismatch: %s against %s", shape(a), shape(b))
		return
	}
	scale, worst, at := 0.0, 0.0, -1
	for i := range vb {
		if v := math.Abs(vb[i]); !math.IsInf(v, 0) && !math.IsNaN(v) {
			scale = math.Max(scale, v)
		}
	}
	for i := range va {
		x, y := va[i], vb[i]
		if special(x) || special(y) {
			if !sameSpecial(x, y) {
				c.fail(fmt.Sprintf("%s[%d]", where, i), "%v against %v", x, y)
				return
			}
			continue
		}
		if d := math.Abs(x - y); d > worst || at < 0 {
			worst, at = d, i
		}
	}
	if at < 0 {
		return
	}
	c.record(worst, scale)
	if worst > c.tol.Abs+c.tol.Rel*scale {
		c.fail(fmt.Sprintf("%s[%d]", where, at), "differs by %g, over the tolerance %g (abs %g + rel %g × tensor max %g)",
			worst, c.tol.Abs+c.tol.Rel*scale, c.tol.Abs, c.tol.Rel, scale)
	}
}

// scalar compares one number (PerMetric, or a number outside any list).
func (c *comparer) scalar(where string, x, y, scale float64) {
	if special(x) || special(y) {
		if !sameSpecial(x, y) {
			c.fail(where, "%v against %v", x, y)
		}
		return
	}
	d := math.Abs(x - y)
	c.record(d, scale)
	if d > c.tol.Abs+c.tol.Rel*scale {
		c.fail(where, "%g against %g differ by %g, over the tolerance %g", x, y, d, c.tol.Abs+c.tol.Rel*scale)
	}
}

func (c *comparer) record(d, scale float64) {
	c.out.MaxAbs = math.Max(c.out.MaxAbs, d)
	if scale > 0 {
		c.out.MaxRel = math.Max(c.out.MaxRel, d/scale)
	} else if d > 0 {
		c.out.MaxRel = math.Inf(1)
	}
}

func special(x float64) bool { return math.IsNaN(x) || math.IsInf(x, 0) }

func sameSpecial(x, y float64) bool {
	if math.IsNaN(x) || math.IsNaN(y) {
		return math.IsNaN(x) && math.IsNaN(y)
	}
	return x == y // both infinite here, or one finite: equal only if same
}

// number returns a numeric leaf as a float64.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case int64:
		return float64(x), true
	case int:
		return float64(x), true
	case uint64:
		return float64(x), true
	}
	return 0, false
}

// numericList flattens a non-empty list whose leaves are all numbers
// (a vector, a matrix as a list of rows, ...).
func numericList(v any) ([]float64, bool) {
	l, ok := v.([]any)
	if !ok || len(l) == 0 {
		return nil, false
	}
	var out []float64
	var walk func(any) bool
	walk = func(v any) bool {
		if l, ok := v.([]any); ok {
			if len(l) == 0 {
				return false
			}
			for _, e := range l {
				if !walk(e) {
					return false
				}
			}
			return true
		}
		n, ok := number(v)
		out = append(out, n)
		return ok
	}
	if !walk(l) {
		return nil, false
	}
	return out, true
}

func sameShape(a, b any) bool {
	la, oka := a.([]any)
	lb, okb := b.([]any)
	if oka != okb {
		return false
	}
	if !oka {
		return true
	}
	if len(la) != len(lb) {
		return false
	}
	for i := range la {
		if !sameShape(la[i], lb[i]) {
			return false
		}
	}
	return true
}

func shape(v any) string {
	var dims []string
	for {
		l, ok := v.([]any)
		if !ok {
			break
		}
		dims = append(dims, fmt.Sprint(len(l)))
		if len(l) == 0 {
			break
		}
		v = l[0]
	}
	return "[" + strings.Join(dims, "×") + "]"
}

func equalLeaf(a, b any) bool {
	switch x := a.(type) {
	case []byte:
		y, ok := b.([]byte)
		return ok && string(x) == string(y)
	case nil, string, bool:
		return a == b
	}
	return false
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case map[string]any:
		return "a dict"
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "a bool"
	case []byte:
		return "bytes"
	}
	if _, ok := number(v); ok {
		return "a number"
	}
	return fmt.Sprintf("%T", v)
}

func join(where, key string) string {
	if where == "" {
		return key
	}
	return where + "." + key
}
