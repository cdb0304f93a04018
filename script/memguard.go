package script

import (
	"fmt"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"go.starlark.net/starlark"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/memlimit"
)

// The memory guard.
//
// Go cannot meter memory per goroutine, and go.starlark.net has no
// allocation hook, so the guard combines three measures, from exact to
// coarse. Each trips diag.MemoryBudget.
//
//  1. Native reservations (exact, deterministic). Every native function that
//     allocates a vector, matrix, list or dataset reserves its size first,
//     and so do the wrapped built-ins that materialise a sized iterable
//     (list, tuple, sorted, set, enumerate, zip: list(range(10**9)) is
//     refused before it allocates). A reservation that would push the
//     call's estimate over Limits.MemoryBytes triggers an audit (2); if
//     the audit confirms, the native fails before allocating.
//
//  2. Audits (estimated, deterministic). At checkpoints scheduled by step
//     count, the guard walks every value reachable from the call — all
//     frames' locals, closures' free variables, module globals, loaded
//     modules — and estimates their size (8 bytes per float in a vector,
//     16 per list slot plus the element, ~72 per dict entry, string
//     lengths, …). Values lent by the engine (argument vectors, matrices,
//     datasets) are not charged. Audits are spaced by at most 16 and at
//     least 4 steps per value walked last time, closer together as the
//     estimate nears the budget (see auditGap), so they cost a few percent
//     and at worst about 25%; their schedule depends only on the program, so
//     the same call trips at the same point on every run.
//
//  3. Heap backstop (coarse, not deterministic). At every checkpoint the
//     guard reads the runtime's live-heap figure (as of the last GC). When
//     it has grown since the call started by more than the sum of the
//     budgets of all calls running in the process plus 64 MiB, the call
//     audits itself; it stops if the audit confirms, if it is the only
//     call running, or if the growth exceeds 1.5 × that sum (then every
//     running call stops at its next checkpoint). This catches what audits
//     cannot see: temporaries on the interpreter's operand stack, such as
//     a comprehension still building its list. The hard rule (1.5 ×) is
//     also checked every watchEvery while the call runs (watchHeap): one
//     step can double what the call holds, so a short loop would otherwise
//     outgrow any budget before its first checkpoint. The starting point is the
//     larger of the live figure and the heap's current objects, so that
//     what the engine allocated just before the call is not charged to it.
//
//  4. Repetition (exact, deterministic). Every `a * b` in content compiles
//     to a call that reserves the size of the sequence a repetition would
//     build ("x" * n, [0] * n, tuples, bytes) before building it, so
//     [0] * (1 << 27) under a 256 MiB budget is refused, not allocated
//     (repeat.go). An augmented `t *= n` is covered when t is a name or an
//     index or field of names and literals.
//
// Not covered: other single built-in operations still run to completion
// before any check — list + list, str.join, str.replace allocate in
// proportion to their operands (a few times what the call holds); the
// backstop stops the thread right after, or within watchEvery of the heap
// passing 1.5 × the budgets (a doubling loop overshoots a few times). Work inside one native call (model training) is bounded by
// its reservations, not audited while it runs. The live-heap figure lags
// by up to one GC cycle, so the backstop can overshoot by up to the GC's
// headroom (GOGC). Memory the engine lends (input datasets) is not
// charged. For untrusted content on foreign machines, run shards in a child
// process under an OS limit (RLIMIT_AS or a cgroup's memory.max); this
// guard is the in-process layer.
type memGuard struct {
	limit uint64
	// lowered: the call's budget was cut to what the process's memory
	// limit leaves (memlimit.Room; an address-space limit, ulimit -v).
	lowered   bool
	est       uint64 // bytes: last audit plus reservations since
	nextAudit uint64 // step count of the next scheduled audit
	auditedAt uint64 // step count of the last audit
	startLive uint64
	slack     uint64 // backstopSlack when the call started
	live      []metrics.Sample
}

