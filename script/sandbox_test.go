package script

import (
	"context"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/tensor"
)

func TestConvertRoundTrip(t *testing.T) {
	in := map[string]any{
		"none": nil, "t": true, "i": 3, "i64": int64(-4), "u64": uint64(1 << 40), "f": 1.5, "s": "x",
		"list": []any{1, "a", []any{2.5}},
		"vec":  []float64{1, 2}, "tv": tensor.Vector{3},
		"mat":  &tensor.Matrix{Rows: 2, Cols: 2, Data: []float64{1, 2, 3, 4}},
		"strs": []string{"p", "q"},
		"cbor": map[any]any{"k": uint64(7)},
	}
	got, err := run(t, "def f(x):\n    return x\n", "f", in)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"none": nil, "t": true, "i": int64(3), "i64": int64(-4), "u64": int64(1 << 40), "f": 1.5, "s": "x",
		"list": []any{int64(1), "a", []any{2.5}},
		"vec":  []float64{1, 2}, "tv": []float64{3},
		"mat":  [][]float64{{1, 2}, {3, 4}},
		"strs": []any{"p", "q"},
		"cbor": map[string]any{"k": int64(7)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip\n got %#v\nwant %#v", got, want)
	}
	// A vector lent by the engine comes back as a copy.
	v := []float64{1, 2}
	out, _ := run(t, "def f(x):\n    return x\n", "f", v)
	out.([]float64)[0] = 9
	if v[0] != 1 {
		t.Fatal("a returned vector aliases the argument")
	}
	// Dict keys are inserted in sorted order, so iteration is deterministic.
	keys, _ := run(t, "def f(d):\n    return list(d.keys())\n", "f", map[string]any{"b": 1, "a": 2, "c": 3})
	if !reflect.DeepEqual(keys, []any{"a", "b", "c"}) {
		t.Fatalf("dict keys in order %v", keys)
	}
}

func TestSyntaxErrorPositioned(t *testing.T) {
	_, err := catalog.Parse("bad.star", []byte("def run(params, inputs):\n    return (1 +\n\ndef x(:\n"))
	d := wantDiag(t, err, diag.StarlarkSyntax)
	if d.Pos == nil || d.Pos.File != "bad.star" || d.Pos.Line == 0 || d.Pos.Col == 0 {
		t.Fatalf("syntax error not positioned: %v", d.Error())
	}
	// An undefined name is found when the sandbox compiles the file.
	e := entry(t, "undef.star", "def run(params, inputs):\n    return nosuch(1)\n")
	_, err = Call(context.Background(), Env{}, e, "run", nil, nil)
	d = wantDiag(t, err, diag.StarlarkSyntax)
	wantPos(t, d, "undef.star", 2, 12)
	if !strings.Contains(d.Message, "undefined: nosuch") || d.Source != "    return nosuch(1)" {
		t.Fatalf("message %q source %q", d.Message, d.Source)
	}
}

func TestRuntimeErrorAtInnermostContentFrame(t *testing.T) {
	c := catalog.New()
	lib := entry(t, "lib/helpers.star", `
def divide(a, b):
    return a // b
`)
	if err := c.Add(lib); err != nil {
		t.Fatal(err)
	}
	prog := entry(t, "user/prog.star", `
load("helpers", "divide")

def run(params, inputs):
    return divide(1, params["b"])
`)
	_, err := Call(context.Background(), Env{Catalog: c}, prog, "run", map[string]any{"b": 0}, nil)
	d := wantDiag(t, err, diag.StarlarkRuntime)
	wantPos(t, d, "lib/helpers.star", 2, 14)
	for _, want := range []string{"floored division by zero", "Traceback", "user/prog.star:4:18: in run", "lib/helpers.star:2:14: in divide"} {
		if !strings.Contains(d.Message, want) {
			t.Errorf("message lacks %q:\n%s", want, d.Message)
		}
	}
	if d.Source != "    return a // b" {
		t.Errorf("source line %q", d.Source)
	}
	// fail() inside a native's callback still points at content.
	_, err = run(t, "def run(p, i):\n    x = 1\n    fail(\"bad input\")\n", "run", nil, nil)
	d = wantDiag(t, err, diag.StarlarkRuntime)
	wantPos(t, d, "prog.star", 3, 9)
}

