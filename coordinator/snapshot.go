package coordinator

import (
	"bytes"
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
// Two machines with equal snapshots are in the same state.
func (m *Machine) Snapshot() []byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.snapshot()
}

func (m *Machine) snapshot() []byte {
	b, err := content.Encode(&m.st)
	if err != nil {
		panic("coordinator: state is not encodable: " + err.Error())
	}
	return b
}

// StateHash is the content hash of Snapshot: replicas that applied the same
// log have the same StateHash.
func (m *Machine) StateHash() content.Ref {
	return content.Hash(m.Snapshot())
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
	restored := &Machine{st: st, jobs: jobs, nextExpiry: math.MinInt64}
	if again := restored.snapshot(); !bytes.Equal(again, b) {
		return bad("not in canonical encoding (unknown fields, or non-canonical CBOR)")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.st, m.jobs, m.nextExpiry = restored.st, restored.jobs, restored.nextExpiry
	return nil
}