const (
	auditMinSteps   = checkEvery
	auditSpacing    = 16
	auditMinSpacing = 4
	bytesPerStep    = 64
	liveMetric      = "/gc/heap/live:bytes"
	objectsMetric   = "/memory/classes/heap/objects:bytes"
)

// backstopSlack is the heap growth the backstop tolerates beyond the
// budgets (engine allocations, GC timing). A variable so tests can shrink
// it; each call reads it once, when it starts (memGuard.slack), so a test
// that shrinks it races with no other call's heap watch.
var backstopSlack uint64 = 64 << 20

// Process-wide registry of running calls, for the backstop.
var (
	activeCalls atomic.Int64
	activeLimit atomic.Uint64
)

func (g *memGuard) start(limit uint64) {
	g.slack = backstopSlack
	// Under an address-space limit the process may not be able to hold
	// the job's budget at all: the runtime would die of it (fatal error:
	// out of memory) before the guard could stop the call. The budget is
	// then what the limit leaves, and the backstop's slack a quarter of
	// that, so the call stops with SC2005 instead.
	if room := memlimit.Room(); room < limit {
		limit, g.lowered = room, true
		g.slack = min(g.slack, room/4)
	}
	g.limit = limit
	g.nextAudit = auditMinSteps
	// The baseline is the larger of the live heap at the last GC and the
	// heap's current objects (live plus unswept garbage): the first may be
	// stale, and a stale, low baseline would charge this call with what the
	// engine allocated before it started.
	start := []metrics.Sample{{Name: liveMetric}, {Name: objectsMetric}}
	metrics.Read(start)
	for _, s := range start {
		if s.Value.Kind() == metrics.KindUint64 {
			g.startLive = max(g.startLive, s.Value.Uint64())
		}
	}
	g.live = start[:1]
	activeCalls.Add(1)
	activeLimit.Add(limit)
}

func (g *memGuard) finish() {
	activeCalls.Add(-1)
	activeLimit.Add(^(g.limit - 1))
}

func (g *memGuard) readLive() uint64 {
	metrics.Read(g.live)
	if g.live[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return g.live[0].Value.Uint64()
}

// checkpoint runs every checkEvery steps on the call's goroutine: the step
// budget, scheduled audits and the backstop.
func (st *callState) checkpoint() {
	th := st.thread
	if th.Steps >= st.limits.Steps {
		st.stop(stopSteps, "step budget exhausted")
		return
	}
	g := &st.guard
	if th.Steps >= g.nextAudit && !st.audit() {
		return
	}
	if growth, budget := g.heapGrowth(g.readLive()); growth > budget {
		if th.Steps > g.auditedAt && !st.audit() {
			return
		}
		if activeCalls.Load() <= 1 || growth > budget+budget/2 {
			st.stopHeap(growth)
			return
		}
	}
	th.SetMaxExecutionSteps(min(th.Steps+checkEvery, st.limits.Steps))
}

// heapGrowth returns how much the process heap grew, live bytes now
// against the call's start, and the budget the backstop holds it to: the
// running calls' budgets plus the slack.
func (g *memGuard) heapGrowth(live uint64) (growth, budget uint64) {
	if live > g.startLive {
		growth = live - g.startLive
	}
	return growth, activeLimit.Load() + g.slack
}

// stopHeap stops the call for a heap grown by growth past the backstop.
func (st *callState) stopHeap(growth uint64) {
	st.stop(stopMemory, fmt.Sprintf("the process heap grew by %s while this call ran, over the %s budget of the %d call(s) running (memory held by temporaries the audit cannot see)",
		mib(growth), mib(activeLimit.Load()), activeCalls.Load()))
}

// watchEvery is how often watchHeap looks at the heap while a call runs.
const watchEvery = 20 * time.Millisecond

// watchHeap applies the backstop's hard rule on a timer as well as at
// checkpoints, and returns the function that ends the watch. A checkpoint
// comes every checkEvery steps, but one step can allocate in proportion
// to what the call holds (list + list, str.join), so a loop doubling a
// list reaches any budget within a few dozen steps, long before the next
// checkpoint (a topology of six lines held 4 GiB and growing). The timer
// cannot audit (the thread's frames belong to its goroutine), so it stops
// the call only past 1.5 × the running calls' budgets plus the slack —
// what a checkpoint's backstop stops every call at — and the thread stops
// at its next instruction, after the operation under way.
func (st *callState) watchHeap() (stop func()) {
	g := &st.guard
	live := []metrics.Sample{{Name: liveMetric}}
	var mu sync.Mutex // held by a check under way; stop waits it out
	done := false
	var t *time.Timer
	mu.Lock() // t is read by the callback
	defer mu.Unlock()
	t = time.AfterFunc(watchEvery, func() {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return // the call has returned
		}
		metrics.Read(live)
		if live[0].Value.Kind() == metrics.KindUint64 {
			if growth, budget := g.heapGrowth(live[0].Value.Uint64()); growth > budget+budget/2 {
				st.stopHeap(growth)
				return
			}
		}
		t.Reset(watchEvery)
	})
	return func() {
		mu.Lock()
		done = true
		mu.Unlock()
		t.Stop()
	}
}