func TestStepBudget(t *testing.T) {
	e := entry(t, "loop.star", `
def run(params, inputs):
    n = 0
    for i in range(1000000000):
        n += i
    return n
`)
	_, err := Call(context.Background(), Env{Limits: Limits{Steps: 200_000}}, e, "run", nil, nil)
	d := wantDiag(t, err, diag.StepBudget)
	wantPos(t, d, "loop.star", 4, 0)
	if !strings.Contains(d.Message, "200000") {
		t.Fatalf("message %q", d.Message)
	}
	// The module's top level counts too, and a budget exactly large enough passes.
	small := entry(t, "small.star", "def run(p, i):\n    return len([x for x in range(10)])\n")
	if _, err := Call(context.Background(), Env{Limits: Limits{Steps: 1000}}, small, "run", nil, nil); err != nil {
		t.Fatal(err)
	}
}

func TestMemoryGuardNativeReservation(t *testing.T) {
	e := entry(t, "big.star", "def run(p, i):\n    return tensor.zeros(p[\"n\"])\n")
	env := Env{Limits: Limits{MemoryBytes: 8 << 20}}
	_, err := Call(context.Background(), env, e, "run", map[string]any{"n": 100_000_000}, nil)
	d := wantDiag(t, err, diag.MemoryBudget)
	wantPos(t, d, "big.star", 2, 24)
	if _, err := Call(context.Background(), env, e, "run", map[string]any{"n": 1000}, nil); err != nil {
		t.Fatal(err)
	}
	// Vectors kept alive accumulate: the tenth 1 MiB vector is refused.
	keep := entry(t, "keep.star", `
def run(p, i):
    kept = []
    for k in range(100):
        kept.append(tensor.ones(131072))
    return len(kept)
`)
	_, err = Call(context.Background(), env, keep, "run", nil, nil)
	wantDiag(t, err, diag.MemoryBudget)
	// Garbage does not: the same allocations dropped at once pass.
	drop := entry(t, "drop.star", `
def run(p, i):
    s = 0.0
    for k in range(100):
        s += tensor.sum(tensor.ones(131072))
    return s
`)
	if _, err := Call(context.Background(), env, drop, "run", nil, nil); err != nil {
		t.Fatal(err)
	}
	// A sized built-in is refused before it materialises.
	_, err = run(t, "def run(p, i):\n    return len(list(range(1000000000)))\n", "run", nil, nil)
	d = wantDiag(t, err, diag.MemoryBudget)
	if !strings.Contains(d.Message, "list() of 1000000000 elements") {
		t.Fatalf("message %q", d.Message)
	}
}

func TestMemoryGuardAudit(t *testing.T) {
	// A list grown element by element in Starlark: no native allocates, the
	// scheduled audit finds it.
	e := entry(t, "grow.star", `
def run(p, i):
    l = []
    for k in range(10000000):
        l.append(float(k))
    return len(l)
`)
	_, err := Call(context.Background(), Env{Limits: Limits{MemoryBytes: 4 << 20}}, e, "run", nil, nil)
	d := wantDiag(t, err, diag.MemoryBudget)
	wantPos(t, d, "grow.star", 0, 0)
	if !strings.Contains(d.Message, "values it holds") {
		t.Fatalf("message %q", d.Message)
	}
}

func TestMemoryGuardBackstop(t *testing.T) {
	old := backstopSlack
	backstopSlack = 1 << 20
	defer func() { backstopSlack = old }()
	// A comprehension's list lives on the operand stack until it is
	// complete: audits cannot see it, the heap backstop can.
	e := entry(t, "comp.star", `
def run(p, i):
    return len([float(k) for k in range(20000000)])
`)
	runtime.GC()
	_, err := Call(context.Background(), Env{Limits: Limits{MemoryBytes: 4 << 20}}, e, "run", nil, nil)
	d := wantDiag(t, err, diag.MemoryBudget)
	if !strings.Contains(d.Message, "process heap grew") {
		t.Fatalf("message %q", d.Message)
	}
}

// One step can allocate as much as the call holds (s + s, str.replace):
// a loop of a few hundred steps reaches any budget before the first
// checkpoint (every 16384 steps). The timed heap watch stops it.
func TestMemoryGuardHeapWatch(t *testing.T) {
	old := backstopSlack
	backstopSlack = 1 << 20
	defer func() { backstopSlack = old }()
	e := entry(t, "double.star", `
def run(p, i):
    s = "x"
    for k in range(26):
        s = s + s
    n = 0
    for k in range(20):
        n += len(s.replace("x", "y"))
    return n
`)
	runtime.GC()
	_, err := Call(context.Background(), Env{Limits: Limits{MemoryBytes: 4 << 20}}, e, "run", nil, nil)
	d := wantDiag(t, err, diag.MemoryBudget)
	if !strings.Contains(d.Message, "process heap grew") {
		t.Fatalf("message %q", d.Message)
	}
}

