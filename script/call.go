package script

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"go.starlark.net/starlark"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Limits bounds one Call. A zero field means the DefaultLimits value.
type Limits struct {
	// Steps bounds the Starlark interpreter's abstract computation steps
	// (roughly, bytecode instructions) across the whole call, including the
	// module's top level and everything it loads. A native call counts as
	// one step, except model.train and tensor.matmul, which count one step
	// per workPerStep multiply-adds as they go.
	Steps uint64
	// MemoryBytes bounds the memory the call holds; see memguard.go for
	// what is measured and how.
	MemoryBytes uint64
}

// Default budgets: about ten seconds of pure Starlark on a current core,
// and 1 GiB.
const (
	DefaultSteps       = 300_000_000
	DefaultMemoryBytes = 1 << 30
)

// DefaultLimits returns the budgets used when a job sets none.
func DefaultLimits() Limits {
	return Limits{Steps: DefaultSteps, MemoryBytes: DefaultMemoryBytes}
}

func (l Limits) withDefaults() Limits {
	if l.Steps == 0 {
		l.Steps = DefaultSteps
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = DefaultMemoryBytes
	}
	return l
}

// Env is what the engine hands a call: nothing else reaches the content.
type Env struct {
	// Catalog is where load() looks modules up (by name or ref). Nil means
	// content may not load anything.
	Catalog *catalog.Catalog
	Limits  Limits
	// Seed seeds the rng module (through SHA-256), e.g. the shard ID's
	// digest. Nil makes the rng module's functions fail with a diagnostic;
	// rng.stream(n) works without it.
	Seed []byte
	// Print receives the output of Starlark's print(); nil discards it.
	Print func(msg string)
	// Training is the engine's rule for model.train (record-level DP-SGD
	// and the record of what ran); see TrainingPolicy. Nil trains as the
	// content asks, deterministically given its seed.
	Training *TrainingPolicy
	// Convergent allows natives whose results vary in the last bits from
	// call to call (tensor.fast_sum): only a job of the convergent tier,
	// whose replicas are compared within a tolerance, may call them.
	Convergent bool
	// Verifier is the randomness check.freivalds draws its vectors from.
	// Only a verifier peer sets it (to crypto/rand.Reader), after the
	// result it checks was committed; nil makes check.freivalds fail.
	Verifier io.Reader
}

// stop reasons, recorded before the thread is cancelled so that the
// resulting error maps to the right diagnostic.
const (
	stopNone int32 = iota
	stopSteps
	stopMemory
	stopCancelled
)

// callState is one call's sandbox, reachable from natives through the
// thread-local stateKey. Only the call's goroutine touches it, except reason
// (set by the context watcher).
type callState struct {
	ctx     context.Context
	env     Env
	limits  Limits
	thread  *starlark.Thread
	entry   *catalog.Entry
	modules map[content.Ref]*module
	paths   map[string]*catalog.Entry // source files seen, for quoting lines
	guard   memGuard
	rng     *generator
	dpSteps int // DP-SGD steps model.train has taken in this call (TrainingPolicy)
	reason  atomic.Int32
	detail  atomic.Pointer[string] // why the thread was stopped, for the diagnostic
}

const stateKey = "scellis.script"

func stateOf(thread *starlark.Thread) *callState {
	st, _ := thread.Local(stateKey).(*callState)
	if st == nil {
		panic("script: native called outside a sandboxed call")
	}
	return st
}

// stop cancels the thread for a reason; the first reason wins.
func (st *callState) stop(reason int32, detail string) {
	if st.reason.CompareAndSwap(stopNone, reason) {
		st.detail.Store(&detail)
	}
	st.thread.Cancel(detail)
}

// workPerStep is how many multiply-adds of native work (training steps,
// matrix products) count as one interpreter step: a step of Starlark takes
// about as long as 30–60 multiply-adds in Go, so a budget of steps bounds
// native work and Starlark alike by time, roughly.
const workPerStep = 32

// errStopped is what nativeWork returns once the call was stopped; mapError
// turns the call's stop reason into the diagnostic.
var errStopped = errors.New("stopped")

