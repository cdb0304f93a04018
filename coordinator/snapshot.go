package coordinator

import (
	"bytes"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// Snapshot returns the canonical encoding (deterministic CBOR) of the
// whole state: pool config, clock, jobs with their shards, leases, reports
// and decisions, peer records, lease-request memos and the receipt chain.
// Two machines with equal snapshots are in the same state. It is
// Capture().Encode(): the lock is held only for the capture.
func (m *Machine) Snapshot() []byte {
	return m.Capture().Encode()
}

func (m *Machine) snapshot() []byte {
	return encodeState(&m.st)
}

func encodeState(st *state) []byte {
	b, err := content.Encode(st)
	if err != nil {
		panic("coordinator: state is not encodable: " + err.Error())
	}
	return b
}

// StateHash is the content hash of Snapshot: replicas that applied the same
// log have the same StateHash. Like Snapshot it holds the lock only to
// capture the state, so a status query does not stall Apply while it
// encodes.
func (m *Machine) StateHash() content.Ref {
	return content.Hash(m.Snapshot())
}

// View is a consistent, immutable view of a machine's whole state, taken
// by Capture. Encode returns exactly the bytes Snapshot would have
// returned at the moment of the capture, however many commands the
// machine applied since; it may run on any goroutine, alongside Apply.
type View struct {
	st state
}

// Capture takes a View of the whole state, under the machine's lock. It
// is cheap next to encoding (no CBOR, no hashing): it is what a Raft
// snapshot does on the apply goroutine, leaving the encoding to the
// snapshot's writer (see docs/consensus.md, Snapshots).
//
// What it copies follows how Apply changes the state (state.go): the
// receipt chain only grows (mint appends; existing receipts and the
// slices they hold are never written), so the view keeps a prefix of it,
// capped so that no append can reach it. Jobs, shards, peer records,
// lease memos and runs change in place, so each is copied, with every
// slice Apply may write in place. Slices that Apply only ever replaces,
// never writes into (a receipt's peers, a report's signature, a
// delegation's shard list, a verdict's agreeing list), and the
// membership, which membership.go replaces on every change
// (copy-on-write), are shared.
func (m *Machine) Capture() *View {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return &View{st: m.st.capture()}
}

// Encode returns the canonical encoding of the captured state: the bytes
// Snapshot returned when the view was captured.
func (v *View) Encode() []byte { return encodeState(&v.st) }

// capture returns a copy of st that shares nothing Apply writes in place.
// Nil and empty slices and maps stay as they were: a field without
// omitempty encodes them differently.
func (st *state) capture() state {
	c := *st
	n := len(st.Receipts)
	c.Receipts = st.Receipts[:n:n]
	if st.Jobs != nil {
		c.Jobs = make([]*jobState, len(st.Jobs))
		for i, j := range st.Jobs {
			c.Jobs[i] = j.capture()
		}
	}
	if st.Peers != nil {
		c.Peers = make(map[string]*PeerRecord, len(st.Peers))
		recs := make([]PeerRecord, 0, len(st.Peers))
		for name, p := range st.Peers {
			if p == nil {
				c.Peers[name] = nil
				continue
			}
			recs = append(recs, *p)
			c.Peers[name] = &recs[len(recs)-1]
		}
	}
	if st.LeaseMemo != nil {
		c.LeaseMemo = make(map[string]*leaseMemo, len(st.LeaseMemo))
		for name, memo := range st.LeaseMemo {
			if memo != nil {
				memo = &leaseMemo{RequestID: memo.RequestID, Grants: slices.Clone(memo.Grants)}
			}
			c.LeaseMemo[name] = memo
		}
	}
	if st.Runs != nil {
		c.Runs = make([]*runState, len(st.Runs))
		for i, r := range st.Runs {
			if r != nil {
				rc := *r
				rc.Silos, rc.Jobs, rc.Models = slices.Clone(r.Silos), slices.Clone(r.Jobs), slices.Clone(r.Models)
				r = &rc
			}
			c.Runs[i] = r
		}
	}
	return c
}

// capture copies j and its shards. Its allocations do not grow with the
// shards: one array holds every shard, and one per element type every
// slice of theirs.
func (j *jobState) capture() *jobState {
	if j == nil {
		return nil
	}
	c := *j
	c.ReductionChecks = slices.Clone(j.ReductionChecks)
	c.Delegated = cloneDelegation(j.Delegated)
	if j.Shards == nil {
		return &c
	}
	var nStrings, nLeases, nCommits, nReports, nVerdicts int
	for _, s := range j.Shards {
		if s != nil {
			nStrings += len(s.Holders) + len(s.Agreeing) + len(s.Losers)
			nLeases += len(s.Leases)
			nCommits += len(s.Commits)
			nReports += len(s.Reports)
			nVerdicts += len(s.Verdicts)
		}
	}
	strs, leases, commits := newArena[string](nStrings), newArena[lease](nLeases), newArena[commitment](nCommits)
	reports, verdicts := newArena[report](nReports), newArena[verdictRecord](nVerdicts)
	c.Shards = make([]*shardState, len(j.Shards))
	shards := make([]shardState, len(j.Shards))
	for i, s := range j.Shards {
		if s == nil {
			continue
		}
		shards[i] = *s
		sc := &shards[i]
		sc.Holders, sc.Agreeing, sc.Losers = strs.clone(s.Holders), strs.clone(s.Agreeing), strs.clone(s.Losers)
		sc.Leases, sc.Commits = leases.clone(s.Leases), commits.clone(s.Commits)
		sc.Origins = maps.Clone(s.Origins)
		sc.Reports, sc.Verdicts = reports.clone(s.Reports), verdicts.clone(s.Verdicts)
		c.Shards[i] = sc
	}
	return &c
}

// arena hands out copies of slices, carved from one allocation.
type arena[T any] struct{ buf []T }

func newArena[T any](n int) *arena[T] { return &arena[T]{buf: make([]T, 0, n)} }

// clone returns a copy of s (nil if s is nil), capped so that appending to
// it cannot reach the next copy.
func (a *arena[T]) clone(s []T) []T {
	if s == nil {
		return nil
	}
	n := len(a.buf)
	a.buf = append(a.buf, s...)
	return a.buf[n:len(a.buf):len(a.buf)]
}

// Load returns a machine restored from a snapshot.
func Load(b []byte) (*Machine, error) {
	m := &Machine{}
	if err := m.Restore(b); err != nil {
		return nil, err
	}
	return m, nil
}

// Restore replaces m's whole state with a snapshot's. It accepts only the
// canonical encoding of a consistent state (the receipt chain verifies,
// shards are in index order, job IDs are distinct), so afterwards
// StateHash is exactly the hash of b. On error m is unchanged.
func (m *Machine) Restore(b []byte) error {
	bad := func(format string, args ...any) error {
		return diag.New(diag.PoolBadSnapshot, "snapshot", format, args...).
			WithHelp("restore from another snapshot, or let the node catch up from the cluster's log")
	}
	var st state
	if err := content.Decode(b, &st); err != nil {
		return bad("cannot decode: %v", err)
	}
	if st.Format != snapshotFormat {
		return bad("format %q, want %q", st.Format, snapshotFormat)
	}
	if _, err := trust.ParseRegime(string(st.Regime)); err != nil {
		return bad("pool regime %q is unknown", st.Regime)
	}
	if err := receipt.Verify(st.Receipts); err != nil {
		return bad("receipt chain: %v", err)
	}
	jobs := make(map[string]*jobState, len(st.Jobs))
	for _, j := range st.Jobs {
		if j == nil || jobs[string(j.ID)] != nil {
			return bad("missing or duplicate job")
		}
		jobs[string(j.ID)] = j
		j.decided, j.cursor = 0, -1
		for i, s := range j.Shards {
			if s == nil || s.Index != i {
				return bad("job %s: shard %d missing or out of order", j.ID.Short(), i)
			}
			if s.State != StatePending {
				j.decided++
			} else if j.cursor < 0 {
				j.cursor = i
			}
		}
		if j.cursor < 0 {
			j.cursor = len(j.Shards)
		}
		if (j.decided == len(j.Shards)) != (j.State != JobRunning) {
			return bad("job %s is %s with %d of %d shards decided", j.ID.Short(), j.State, j.decided, len(j.Shards))
		}
	}
	for name, p := range st.Peers {
		if p == nil || p.Peer != name {
			return bad("peer record %q is inconsistent", name)
		}
	}
	for name, memo := range st.LeaseMemo {
		if memo == nil {
			return bad("lease memo of %q is empty", name)
		}
	}
	if ms := st.Membership; ms != nil {
		if d := checkMembers(ms.Members); d != nil || !slices.IsSortedFunc(ms.Members, func(a, b MemberEntry) int { return strings.Compare(a.Name, b.Name) }) || !slices.IsSorted(ms.Retired) {
			return bad("membership is not a sorted list of distinct members")
		}
	}
	restored := &Machine{st: st, jobs: jobs, results: indexResults(st.Jobs), nextExpiry: math.MinInt64}
	if again := restored.snapshot(); !bytes.Equal(again, b) {
		return bad("not in canonical encoding (unknown fields, or non-canonical CBOR)")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.st, m.jobs, m.results, m.nextExpiry = restored.st, restored.jobs, restored.results, restored.nextExpiry
	return nil
}