func TestForbiddenLoad(t *testing.T) {
	c := builtins(t)
	for _, tc := range []struct {
		name string
		env  Env
		src  string
	}{
		{"not in catalog", Env{Catalog: c}, "load(\"nosuch\", \"x\")\ndef run(p, i):\n    return 1\n"},
		{"path", Env{Catalog: c}, "load(\"./helpers.star\", \"x\")\ndef run(p, i):\n    return 1\n"},
		{"no catalog", Env{}, "load(\"numeric\", \"add\")\ndef run(p, i):\n    return 1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Call(context.Background(), tc.env, entry(t, "l.star", tc.src), "run", nil, nil)
			d := wantDiag(t, err, diag.ForbiddenLoad)
			wantPos(t, d, "l.star", 1, 1)
		})
	}
	// A catalog entry loads by name and by ref.
	numeric := lookup(t, c, "numeric")
	for _, mod := range []string{"numeric", string(numeric.Ref)} {
		src := "load(\"" + mod + "\", \"add\")\ndef run(p, i):\n    return add(1, 2)\n"
		got, err := Call(context.Background(), Env{Catalog: c}, entry(t, "ok.star", src), "run", nil, nil)
		if err != nil || got != int64(3) {
			t.Fatalf("load %s: %v %v", mod, got, err)
		}
	}
	// A load cycle is refused, not a hang.
	cyc := catalog.New()
	a := entry(t, "a.star", "load(\"b\", \"y\")\nx = 1\n")
	b := entry(t, "b.star", "load(\"a\", \"x\")\ny = 2\n")
	cyc.Add(a)
	cyc.Add(b)
	_, err := Call(context.Background(), Env{Catalog: cyc}, entry(t, "p.star", "load(\"a\", \"x\")\ndef run(p, i):\n    return x\n"), "run", nil, nil)
	d := wantDiag(t, err, diag.ForbiddenLoad)
	if !strings.Contains(d.Message, "cycle") {
		t.Fatalf("message %q", d.Message)
	}
}

func TestResultShape(t *testing.T) {
	for _, tc := range []struct {
		src  string
		code diag.Code
		want string
	}{
		{`return {"auc": float("nan")}`, diag.NonFinite, `result["auc"]`},
		{`return {"w": tensor.vec([1, 2, float("inf")])}`, diag.NonFinite, `result["w"][2]`},
		{`return [1, {"m": tensor.mat([[1, 2], [3, float("-inf")]])}]`, diag.NonFinite, `result[1]["m"][1][1]`},
		{`return set([1])`, diag.ContentShape, `a set at result`},
		{`return {1: 2}`, diag.ContentShape, `dict key 1`},
		{`return 1 << 70`, diag.ContentShape, `too large`},
		{`return rng.stream(1)`, diag.ContentShape, `a rng at result`},
		{"l = []\n    l.append(l)\n    return l", diag.ContentShape, `nested deeper`},
	} {
		_, err := run(t, "def run(p, i):\n    "+tc.src+"\n", "run", nil, nil)
		d := wantDiag(t, err, tc.code)
		if !strings.Contains(d.Message, tc.want) {
			t.Errorf("%s: message %q lacks %q", tc.src, d.Message, tc.want)
		}
		wantPos(t, d, "prog.star", 1, 1)
	}
}

func TestMissingFunction(t *testing.T) {
	_, err := run(t, "def run(p, i):\n    return 1\n", "reduce", nil, nil)
	d := wantDiag(t, err, diag.MissingFunction)
	if !strings.Contains(d.Help, "run") {
		t.Fatalf("help %q", d.Help)
	}
	_, err = run(t, "reduce = 3\ndef run(p, i):\n    return 1\n", "reduce", nil, nil)
	wantDiag(t, err, diag.MissingFunction)
}

