package fl

import (
	"context"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/script"
)

func TestUpdateDims(t *testing.T) {
	c, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	env := script.Env{Catalog: c}
	for name, want := range map[string]int{"fedavg": 5, "fedprox": 5, "scaffold": 10} {
		s, err := Load(c, name, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		g, err := Init(context.Background(), env, s, 4)
		if err != nil {
			t.Fatal(err)
		}
		n, err := UpdateDims(context.Background(), env, s, g)
		if err != nil || n != want {
			t.Errorf("%s: UpdateDims = %d, %v; want %d", name, n, err, want)
		}
	}
}
