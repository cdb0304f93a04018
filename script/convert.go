package script

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"

	"go.starlark.net/starlark"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/tensor"
)

// maxDepth bounds the nesting of values crossing the sandbox boundary, well
// inside the canonical decoder's limit, and stops a self-containing list.
const maxDepth = 48

// Result size limits, matching what package content's decoder accepts, so a
// result one peer returns can be decoded by every other.
const (
	maxResultElements = 1 << 24 // elements of one list or vector
	maxResultPairs    = 1 << 20 // entries of one dict
)

func tooLarge(path, what string, n, limit int) error {
	return diag.New(diag.ShardBudgetLimits, "", "%s with %d elements at %s; the limit is %d", what, n, path, limit).
		WithHelp("return summaries (metrics, histograms) rather than raw data")
}

// toStarlarkValue converts a Go value for content:
//
//	nil → None; bool → bool; any integer → int; float32/64 → float;
//	string → string; []any and other slices → list; map[string]any (and
//	maps with string keys, as a CBOR decoder produces) → dict with its keys
//	inserted in sorted order; []float64 and tensor.Vector → tensor vector
//	(shared, read-only); *tensor.Matrix → matrix (shared, read-only);
//	*model.Dataset → dataset handle (shared, read-only).
//
// Vectors, matrices and datasets are lent, not copied: content cannot
// modify them, and the memory guard does not charge them to the call.
func toStarlarkValue(v any) (starlark.Value, error) { return toStarlark(v, 0) }

func toStarlark(v any, depth int) (starlark.Value, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("value nested deeper than %d levels", maxDepth)
	}
	switch x := v.(type) {
	case nil:
		return starlark.None, nil
	case starlark.Value:
		return x, nil
	case bool:
		return starlark.Bool(x), nil
	case int:
		return starlark.MakeInt(x), nil
	case int64:
		return starlark.MakeInt64(x), nil
	case uint64:
		return starlark.MakeUint64(x), nil
	case float64:
		return starlark.Float(x), nil
	case string:
		return starlark.String(x), nil
	case tensor.Vector:
		return &vectorValue{data: x, borrowed: true}, nil
	case []float64:
		return &vectorValue{data: x, borrowed: true}, nil
	case *tensor.Matrix:
		if err := x.Validate(); err != nil {
			return nil, err
		}
		return &matrixValue{m: x, borrowed: true}, nil
	case *model.Dataset:
		if x == nil {
			return starlark.None, nil
		}
		return &datasetValue{d: x, borrowed: true}, nil
	case []any:
		elems := make([]starlark.Value, len(x))
		for i, e := range x {
			sv, err := toStarlark(e, depth+1)
			if err != nil {
				return nil, err
			}
			elems[i] = sv
		}
		return starlark.NewList(elems), nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := starlark.NewDict(len(keys))
		for _, k := range keys {
			sv, err := toStarlark(x[k], depth+1)
			if err != nil {
				return nil, err
			}
			d.SetKey(starlark.String(k), sv)
		}
		return d, nil
	}
	return reflectToStarlark(reflect.ValueOf(v), depth)
}

// reflectToStarlark handles the other integer, float, slice and map types
// (for example []string, map[any]any from a CBOR decoder).
func reflectToStarlark(rv reflect.Value, depth int) (starlark.Value, error) {
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return starlark.MakeInt64(rv.Int()), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return starlark.MakeUint64(rv.Uint()), nil
	case reflect.Float32, reflect.Float64:
		return starlark.Float(rv.Float()), nil
	case reflect.String:
		return starlark.String(rv.String()), nil
	case reflect.Bool:
		return starlark.Bool(rv.Bool()), nil
	case reflect.Slice, reflect.Array:
		elems := make([]starlark.Value, rv.Len())
		for i := range elems {
			sv, err := toStarlark(rv.Index(i).Interface(), depth+1)
			if err != nil {
				return nil, err
			}
			elems[i] = sv
		}
		return starlark.NewList(elems), nil
	case reflect.Map:
		type kv struct {
			k string
			v reflect.Value
		}
		var kvs []kv
		it := rv.MapRange()
		for it.Next() {
			k := it.Key()
			for k.Kind() == reflect.Interface && !k.IsNil() {
				k = k.Elem()
			}
			if k.Kind() != reflect.String {
				return nil, fmt.Errorf("map key %v is a %s, want a string", k, k.Kind())
			}
			kvs = append(kvs, kv{k.String(), it.Value()})
		}
		sort.Slice(kvs, func(i, j int) bool { return kvs[i].k < kvs[j].k })
		d := starlark.NewDict(len(kvs))
		for _, p := range kvs {
			sv, err := toStarlark(p.v.Interface(), depth+1)
			if err != nil {
				return nil, err
			}
			d.SetKey(starlark.String(p.k), sv)
		}
		return d, nil
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return starlark.None, nil
		}
		return toStarlark(rv.Elem().Interface(), depth)
	case reflect.Invalid:
		return starlark.None, nil
	}
	return nil, fmt.Errorf("cannot hand a %s to content", rv.Type())
}