// audit measures the values reachable from the call. It returns false (and
// stops the thread) when they exceed the budget.
func (st *callState) audit() bool {
	g := &st.guard
	bytes, nodes := st.reachable()
	g.est = bytes
	g.auditedAt = st.thread.Steps
	g.nextAudit = st.thread.Steps + auditGap(bytes, g.limit, nodes)
	if bytes > g.limit {
		st.stop(stopMemory, fmt.Sprintf("the values it holds take about %s, over the budget of %s", mib(bytes), g.budget()))
		return false
	}
	return true
}

// auditGap is the number of steps until the next audit. Far below the
// budget, audits are spaced 16 steps per value walked (cost ≲ 5%); nearer,
// the gap shrinks to the steps in which element-by-element Starlark code
// could fill the headroom (about 64 bytes a step at most), but never below 4
// steps per value walked (cost ≲ 25%) — the price of an overshoot of up to
// that many steps' allocations.
func auditGap(held, limit uint64, nodes int) uint64 {
	n := uint64(nodes)
	gap := auditSpacing * n
	if held < limit {
		gap = min(gap, (limit-held)/bytesPerStep)
	} else {
		gap = 0
	}
	return max(auditMinSteps, auditMinSpacing*n, gap)
}

// reserve charges n bytes a native is about to allocate for what.
func (st *callState) reserve(n uint64, what string) error {
	g := &st.guard
	if n > g.limit || g.est+n > g.limit {
		bytes, _ := st.reachable()
		g.est = bytes
		if g.est+n > g.limit {
			return diag.New(diag.MemoryBudget, "", "%s needs %s; with the %s already held that is over the budget of %s",
				what, mib(n), mib(g.est), g.budget()).
				WithHelp("raise limits.memory_mb in the job or work in smaller pieces")
		}
	}
	g.est += n
	return nil
}

// budget names the call's budget, and why when it is not the job's.
func (g *memGuard) budget() string {
	if g.lowered {
		return mib(g.limit) + " (what this process's memory limit leaves, from its address-space limit, ulimit -v)"
	}
	return mib(g.limit)
}