// nativeWork is called inside long-running natives (model.train after every
// optimizer step, tensor.matmul between bands of rows) with the work done
// since the last call. It charges the work to the step budget and reports
// whether the call must stop: the budget is spent, the context was
// cancelled (a shard timeout, SIGINT), or the memory backstop stopped it.
// It runs on the call's goroutine, which owns thread.Steps.
func (st *callState) nativeWork(work int) error {
	th := st.thread
	// At least one step per report, so a loop of tiny steps is bounded too.
	steps := (uint64(max(work, 0)) + workPerStep - 1) / workPerStep
	steps = max(steps, 1)
	if th.Steps+steps < th.Steps || th.Steps+steps >= st.limits.Steps {
		th.Steps = st.limits.Steps
		st.stop(stopSteps, "step budget exhausted")
	} else {
		th.Steps += steps
	}
	if st.reason.Load() != stopNone {
		return errStopped
	}
	return nil
}

// module is a loaded catalog entry within one call.
type module struct {
	globals starlark.StringDict
	err     error
	loading bool
}

// checkEvery is the number of steps between checkpoints (step budget,
// memory audits): frequent enough to stop a runaway thread within well under
// a millisecond, rare enough to cost nothing measurable.
const checkEvery = 1 << 14

// Call runs fn of entry e with args converted to Starlark and returns its
// result converted to plain Go values. It is safe for concurrent use; each
// call gets a fresh interpreter thread and fresh module globals, so calls
// share no state.
//
// Arguments: nil → None; bool; any integer → int; float → float; string;
// []any and other slices → list; map[string]any (and maps with string keys,
// as a CBOR decoder produces) → dict with keys inserted in sorted order;
// []float64 and tensor.Vector → vector; *tensor.Matrix → matrix;
// *model.Dataset → dataset handle. Vectors, matrices and datasets are lent,
// not copied: content cannot modify them and they are not charged to its
// memory budget.
//
// Result: None → nil; bool; int → int64; float → float64; string; list and
// tuple → []any; dict with string keys → map[string]any; vector →
// []float64; matrix → [][]float64. NaN or ±Inf anywhere is
// diag.NonFinite naming the place (result["auc"]); other types, ints beyond
// 64 bits and non-string keys are diag.ContentShape; a list longer than
// 2^24 or a dict larger than 2^20 is diag.ShardBudgetLimits.
//
// Every failure is a *diag.Diagnostic (or a diag.List of them), except a Go
// argument that cannot be converted, which is a plain error (an engine bug).
func Call(ctx context.Context, env Env, e *catalog.Entry, fn string, args ...any) (any, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	st := &callState{
		ctx:     ctx,
		env:     env,
		limits:  env.Limits.withDefaults(),
		entry:   e,
		modules: map[content.Ref]*module{},
		paths:   map[string]*catalog.Entry{e.Path: e},
	}
	thread := &starlark.Thread{Name: e.Subject() + " " + fn}
	st.thread = thread
	thread.SetLocal(stateKey, st)
	thread.Print = func(_ *starlark.Thread, msg string) {
		if env.Print != nil {
			env.Print(msg)
		}
	}
	thread.Load = st.load
	thread.OnMaxSteps = func(*starlark.Thread) { st.checkpoint() }
	thread.SetMaxExecutionSteps(min(checkEvery, st.limits.Steps))
	st.guard.start(st.limits.MemoryBytes)
	defer st.guard.finish()
	defer st.watchHeap()()

	if err := ctx.Err(); err != nil {
		return nil, diag.New(diag.ContentCancelled, e.Subject(), "not started: %v", err)
	}
	stopWatch := context.AfterFunc(ctx, func() { st.stop(stopCancelled, "cancelled: "+context.Cause(ctx).Error()) })
	defer stopWatch()

	globals, err := st.exec(e)
	if err != nil {
		return nil, st.mapError(err)
	}
	f, ok := globals[fn]
	if !ok {
		return nil, missingFunction(e, fn, "")
	}
	callable, ok := f.(starlark.Callable)
	if !ok {
		return nil, missingFunction(e, fn, fmt.Sprintf("%s is a %s, not a function", fn, f.Type()))
	}
	sargs := make(starlark.Tuple, len(args))
	for i, a := range args {
		v, err := toStarlarkValue(a)
		if err != nil {
			return nil, fmt.Errorf("script: argument %d of %s: %w", i, fn, err)
		}
		sargs[i] = v
	}
	res, err := starlark.Call(thread, callable, sargs, nil)
	if err != nil {
		return nil, st.mapError(err)
	}
	out, err := fromStarlarkValue(res)
	if err != nil {
		if d, ok := err.(*diag.Diagnostic); ok {
			d.Subject = e.Subject()
			d.Message = fmt.Sprintf("%s returned %s", fn, d.Message)
			if pf, ok := callable.(*starlark.Function); ok {
				pos := pf.Position()
				d.At(e.Path, int(pos.Line), int(pos.Col)).WithSource(e.SourceLine(int(pos.Line)))
			}
		}
		return nil, err
	}
	return out, nil
}