// fromStarlarkValue converts a content result to plain Go values that encode
// canonically and render as JSON:
//
//	None → nil; bool; int → int64; float → float64; string; list and tuple
//	→ []any; dict with string keys → map[string]any; vector → []float64;
//	matrix → [][]float64.
//
// NaN or ±Inf anywhere is diag.NonFinite naming the place (result["auc"]);
// an int beyond int64, a dict key that is not a string, any other type, or
// nesting deeper than 48 levels is diag.ContentShape; a list or vector of
// more than 2^24 elements, or a dict of more than 2^20 entries (what the
// canonical decoder accepts), is diag.ShardBudgetLimits.
func fromStarlarkValue(v starlark.Value) (any, error) { return fromStarlark(v, "result", 0) }

// Describe names the type of a value Call returned, for diagnostics that
// say what content gave instead of what it should: "a dict", "an int".
func Describe(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case map[string]any:
		return "a dict"
	case []any:
		return "a list"
	case string:
		return "a string"
	case int64:
		return "an int"
	case float64:
		return "a float"
	case bool:
		return "a bool"
	}
	return fmt.Sprintf("%T", v)
}

func fromStarlark(v starlark.Value, path string, depth int) (any, error) {
	if depth > maxDepth {
		return nil, diag.New(diag.ContentShape, "", "a value nested deeper than %d levels at %s (does a list contain itself?)", maxDepth, path)
	}
	switch x := v.(type) {
	case starlark.NoneType:
		return nil, nil
	case starlark.Bool:
		return bool(x), nil
	case starlark.Int:
		n, ok := x.Int64()
		if !ok {
			return nil, diag.New(diag.ContentShape, "", "an int too large for 64 bits at %s", path).
				WithHelp("return it as a float or a string")
		}
		return n, nil
	case starlark.Float:
		f := float64(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, nonFinite(path, f)
		}
		return f, nil
	case starlark.String:
		return string(x), nil
	case *starlark.List:
		if x.Len() > maxResultElements {
			return nil, tooLarge(path, "a list", x.Len(), maxResultElements)
		}
		out := make([]any, x.Len())
		for i := range out {
			e, err := fromStarlark(x.Index(i), path+"["+strconv.Itoa(i)+"]", depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = e
		}
		return out, nil
	case starlark.Tuple:
		if len(x) > maxResultElements {
			return nil, tooLarge(path, "a tuple", len(x), maxResultElements)
		}
		out := make([]any, len(x))
		for i := range out {
			e, err := fromStarlark(x[i], path+"["+strconv.Itoa(i)+"]", depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = e
		}
		return out, nil
	case *starlark.Dict:
		if x.Len() > maxResultPairs {
			return nil, tooLarge(path, "a dict", x.Len(), maxResultPairs)
		}
		out := make(map[string]any, x.Len())
		for _, item := range x.Items() {
			k, ok := item[0].(starlark.String)
			if !ok {
				return nil, diag.New(diag.ContentShape, "", "a dict key %s (a %s) at %s; result dicts need string keys", item[0], item[0].Type(), path).
					WithHelp("convert the key with str()")
			}
			e, err := fromStarlark(item[1], path+"["+strconv.Quote(string(k))+"]", depth+1)
			if err != nil {
				return nil, err
			}
			out[string(k)] = e
		}
		return out, nil
	case *vectorValue:
		if len(x.data) > maxResultElements {
			return nil, tooLarge(path, "a vector", len(x.data), maxResultElements)
		}
		if i := tensor.FirstNonFinite(x.data); i >= 0 {
			return nil, nonFinite(path+"["+strconv.Itoa(i)+"]", x.data[i])
		}
		if x.borrowed {
			return []float64(x.data.Clone()), nil
		}
		return []float64(x.data), nil
	case *matrixValue:
		if x.m.Rows > maxResultElements || x.m.Cols > maxResultElements {
			return nil, tooLarge(path, "a matrix", max(x.m.Rows, x.m.Cols), maxResultElements)
		}
		if i := tensor.FirstNonFinite(x.m.Data); i >= 0 {
			return nil, nonFinite(fmt.Sprintf("%s[%d][%d]", path, i/x.m.Cols, i%x.m.Cols), x.m.Data[i])
		}
		return x.m.ToRows(), nil
	}
	return nil, diag.New(diag.ContentShape, "", "a %s at %s, which cannot be a result", v.Type(), path).
		WithHelp("results are None, bools, ints, floats, strings, lists, dicts with string keys, vectors and matrices; summarise datasets and models as numbers")
}

func nonFinite(path string, f float64) *diag.Diagnostic {
	return diag.New(diag.NonFinite, "", "%v at %s", f, path).
		WithHelp("results must be finite; check the learning rate, the data, or a division by zero")
}
