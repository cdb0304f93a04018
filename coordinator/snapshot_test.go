package coordinator

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

// busy returns a machine in the middle of things: live leases, reports,
// verified and flagged shards, a lease memo, a finished job and receipts.
func busy(t *testing.T) (*Machine, []Command) {
	t.Helper()
	m, err := New(Config{Regime: trust.Consortium, DefaultLeaseTTL: 50})
	if err != nil {
		t.Fatal(err)
	}
	ref := func(s string) content.Ref { return content.Hash([]byte(s)) }
	plan := func(id string, n int) SubmitJob {
		c := SubmitJob{Job: ref(id), Name: id}
		for i := 0; i < n; i++ {
			c.Shards = append(c.Shards, ShardPlan{Index: i, ID: ref(id + string(rune('a'+i))), Price: int64(i + 1), PriceBasis: "program cost()"})
		}
		return c
	}
	cmds := []Command{
		plan("j1", 3), plan("j2", 1),
		Lease{Peer: "w1", Now: 10, Max: 3, RequestID: "r1"},
		Lease{Peer: "w2", Now: 11, Max: 3},
		ReportResult{Peer: "w1", Job: ref("j1"), Shard: 0, Result: ref("x"), Now: 12},
		ReportResult{Peer: "w2", Job: ref("j1"), Shard: 0, Result: ref("x"), Now: 13},
		ReportResult{Peer: "w1", Job: ref("j1"), Shard: 1, Result: ref("y"), Now: 14},
		ReportResult{Peer: "w2", Job: ref("j1"), Shard: 1, Result: ref("z"), Now: 15},
		Lease{Peer: "w3", Now: 16, Max: 1},
		Lease{Peer: "w4", Now: 16, Max: 1},
		Lease{Peer: "w4", Now: 17, Max: 1, Job: ref("j2")},
		ReportResult{Peer: "w4", Job: ref("j2"), Shard: 0, Result: ref("q"), Now: 18},
		Lease{Peer: "w5", Now: 19, Max: 1, Job: ref("j2")},
		ReportResult{Peer: "w5", Job: ref("j2"), Shard: 0, Result: ref("q"), Now: 20},
		ReportReduced{Job: ref("j2"), Peer: "agg", Reduced: ref("sum"), Now: 21},
		Tick{Now: 40},
	}
	for _, c := range cmds {
		m.Apply(c)
	}
	return m, cmds
}

func TestSnapshotRestoreReproducesStateHash(t *testing.T) {
	m, _ := busy(t)
	snap := m.Snapshot()
	if m.StateHash() != content.Hash(snap) {
		t.Fatal("StateHash is not the hash of Snapshot")
	}
	r, err := Load(snap)
	if err != nil {
		t.Fatal(err)
	}
	if r.StateHash() != m.StateHash() {
		t.Fatal("restore changed the state hash")
	}
	s1, h1 := m.Head()
	if s2, h2 := r.Head(); s1 != s2 || h1 != h2 || s1 == 0 {
		t.Fatalf("receipt heads differ: (%d %s) vs (%d %s)", s1, h1.Short(), s2, h2.Short())
	}
	// The original and the restored machine stay in step.
	ref := func(s string) content.Ref { return content.Hash([]byte(s)) }
	more := []Command{
		Lease{Peer: "w1", Now: 41, Max: 3, RequestID: "r1"}, // memo hit
		Tick{Now: 70}, // expiries
		Lease{Peer: "w6", Now: 71, Max: 3},
		ReportResult{Peer: "w6", Job: ref("j1"), Shard: 1, Result: ref("y"), Now: 72},
	}
	for _, c := range more {
		a, b := m.Apply(c), r.Apply(c)
		if len(a.Events) != len(b.Events) || a.Refused() != b.Refused() {
			t.Fatalf("%T: original and restored answer differently", c)
		}
		if m.StateHash() != r.StateHash() {
			t.Fatalf("%T: original and restored diverge", c)
		}
	}
	// Restore replaces the state of a machine that already has one.
	fresh, _ := New(Config{Regime: trust.Open})
	if err := fresh.Restore(m.Snapshot()); err != nil || fresh.StateHash() != m.StateHash() || fresh.Regime() != trust.Consortium {
		t.Fatalf("Restore over a used machine: %v", err)
	}
}

