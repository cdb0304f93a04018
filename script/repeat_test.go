package script

import (
	"context"
	"reflect"
	"testing"

	"github.com/scellis/scellis/diag"
)

// One step may not allocate past the budget: repetition reserves its result
// before it is built (the issue's [0] * (1 << 27) with memory_mb 256).
func TestRepetitionReservedBeforeItAllocates(t *testing.T) {
	for _, src := range []string{
		"def f():\n    return len([0] * (1 << 27))\n",
		"def f():\n    return len((1 << 27) * [0])\n",
		"def f():\n    return len(\"x\" * (1 << 29))\n",
		"def f():\n    return len((0,) * (1 << 27))\n",
		"def f():\n    x = [0]\n    x *= 1 << 27\n    return len(x)\n",
		"def f():\n    d = {\"a\": [0]}\n    d[\"a\"] *= 1 << 27\n    return 0\n",
		"def f():\n    return [len(y) for y in [[1] * (1 << 27)]]\n",
		"def f(n = len([0] * (1 << 27))):\n    return n\n",
	} {
		env := Env{Limits: Limits{MemoryBytes: 256 << 20}}
		_, err := Call(context.Background(), env, entry(t, "prog.star", src), "f")
		d := wantDiag(t, err, diag.MemoryBudget)
		wantPos(t, d, "prog.star", 0, 0)
	}
}

// The rewrite keeps what multiplication means.
func TestRepetitionRewriteKeepsSemantics(t *testing.T) {
	got, err := run(t, `
def double(x):
    x *= 2
    return x

def f():
    a = [1, 2] * 2
    s = 3 * "ab"
    n = 6 * 7
    f = 1.5 * 2
    l = [0]
    l[0] *= 5
    t = tuple([1]) * 2
    return [a, s, n, f, l, t, double(21), [i * i for i in range(4)], (lambda k = 2 * 3: k)()]
`, "f")
	if err != nil {
		t.Fatal(err)
	}
	want := []any{[]any{int64(1), int64(2), int64(1), int64(2)}, "ababab", int64(42), 3.0, []any{int64(0)}, []any{int64(1), int64(1)}, int64(42), []any{int64(0), int64(1), int64(4), int64(9)}, int64(6)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v\nwant %#v", got, want)
	}
	_, err = run(t, "def f():\n    return {} * 2\n", "f")
	d := wantDiag(t, err, diag.StarlarkRuntime)
	wantPos(t, d, "prog.star", 2, 0)
}
