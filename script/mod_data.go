package script

import (
	"fmt"

	"go.starlark.net/starlark"

	"github.com/scellis/scellis/model"
)

// datasetValue is a *model.Dataset inside Starlark: an opaque, read-only
// handle with attributes rows, dims, features and label.
type datasetValue struct {
	d        *model.Dataset
	borrowed bool // an input the engine lent: not charged to the call
}

var _ starlark.HasAttrs = (*datasetValue)(nil)

func (d *datasetValue) String() string {
	return fmt.Sprintf("dataset(%q, %d rows × %d features)", d.d.Name, d.d.Rows(), d.d.Dims())
}
func (d *datasetValue) Type() string          { return "dataset" }
func (d *datasetValue) Freeze()               {}
func (d *datasetValue) Truth() starlark.Bool  { return d.d.Rows() > 0 }
func (d *datasetValue) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: dataset") }
func (d *datasetValue) AttrNames() []string   { return []string{"dims", "features", "label", "rows"} }
func (d *datasetValue) Attr(name string) (starlark.Value, error) {
	switch name {
	case "rows":
		return starlark.MakeInt(d.d.Rows()), nil
	case "dims":
		return starlark.MakeInt(d.d.Dims()), nil
	case "label":
		return starlark.String(d.d.Label), nil
	case "features":
		fs := make([]starlark.Value, len(d.d.Features))
		for i, f := range d.d.Features {
			fs[i] = starlark.String(f)
		}
		return starlark.NewList(fs), nil
	}
	return nil, nil
}

func (d *datasetValue) ownedBytes() uint64 {
	if d.borrowed {
		return 0
	}
	return 64 + bytesOf2(d.d.Rows(), d.d.Dims()+1)
}

// datasetBytes is what a copy of d's rows takes.
func datasetBytes(d *model.Dataset) uint64 { return bytesOf2(d.Rows(), d.Dims()+1) }

func (st *callState) toDataset(v starlark.Value, what string) (*model.Dataset, error) {
	d, ok := v.(*datasetValue)
	if !ok {
		return nil, fmt.Errorf("%s must be a dataset (an input of the job), got %s", what, v.Type())
	}
	return d.d, nil
}

func datasetArg(st *callState, name string, args starlark.Tuple, kw []starlark.Tuple) (*model.Dataset, error) {
	var x starlark.Value
	if err := unpack(name, args, kw, "ds", &x); err != nil {
		return nil, err
	}
	return st.toDataset(x, "ds")
}

func pair(a, b *model.Dataset) starlark.Value {
	return starlark.Tuple{&datasetValue{d: a}, &datasetValue{d: b}}
}

// dataModule binds package model's dataset operations. Datasets are
// immutable handles: every operation returns new ones.
var dataModule = makeModule("data", map[string]nativeFunc{
	"rows": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		d, err := datasetArg(st, "data.rows", args, kw)
		if err != nil {
			return nil, err
		}
		return starlark.MakeInt(d.Rows()), nil
	},
	"dims": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		d, err := datasetArg(st, "data.dims", args, kw)
		if err != nil {
			return nil, err
		}
		return starlark.MakeInt(d.Dims()), nil
	},
	"classes": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		d, err := datasetArg(st, "data.classes", args, kw)
		if err != nil {
			return nil, err
		}
		cs := d.Classes()
		if err := st.reserve(listBytes+uint64(len(cs))*(slotBytes+floatBytes), "data.classes"); err != nil {
			return nil, err
		}
		return floats(cs), nil
	},
	"split": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		var frac num
		var seed uint64
		if err := unpack("data.split", args, kw, "ds", &x, "test_frac", &frac, "seed", &seed); err != nil {
			return nil, err
		}
		d, err := st.toDataset(x, "ds")
		if err != nil {
			return nil, err
		}
		if err := st.reserve(datasetBytes(d), "data.split"); err != nil {
			return nil, err
		}
		train, test, err := model.Split(d, float64(frac), seed)
		if err != nil {
			return nil, modelError(err)
		}
		return pair(train, test), nil
	},
	"kfold": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var x starlark.Value
		var k, fold int
		var seed uint64
		stratify := false
		if err := unpack("data.kfold", args, kw, "ds", &x, "k", &k, "fold", &fold, "seed", &seed, "stratify?", &stratify); err != nil {
			return nil, err
		}
		d, err := st.toDataset(x, "ds")
		if err != nil {
			return nil, err
		}
		if err := st.reserve(datasetBytes(d), "data.kfold"); err != nil {
			return nil, err
		}
		train, test, err := model.KFold(d, k, fold, seed, stratify)
		if err != nil {
			return nil, modelError(err)
		}
		return pair(train, test), nil
	},
	"standardize": func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var a, b starlark.Value
		if err := unpack("data.standardize", args, kw, "train", &a, "test", &b); err != nil {
			return nil, err
		}
		train, err := st.toDataset(a, "train")
		if err != nil {
			return nil, err
		}
		test, err := st.toDataset(b, "test")
		if err != nil {
			return nil, err
		}
		if train.Dims() != test.Dims() {
			return nil, fmt.Errorf("train has %d features but test has %d", train.Dims(), test.Dims())
		}
		if err := st.reserve(datasetBytes(train)+datasetBytes(test), "data.standardize"); err != nil {
			return nil, err
		}
		s := model.FitStandardizer(train)
		return pair(s.Apply(train), s.Apply(test)), nil
	},
})
