package fl

import (
	"context"
	"testing"

	"gonum.org/v1/gonum/mat"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/datagen"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/script"
)

func builtins(t testing.TB) *catalog.Catalog {
	t.Helper()
	c, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func load(t testing.TB, c *catalog.Catalog, ref string, params map[string]any) *Strategy {
	t.Helper()
	s, err := Load(c, ref, "", params)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func simulate(t testing.TB, c *catalog.Catalog, s *Strategy, sites []*model.Dataset, rounds int, opts SimOptions) History {
	t.Helper()
	opts.Env = script.Env{Catalog: c}
	h, err := Simulate(context.Background(), s, sites, rounds, opts)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// hospitalSplits generates n hospital sites, splits each into train and
// test, and standardises every split with statistics of the pooled training
// rows (the federation agrees on them beforehand, e.g. with a secure-sum
// job). It returns the per-site training sets, and the pooled train and
// test sets.
func hospitalSplits(t testing.TB, n, rows int, seed uint64) (train []*model.Dataset, pooledTrain, pooledTest *model.Dataset) {
	t.Helper()
	sites, err := datagen.Hospitals(n, rows, seed)
	if err != nil {
		t.Fatal(err)
	}
	var tests []*model.Dataset
	for i, s := range sites {
		tr, te, err := model.Split(s.Data, 0.25, seed+uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		train = append(train, tr)
		tests = append(tests, te)
	}
	pooledTrain, pooledTest = pool(train), pool(tests)
	std := model.FitStandardizer(pooledTrain)
	for i := range train {
		train[i] = std.Apply(train[i])
	}
	return train, std.Apply(pooledTrain), std.Apply(pooledTest)
}

// pool concatenates datasets.
func pool(ds []*model.Dataset) *model.Dataset {
	var idx []int
	out := ds[0].Subset(idx)
	x := []float64{}
	for _, d := range ds {
		for i := range d.Rows() {
			x = append(x, d.Row(i)...)
		}
		out.Y = append(out.Y, d.Y...)
	}
	out.Name = "pooled"
	out.X = mat.NewDense(len(out.Y), ds[0].Dims(), x)
	return out
}

func siteData(sites []datagen.Site) []*model.Dataset {
	out := make([]*model.Dataset, len(sites))
	for i, s := range sites {
		out[i] = s.Data
	}
	return out
}
