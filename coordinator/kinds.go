package coordinator

import (
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// ShardKind is what a shard is for, as a lease request names it: a
// training round's shard (its job is a round of a run, assigned to one
// silo) or generic pool work (sweeps, Monte Carlo, everything else).
type ShardKind string

const (
	KindRound   ShardKind = "round"
	KindGeneric ShardKind = "generic"
)

// Kinds is the set of shard kinds a lease may grant. Empty means every
// kind: the request of a client that does not say (a worker, or a silo
// older than lease kinds), which gets what it always got.
//
// A silo says: it asks for rounds alone, and for generic shards only
// when its policy takes them (silo/appliance.go), so the pool never
// grants it a shard it would hand back.
type Kinds []ShardKind

// Has reports whether k admits kind.
func (k Kinds) Has(kind ShardKind) bool { return len(k) == 0 || slices.Contains(k, kind) }

// Admits reports whether k admits j's shards.
func (k Kinds) admits(j *jobState) bool { return k.Has(kindOf(j)) }

// Check refuses unknown or repeated kinds.
func (k Kinds) Check() *diag.Diagnostic {
	for i, kind := range k {
		if kind != KindRound && kind != KindGeneric {
			return diag.New(diag.PoolBadRequest, "lease kinds", "unknown shard kind %q", kind).
				WithHelp("ask for %q, %q or both (none: every kind)", KindRound, KindGeneric)
		}
		if slices.Contains(k[:i], kind) {
			return diag.New(diag.PoolBadRequest, "lease kinds", "shard kind %q is named twice", kind).
				WithHelp("name each kind once")
		}
	}
	return nil
}

// kindOf is the kind of j's shards.
func kindOf(j *jobState) ShardKind {
	if j.Run != "" {
		return KindRound
	}
	return KindGeneric
}

// memoKey is where a peer's lease request of kinds is remembered
// (state.LeaseMemo): a peer that leases each kind with its own requests
// (a silo's round and generic lanes) keeps one memo per set of kinds, so
// a retry of one is not answered as — or forgotten for — the other.
func memoKey(peer string, kinds Kinds) string {
	if len(kinds) == 0 {
		return peer
	}
	key := peer
	for _, k := range kinds {
		key += "\x00" + string(k)
	}
	return key
}

// Bulk reports whether c is a pool's bulk traffic: a lease that asks for
// no training round (a worker's, or a silo's generic lane), or the
// commitments, reports, renewals and releases of generic jobs' shards,
// alone or all of a batch. A node commits bulk commands after any other
// waiting (consensus.Node.ApplyBulk), so a training round's steps never
// queue behind a sweep's stream of reports. It reads the state as of the
// last applied command; it decides only the order of proposals, never
// what a command does.
func (m *Machine) Bulk(c Command) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.bulk(c)
}

func (m *Machine) bulk(c Command) bool {
	generic := func(job content.Ref) bool {
		j := m.jobs[string(job)]
		return j != nil && kindOf(j) == KindGeneric
	}
	switch c := c.(type) {
	case Lease:
		return len(c.Kinds) == 0 || !slices.Contains(c.Kinds, KindRound)
	case CommitResult:
		return generic(c.Job)
	case ReportResult:
		return generic(c.Job)
	case RenewLease:
		return generic(c.Job)
	case ReleaseLeases:
		for _, s := range c.Shards {
			if !generic(s.Job) {
				return false
			}
		}
		return len(c.Shards) > 0
	case Batch:
		for _, cmd := range c.Commands {
			if !m.bulk(cmd) {
				return false
			}
		}
		return len(c.Commands) > 0
	}
	return false
}