func TestNativeArgument(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"tensor.add([1, 2], [1, 2, 3])", "length 2 and 3"},
		{"tensor.vec(['a'])", "x[0] must be a number"},
		{"tensor.weighted_mean([[1], [2]], [1, -1])", "bad weights"},
		{"tensor.matmul([[1, 2]], [[1, 2]])", "product of 1×2 and 1×2"},
		{"stats.histogram([1], 0, 0, 1)", "bins"},
		{"stats.quantile([1, 2], 2)", "q must be in"},
		{"rng.int(0)", "positive"},
		{"tensor.reshape([1, 2, 3], 2, 2)", "cannot reshape"},
		// 2^32·2^32 wraps to 0 in int: an empty vector must not pass as a
		// 2^32×2^32 matrix.
		{"tensor.reshape([], 1 << 32, 1 << 32)", "cannot reshape"},
		{"tensor.reshape([], -1, 0)", "cannot reshape"},
	} {
		_, err := run(t, "def run(p, i):\n    return "+tc.src+"\n", "run", nil, nil)
		d := wantDiag(t, err, diag.NativeArgument)
		wantPos(t, d, "prog.star", 2, 0)
		if !strings.Contains(d.Message, tc.want) {
			t.Errorf("%s: message %q lacks %q", tc.src, d.Message, tc.want)
		}
	}
}

func TestCancellation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := entry(t, "spin.star", `
def run(p, i):
    print("started")
    n = 0
    for k in range(1000000000):
        n += k
    return n
`)
	env := Env{Print: func(string) { cancel() }} // cancel once the content runs
	_, err := Call(ctx, env, e, "run", nil, nil)
	d := wantDiag(t, err, diag.ContentCancelled)
	wantPos(t, d, "spin.star", 0, 0)
	_, err = Call(ctx, Env{}, e, "run", nil, nil)
	wantDiag(t, err, diag.ContentCancelled)
}

