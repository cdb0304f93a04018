package script

import (
	"fmt"
	"math"
	"slices"

	"go.starlark.net/starlark"

	"github.com/scellis/scellis/tensor"
)

// statsModule: descriptive statistics over a vector or a list of numbers.
var statsModule = makeModule("stats", map[string]nativeFunc{
	"mean": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		v, err := nonEmpty(st, "stats.mean", args, kw)
		if err != nil {
			return nil, err
		}
		return starlark.Float(tensor.Mean(v)), nil
	},
	"var": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		v, ddof, err := withDdof(st, "stats.var", args, kw)
		if err != nil {
			return nil, err
		}
		return starlark.Float(variance(v, ddof)), nil
	},
	"std": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		v, ddof, err := withDdof(st, "stats.std", args, kw)
		if err != nil {
			return nil, err
		}
		return starlark.Float(math.Sqrt(variance(v, ddof))), nil
	},
	"quantile": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x, q starlark.Value
		if err := unpack("stats.quantile", args, kw, "x", &x, "q", &q); err != nil {
			return nil, err
		}
		v, err := st.toVector(x, "x")
		if err != nil {
			return nil, err
		}
		if len(v) == 0 {
			return nil, fmt.Errorf("quantile of no values")
		}
		if tensor.FirstNonFinite(v) >= 0 {
			return nil, fmt.Errorf("x holds NaN or Inf")
		}
		if err := st.reserve(bytesOf(len(v)), "stats.quantile"); err != nil {
			return nil, err
		}
		sorted := slices.Clone([]float64(v))
		slices.Sort(sorted)
		if qf, ok := asFloat(q); ok {
			r, err := quantile(sorted, qf)
			return starlark.Float(r), err
		}
		qs, err := st.toVector(q, "q")
		if err != nil {
			return nil, err
		}
		out := make([]float64, len(qs))
		for i, qf := range qs {
			if out[i], err = quantile(sorted, qf); err != nil {
				return nil, err
			}
		}
		return floatList(st, out)
	},
	"histogram": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		var bins int
		var lo, hi num
		if err := unpack("stats.histogram", args, kw, "x", &x, "bins", &bins, "lo", &lo, "hi", &hi); err != nil {
			return nil, err
		}
		v, err := st.toVector(x, "x")
		if err != nil {
			return nil, err
		}
		if bins > 0 && bins <= maxBins {
			if err := st.reserve(uint64(2*bins+1)*(slotBytes+floatBytes)+3*listBytes, "stats.histogram"); err != nil {
				return nil, err
			}
		}
		edges, counts, outside, err := histogram(v, bins, float64(lo), float64(hi))
		if err != nil {
			return nil, err
		}
		cs := make([]starlark.Value, len(counts))
		for i, c := range counts {
			cs[i] = starlark.MakeInt(c)
		}
		d := starlark.NewDict(3)
		d.SetKey(starlark.String("counts"), starlark.NewList(cs))
		d.SetKey(starlark.String("edges"), floats(edges))
		d.SetKey(starlark.String("outside"), starlark.MakeInt(outside))
		return d, nil
	},
})

func nonEmpty(st *callState, name string, args starlark.Tuple, kw []starlark.Tuple) (tensor.Vector, error) {
	var x starlark.Value
	if err := unpack(name, args, kw, "x", &x); err != nil {
		return nil, err
	}
	v, err := st.toVector(x, "x")
	if err != nil {
		return nil, err
	}
	if len(v) == 0 {
		return nil, fmt.Errorf("no values")
	}
	return v, nil
}

func withDdof(st *callState, name string, args starlark.Tuple, kw []starlark.Tuple) (tensor.Vector, int, error) {
	var x starlark.Value
	ddof := 0
	if err := unpack(name, args, kw, "x", &x, "ddof?", &ddof); err != nil {
		return nil, 0, err
	}
	v, err := st.toVector(x, "x")
	if err != nil {
		return nil, 0, err
	}
	if ddof < 0 || len(v) <= ddof {
		return nil, 0, fmt.Errorf("%d values with ddof=%d leave no degrees of freedom", len(v), ddof)
	}
	return v, ddof, nil
}

// variance is Σ(x−mean)²/(n−ddof), two passes in index order.
func variance(v tensor.Vector, ddof int) float64 {
	m := tensor.Mean(v)
	s := 0.0
	for _, x := range v {
		d := x - m
		s += float64(d * d)
	}
	return s / float64(len(v)-ddof)
}

// quantile interpolates linearly between order statistics (NumPy's default,
// Hyndman and Fan type 7) on sorted data.
func quantile(sorted []float64, q float64) (float64, error) {
	if !(q >= 0 && q <= 1) {
		return 0, fmt.Errorf("q must be in [0, 1], got %v", q)
	}
	h := float64(float64(len(sorted)-1) * q)
	lo := int(math.Floor(h))
	if lo >= len(sorted)-1 {
		return sorted[len(sorted)-1], nil
	}
	frac := h - float64(lo)
	return sorted[lo] + float64(frac*(sorted[lo+1]-sorted[lo])), nil
}

// maxBins bounds a histogram's size.
const maxBins = 1 << 20

// histogram counts values in bins equal-width bins over [lo, hi]; the last
// bin includes hi. Values outside (and NaN) are counted in outside.
func histogram(v tensor.Vector, bins int, lo, hi float64) (edges []float64, counts []int, outside int, err error) {
	if bins < 1 || bins > maxBins {
		return nil, nil, 0, fmt.Errorf("bins must be between 1 and %d, got %d", maxBins, bins)
	}
	if !(lo < hi) || !finite(lo) || !finite(hi) {
		return nil, nil, 0, fmt.Errorf("need finite lo < hi, got [%v, %v]", lo, hi)
	}
	edges = make([]float64, bins+1)
	width := hi - lo
	for i := range edges {
		edges[i] = lo + float64(width*float64(i)/float64(bins))
	}
	edges[bins] = hi
	counts = make([]int, bins)
	for _, x := range v {
		if !(x >= lo && x <= hi) {
			outside++
			continue
		}
		b := int(float64((x-lo)/width) * float64(bins))
		if b >= bins {
			b = bins - 1
		}
		counts[b]++
	}
	return edges, counts, outside, nil
}