func missingFunction(e *catalog.Entry, fn, why string) error {
	if why == "" {
		why = fmt.Sprintf("%s does not define %s", e.Name, fn)
	}
	d := diag.New(diag.MissingFunction, e.Subject(), "%s", why).At(e.Path, 0, 0)
	if len(e.Funcs) > 0 {
		return d.WithHelp("its top-level functions are %v; a program defines run, a partitioner partition, a reducer reduce", e.Funcs)
	}
	return d.WithHelp("a program defines run, a partitioner partition, a reducer reduce")
}

// exec runs an entry's top level on the call's thread and returns its
// frozen globals.
func (st *callState) exec(e *catalog.Entry) (starlark.StringDict, error) {
	prog, err := compile(e)
	if err != nil {
		return nil, err
	}
	st.paths[e.Path] = e
	g, err := prog.Init(st.thread, predeclared)
	if err != nil {
		return nil, err
	}
	g.Freeze()
	return g, nil
}

// load implements load() from the catalog only.
func (st *callState) load(thread *starlark.Thread, name string) (starlark.StringDict, error) {
	if st.env.Catalog == nil {
		return nil, diag.New(diag.ForbiddenLoad, st.entry.Subject(), "load(%q): this call has no catalog to load from", name)
	}
	e, ok := st.env.Catalog.Lookup(name)
	if !ok {
		return nil, diag.New(diag.ForbiddenLoad, st.entry.Subject(), "load(%q): no catalog entry has that name or ref", name).
			WithHelp("load() only names catalog entries; add the file with scellis catalog add, then load it by name")
	}
	if m, ok := st.modules[e.Ref]; ok {
		if m.loading {
			return nil, diag.New(diag.ForbiddenLoad, st.entry.Subject(), "load(%q): load cycle", name).
				WithHelp("break the cycle: move the shared helpers into a library both files load")
		}
		return m.globals, m.err
	}
	m := &module{loading: true}
	st.modules[e.Ref] = m
	m.globals, m.err = st.exec(e)
	m.loading = false
	return m.globals, m.err
}

// progCache holds compiled programs by ref: compilation is a pure function
// of the source (the predeclared names are fixed), and a compiled Program
// holds no values, so it can be initialised by many calls at once.
var progCache sync.Map // ref + path → *compiled

type compiled struct {
	once sync.Once
	prog *starlark.Program
	err  error
}

func compile(e *catalog.Entry) (*starlark.Program, error) {
	// Positions in a compiled program name the file it was compiled from,
	// so the same bytes under another path compile separately.
	c, _ := progCache.LoadOrStore(string(e.Ref)+"\x00"+e.Path, &compiled{})
	cp := c.(*compiled)
	cp.once.Do(func() {
		f, err := catalog.Dialect().Parse(e.Path, e.Source, 0)
		if err != nil {
			cp.err = err
			return
		}
		guardRepetition(f)
		cp.prog, cp.err = starlark.FileProgram(f, predeclared.Has)
	})
	return cp.prog, cp.err
}