func TestRestoreRefusesBadSnapshots(t *testing.T) {
	m, _ := busy(t)
	good := m.Snapshot()
	target, _ := New(Config{Regime: trust.Own})
	before := target.StateHash()
	cases := map[string][]byte{
		"empty":         nil,
		"garbage":       []byte("not cbor"),
		"trailing byte": append(append([]byte(nil), good...), 0),
		"truncated":     good[:len(good)/2],
	}
	// An edited receipt inside an otherwise valid snapshot.
	var st state
	if err := content.Decode(good, &st); err != nil {
		t.Fatal(err)
	}
	st.Receipts[0].WorkUnits = 1000
	edited, _ := content.Encode(&st)
	cases["edited receipt"] = edited
	st.Receipts[0].WorkUnits = 1
	st.Format = "scellis/coordinator/v0"
	old, _ := content.Encode(&st)
	cases["wrong format"] = old

	for name, b := range cases {
		err := target.Restore(b)
		var d *diag.Diagnostic
		if !errors.As(err, &d) || d.Code != diag.PoolBadSnapshot {
			t.Errorf("%s: got %v, want SC7012", name, err)
		}
		if target.StateHash() != before {
			t.Errorf("%s: a refused restore changed the machine", name)
		}
	}
}

// eagerSnapshot is the snapshot as it was encoded before views existed:
// the whole state, under the lock.
func (m *Machine) eagerSnapshot() []byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.snapshot()
}

// captureProbe captures m's state and encodes the whole state the eager
// way; it returns the hash of those bytes (the StateHash) and a check to
// call after more commands were applied: it fails t unless the view still
// encodes to exactly those bytes — the capture is faithful and shares
// nothing the later Applies wrote. The property and script tests call it
// around every command they apply.
func captureProbe(t testing.TB, m *Machine) (content.Ref, func()) {
	t.Helper()
	v := m.Capture()
	eager := m.eagerSnapshot()
	return content.Hash(eager), func() {
		t.Helper()
		if got := v.Encode(); !bytes.Equal(got, eager) {
			t.Fatalf("a captured view encodes to %d bytes (%s) after an Apply, the state when captured to %d (%s)",
				len(got), content.Hash(got).Short(), len(eager), content.Hash(eager).Short())
		}
	}
}