func TestDeterminism(t *testing.T) {
	src := `
def run(p, i):
    l = list(range(10))
    rng.shuffle(l)
    g = rng.stream(7)
    return {"u": rng.uniform(), "n": rng.normals(3), "i": rng.int(100), "l": l, "s": rng.seed(),
            "g": g.uniforms(2), "c": rng.choice(["a", "b", "c"]), "set": sorted(set([3, 1, 2]))}
`
	e := entry(t, "rand.star", src)
	call := func(seed string) any {
		v, err := Call(context.Background(), Env{Seed: []byte(seed)}, e, "run", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	a, b, c := call("shard-1"), call("shard-1"), call("shard-2")
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("same seed, different results:\n%v\n%v", a, b)
	}
	if reflect.DeepEqual(a, c) {
		t.Fatal("different seeds, same result")
	}
	// rng.stream(n) does not depend on the shard seed.
	if !reflect.DeepEqual(a.(map[string]any)["g"], c.(map[string]any)["g"]) {
		t.Fatal("rng.stream depends on the shard seed")
	}
	// Without a seed, rng refuses; rng.stream still works.
	_, err := Call(context.Background(), Env{}, e, "run", nil, nil)
	d := wantDiag(t, err, diag.NativeArgument)
	if !strings.Contains(d.Message, "no seed") {
		t.Fatalf("message %q", d.Message)
	}
	if _, err := Call(context.Background(), Env{}, entry(t, "s.star", "def run(p, i):\n    return rng.stream(1).normal()\n"), "run", nil, nil); err != nil {
		t.Fatal(err)
	}
}

// Content sees only the Starlark universe plus these names: nothing that
// reads files, the network, the clock or the environment.
func TestNoEffects(t *testing.T) {
	// "*" is the memory-checked multiplication every `a * b` compiles to
	// (repeat.go); content cannot name it.
	// check (comparisons and Freivalds) reads only what the verifier hands
	// it; tensor.fast_sum varies between calls only in the convergent tier.
	want := []string{"*", "check", "data", "enumerate", "list", "math", "model", "rng", "set", "sorted", "stats", "tensor", "tuple", "zip"}
	if got := predeclared.Keys(); !slices.Equal(got, want) {
		t.Fatalf("predeclared names %v, want %v", got, want)
	}
	for _, name := range []string{"open", "time", "os", "env", "getenv", "exec", "http", "json"} {
		src := "def run(p, i):\n    return " + name + "\n"
		_, err := run(t, src, "run", nil, nil)
		wantDiag(t, err, diag.StarlarkSyntax)
	}
	// print goes nowhere unless the engine asks for it.
	if _, err := run(t, "def run(p, i):\n    print('hello')\n    return 1\n", "run", nil, nil); err != nil {
		t.Fatal(err)
	}
	// Module globals are frozen: no state survives into the call.
	_, err := run(t, "CACHE = {}\ndef run(p, i):\n    CACHE['x'] = 1\n", "run", nil, nil)
	d := wantDiag(t, err, diag.StarlarkRuntime)
	if !strings.Contains(d.Message, "frozen") {
		t.Fatalf("message %q", d.Message)
	}
	// Recursion is off.
	_, err = run(t, "def f(n):\n    return f(n - 1) if n else 0\ndef run(p, i):\n    return f(3)\n", "run", nil, nil)
	d = wantDiag(t, err, diag.StarlarkRuntime)
	if !strings.Contains(d.Message, "recursive") {
		t.Fatalf("message %q", d.Message)
	}
}

func TestTensorModule(t *testing.T) {
	got, err := run(t, `
def run(p, i):
    v = tensor.vec([1, 2, 3])
    w = tensor.vec(p["w"])
    m = tensor.mat([[1, 2], [3, 4]])
    return {
        "add": tensor.add(v, w), "sub": v - w, "mul": tensor.mul(v, w), "scale": 2 * v, "div": v / 2,
        "axpy": tensor.axpy(2, v, w), "dot": tensor.dot(v, w), "norm": tensor.norm(tensor.vec([3, 4])),
        "sum": tensor.sum(v), "mean": tensor.mean(v), "mean_vecs": tensor.mean([v, w]),
        "wmean": tensor.weighted_mean([v, w], [1, 3]), "len": len(v), "idx": v[1], "slice": v[1:],
        "iter": [x for x in v], "neg": -v, "eq": v == tensor.vec([1, 2, 3]),
        "matmul": tensor.matmul(m, m), "matvec": tensor.matmul(m, tensor.vec([1, 1])),
        "rows": tensor.rows(m), "cols": m.cols, "get": tensor.get(m, 1, 0), "row": m[1],
        "t": tensor.transpose(m), "block": tensor.block(m, 0, 1, 1, 2), "tolist": tensor.tolist(m),
        "reshape": tensor.reshape([1, 2, 3, 4, 5, 6], 2, 3), "concat": tensor.concat([v, [9]]),
        "count_le": tensor.count_le(v, 2), "zeros": tensor.zeros(2), "ones": tensor.ones(1),
    }
`, "run", map[string]any{"w": []float64{4, 5, 6}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"add": []float64{5, 7, 9}, "sub": []float64{-3, -3, -3}, "mul": []float64{4, 10, 18}, "scale": []float64{2, 4, 6},
		"div": []float64{0.5, 1, 1.5}, "axpy": []float64{6, 9, 12}, "dot": 32.0, "norm": 5.0, "sum": 6.0, "mean": 2.0,
		"mean_vecs": []float64{2.5, 3.5, 4.5}, "wmean": []float64{3.25, 4.25, 5.25}, "len": int64(3), "idx": 2.0,
		"slice": []float64{2, 3}, "iter": []any{1.0, 2.0, 3.0}, "neg": []float64{-1, -2, -3}, "eq": true,
		"matmul": [][]float64{{7, 10}, {15, 22}}, "matvec": []float64{3, 7}, "rows": int64(2), "cols": int64(2),
		"get": 3.0, "row": []float64{3, 4}, "t": [][]float64{{1, 3}, {2, 4}}, "block": [][]float64{{2}},
		"tolist": []any{[]any{1.0, 2.0}, []any{3.0, 4.0}}, "reshape": [][]float64{{1, 2, 3}, {4, 5, 6}},
		"concat": []float64{1, 2, 3, 9}, "count_le": int64(2), "zeros": []float64{0, 0}, "ones": []float64{1},
	}
	g := got.(map[string]any)
	for k, w := range want {
		if !reflect.DeepEqual(g[k], w) {
			t.Errorf("%s = %#v, want %#v", k, g[k], w)
		}
	}
	// Vectors are immutable.
	_, err = run(t, "def run(p, i):\n    v = tensor.zeros(2)\n    v[0] = 1\n", "run", nil, nil)
	wantDiag(t, err, diag.StarlarkRuntime)
}

func TestStatsModule(t *testing.T) {
	got, err := run(t, `
def run(p, i):
    x = [1, 2, 3, 4]
    return {"mean": stats.mean(x), "var": stats.var(x), "var1": stats.var(x, ddof=1), "std": stats.std(tensor.vec(x)),
            "q": stats.quantile(x, 0.5), "qs": stats.quantile(x, [0, 1]),
            "h": stats.histogram([0.0, 0.2, 0.5, 1.0, 1.5], 2, 0, 1)}
`, "run", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := got.(map[string]any)
	if g["mean"] != 2.5 || g["var"] != 1.25 || math.Abs(g["var1"].(float64)-5.0/3) > 1e-15 || g["std"] != math.Sqrt(1.25) {
		t.Errorf("moments %v", g)
	}
	if g["q"] != 2.5 || !reflect.DeepEqual(g["qs"], []any{1.0, 4.0}) {
		t.Errorf("quantiles %v %v", g["q"], g["qs"])
	}
	h := map[string]any{"edges": []any{0.0, 0.5, 1.0}, "counts": []any{int64(2), int64(2)}, "outside": int64(1)}
	if !reflect.DeepEqual(g["h"], h) {
		t.Errorf("histogram %v", g["h"])
	}
}

func TestCallIsolation(t *testing.T) {
	// Concurrent calls share nothing: run many at once under -race.
	e := entry(t, "iso.star", "def run(p, i):\n    return tensor.sum(rng.uniforms(1000)) + p[\"k\"]\n")
	done := make(chan any, 8)
	for k := 0; k < 8; k++ {
		go func() {
			v, err := Call(context.Background(), Env{Seed: []byte("s")}, e, "run", map[string]any{"k": 0}, nil)
			if err != nil {
				done <- err
				return
			}
			done <- v
		}()
	}
	first := <-done
	for k := 1; k < 8; k++ {
		if v := <-done; v != first {
			t.Fatalf("concurrent calls disagree: %v vs %v", v, first)
		}
	}
}

// What the engine lends is not charged: a 64 MiB input vector under an 8 MiB
// budget is fine, and so is returning it.
func TestBorrowedValuesNotCharged(t *testing.T) {
	big := make([]float64, 8<<20)
	e := entry(t, "borrow.star", `
def run(p, i):
    v = i["v"]
    m = tensor.reshape(v, 1024, len(v) // 1024)
    return [tensor.sum(v), len(m[0]), len(v)]
`)
	got, err := Call(context.Background(), Env{Limits: Limits{MemoryBytes: 8 << 20, Steps: 1 << 20}}, e, "run", nil, map[string]any{"v": big})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []any{0.0, int64(8 << 10), int64(8 << 20)}) {
		t.Fatalf("got %v", got)
	}
	// A copy of it is charged.
	_, err = Call(context.Background(), Env{Limits: Limits{MemoryBytes: 8 << 20}}, entry(t, "copy.star", "def run(p, i):\n    return len(i[\"v\"] * 2.0)\n"), "run", nil, map[string]any{"v": big})
	if err != nil {
		t.Fatalf("one operator result is audited later, not refused: %v", err)
	}
	_, err = Call(context.Background(), Env{Limits: Limits{MemoryBytes: 8 << 20}}, entry(t, "copy2.star", "def run(p, i):\n    return len(tensor.scale(i[\"v\"], 2.0))\n"), "run", nil, map[string]any{"v": big})
	wantDiag(t, err, diag.MemoryBudget)
}

// A memory refusal is deterministic: the same call fails the same way.
func TestMemoryRefusalDeterministic(t *testing.T) {
	e := entry(t, "det.star", `
def run(p, i):
    kept = []
    for k in range(1000):
        kept.append([float(j) for j in range(1000)])
        kept.append(tensor.ones(20000))
    return len(kept)
`)
	env := Env{Limits: Limits{MemoryBytes: 16 << 20}}
	_, err1 := Call(context.Background(), env, e, "run", nil, nil)
	_, err2 := Call(context.Background(), env, e, "run", nil, nil)
	d1, d2 := wantDiag(t, err1, diag.MemoryBudget), wantDiag(t, err2, diag.MemoryBudget)
	if d1.Error() != d2.Error() {
		t.Fatalf("two runs refused differently:\n%s\n%s", d1.Error(), d2.Error())
	}
}

func TestResultSizeLimit(t *testing.T) {
	_, err := run(t, "def run(p, i):\n    return tensor.zeros(16777217)\n", "run", nil, nil)
	wantDiag(t, err, diag.ShardBudgetLimits)
}