func mib(n uint64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d KiB", (n+1023)>>10)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// Size model for audits, in bytes on a 64-bit machine.
const (
	slotBytes   = 16 // an interface value in a list, tuple or frame
	listBytes   = 48
	tupleBytes  = 24
	entryBytes  = 72 // a dict or set entry besides its key and value
	stringBytes = 16
	floatBytes  = 8
	funcBytes   = 96
)

// reachable estimates the bytes held by values reachable from the call, and
// how many values it walked.
func (st *callState) reachable() (uint64, int) {
	w := walker{seen: map[any]struct{}{}}
	th := st.thread
	mods := map[*starlark.Module]bool{}
	for d := 0; d < th.CallStackDepth(); d++ {
		fr := th.DebugFrame(d)
		fn, ok := fr.Callable().(*starlark.Function)
		if !ok {
			continue
		}
		for i := 0; i < fr.NumLocals(); i++ {
			_, v := fr.Local(i)
			w.add(v)
		}
		w.add(fn)
		if m := fn.Module(); m != nil && !mods[m] {
			mods[m] = true
			for _, v := range m.Globals() {
				w.add(v)
			}
		}
	}
	for _, m := range st.modules {
		for _, v := range m.globals {
			w.add(v)
		}
	}
	w.run()
	return w.bytes, w.nodes
}

type walker struct {
	seen  map[any]struct{}
	stack []starlark.Value
	bytes uint64
	nodes int
}

func (w *walker) add(v starlark.Value) {
	if v != nil {
		w.stack = append(w.stack, v)
	}
}

func (w *walker) once(p any) bool {
	if _, ok := w.seen[p]; ok {
		return false
	}
	w.seen[p] = struct{}{}
	return true
}

func (w *walker) run() {
	for len(w.stack) > 0 {
		v := w.stack[len(w.stack)-1]
		w.stack = w.stack[:len(w.stack)-1]
		w.visit(v)
	}
}

// scalar returns the size of v if it holds no other values.
func scalar(v starlark.Value) (uint64, bool) {
	switch x := v.(type) {
	case nil, starlark.NoneType, starlark.Bool:
		return 0, true
	case starlark.Float:
		return floatBytes, true
	case starlark.Int:
		if _, ok := x.Int64(); ok {
			return 0, true
		}
		return 32 + uint64(x.BigInt().BitLen()/8), true
	case starlark.String:
		return stringBytes + uint64(len(x)), true
	case starlark.Bytes:
		return stringBytes + uint64(len(x)), true
	}
	return 0, false
}

func (w *walker) elem(v starlark.Value) {
	w.nodes++
	w.bytes += slotBytes
	if n, ok := scalar(v); ok {
		w.bytes += n
		return
	}
	w.add(v)
}

func (w *walker) visit(v starlark.Value) {
	w.nodes++
	if n, ok := scalar(v); ok {
		w.bytes += n
		return
	}
	switch x := v.(type) {
	case *starlark.List:
		if !w.once(x) {
			return
		}
		w.bytes += listBytes
		for i := 0; i < x.Len(); i++ {
			w.elem(x.Index(i))
		}
	case starlark.Tuple:
		w.bytes += tupleBytes
		for _, e := range x {
			w.elem(e)
		}
	case *starlark.Dict:
		if !w.once(x) {
			return
		}
		w.bytes += listBytes
		for _, kv := range x.Items() {
			w.bytes += entryBytes
			w.elem(kv[0])
			w.elem(kv[1])
		}
	case *starlark.Set:
		if !w.once(x) {
			return
		}
		w.bytes += listBytes
		it := x.Iterate()
		var e starlark.Value
		for it.Next(&e) {
			w.bytes += entryBytes
			w.elem(e)
		}
		it.Done()
	case *starlark.Function:
		if !w.once(x) {
			return
		}
		w.bytes += funcBytes
		for i := 0; i < x.NumFreeVars(); i++ {
			_, fv := x.FreeVar(i)
			w.add(fv)
		}
		for i := 0; i < x.NumParams(); i++ {
			w.add(x.ParamDefault(i))
		}
	case sized:
		if !w.once(x) {
			return
		}
		w.bytes += x.ownedBytes()
	default:
		w.bytes += slotBytes
	}
}

// sized is implemented by the native value types: the bytes they hold that
// belong to the call (zero for what the engine lent).
type sized interface {
	ownedBytes() uint64
}

func (v *vectorValue) ownedBytes() uint64 {
	if v.borrowed {
		return 0
	}
	return 32 + bytesOf(len(v.data))
}

func (m *matrixValue) ownedBytes() uint64 {
	if m.borrowed {
		return 0
	}
	return 48 + bytesOf(len(m.m.Data))
}