// TestCaptureEncodesWhileApplying encodes views on other goroutines while
// the machine applies commands that touch every part of the state a view
// copies (leases, reports, verdicts on shards, peer records, memos, the
// receipt chain, a job's state); each view must encode to the bytes the
// state had when it was captured, and, restored, give that StateHash.
// Run with -race, it checks that no view shares memory Apply writes.
func TestCaptureEncodesWhileApplying(t *testing.T) {
	m, _ := busy(t)
	ref := func(s string) content.Ref { return content.Hash([]byte(s)) }
	more := []Command{
		SubmitJob{Job: ref("j3"), Name: "j3", Shards: []ShardPlan{{Index: 0, ID: ref("j3a"), Price: 1, PriceBasis: "flat"}, {Index: 1, ID: ref("j3b"), Price: 1, PriceBasis: "flat"}}, Now: 41},
		Lease{Peer: "w1", Now: 42, Max: 4, RequestID: "r2"},
		Lease{Peer: "w2", Now: 43, Max: 4, RequestID: "r3"},
		ReportResult{Peer: "w1", Job: ref("j1"), Shard: 2, Result: ref("k"), Now: 44},
		ReportResult{Peer: "w1", Job: ref("j3"), Shard: 0, Result: ref("k0"), Now: 45},
		ReportResult{Peer: "w2", Job: ref("j3"), Shard: 0, Result: ref("k0"), Now: 46},
		RenewLease{Peer: "w1", Job: ref("j3"), Shard: 1, Now: 47},
		ReleaseLeases{Peer: "w2", Now: 48},
		ReportResult{Peer: "w2", Job: ref("j1"), Shard: 2, Result: ref("k"), Now: 49},
		Tick{Now: 200},
	}
	type captured struct {
		v    *View
		want []byte
		got  chan []byte
	}
	var views []captured
	for _, c := range more {
		cv := captured{v: m.Capture(), want: m.eagerSnapshot(), got: make(chan []byte, 1)}
		go func() { cv.got <- cv.v.Encode() }()
		views = append(views, cv)
		m.Apply(c)
	}
	for i, cv := range views {
		got := <-cv.got
		if !bytes.Equal(got, cv.want) {
			t.Fatalf("view %d (before %T) encoded to other bytes than its state", i, more[i])
		}
		r, err := Load(got)
		if err != nil || r.StateHash() != content.Hash(cv.want) {
			t.Fatalf("view %d does not restore to its state hash: %v", i, err)
		}
	}
	if content.Hash(views[0].want) == m.StateHash() {
		t.Fatal("the commands changed nothing: the test checks nothing")
	}
}

// TestCaptureSharesOnlyWhatApplyNeverWrites walks a captured view beside
// the machine's state and fails on any pointer, map or non-empty slice
// they share, except the parts Capture documents as shared (the receipt
// chain, the membership, and slices Apply only ever replaces). A field
// added to the state that Capture does not copy fails here even if no
// test command writes it in place.
// runProperty runs the same check on each seed's final state.
func TestCaptureSharesOnlyWhatApplyNeverWrites(t *testing.T) {
	m, _ := busy(t)
	checkCaptureShares(t, m)
}

func checkCaptureShares(t testing.TB, m *Machine) {
	t.Helper()
	v := m.Capture()
	shared := map[string]bool{
		"Receipts": true, "Membership": true, // append-only; copy-on-write
		"Reports.Sig": true, "Reports.Cite": true, "Verdicts.Agreeing": true, "Verdicts.Sig": true,
		"Jobs.Delegated.Shards": true,
	}
	var walk func(path string, a, b reflect.Value)
	walk = func(path string, a, b reflect.Value) {
		if shared[path] {
			return
		}
		switch a.Kind() {
		case reflect.Pointer:
			if a.IsNil() || b.IsNil() {
				return
			}
			if a.Pointer() == b.Pointer() {
				t.Errorf("%s: the view shares the machine's pointer", path)
				return
			}
			walk(path, a.Elem(), b.Elem())
		case reflect.Map:
			if a.Len() > 0 && a.Pointer() == b.Pointer() {
				t.Errorf("%s: the view shares the machine's map", path)
				return
			}
			for _, k := range a.MapKeys() {
				walk(path, a.MapIndex(k), b.MapIndex(k))
			}
		case reflect.Slice:
			if a.Len() > 0 && b.Len() > 0 && a.Pointer() == b.Pointer() {
				t.Errorf("%s: the view shares the machine's slice", path)
				return
			}
			for i := range min(a.Len(), b.Len()) {
				walk(path, a.Index(i), b.Index(i))
			}
		case reflect.Struct:
			for i := range a.NumField() {
				f := a.Type().Field(i)
				p := f.Name
				if path != "" && !f.Anonymous {
					p = path + "." + f.Name
				} else if f.Anonymous {
					p = path
				}
				walk(strings.TrimPrefix(p, "Jobs.Shards."), a.Field(i), b.Field(i))
			}
		}
	}
	walk("", reflect.ValueOf(v.st), reflect.ValueOf(m.st))
}
