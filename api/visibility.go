package api

import (
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/trust"
)

// Law 13: nothing undecided is visible. Until a shard is decided, no
// member but the aggregators sees any report's result hash (job view,
// event stream) or result bytes (blob endpoint); otherwise a lazy peer
// could lease the shard, copy the first report's hash and be counted as an
// agreeing replica. Commitments are never shown at all.

// seesUndecided reports whether m may see undecided results: the
// aggregators (coordinator replicas and reducer peers) only.
func seesUndecided(m identity.Member) bool { return m.Role == identity.Aggregator }

// redactJob removes, for a viewer who may not see them, the result hashes
// of reports on undecided shards.
func redactJob(js *coordinator.JobStatus, m identity.Member) {
	if seesUndecided(m) {
		return
	}
	for i := range js.Shards {
		s := &js.Shards[i]
		if s.State != coordinator.StatePending && s.State != coordinator.StateLeased {
			continue
		}
		for k := range s.Reports {
			s.Reports[k].Result = ""
		}
	}
}

// redactEvent removes, for a viewer who may not see it, the result hash of
// a report event (a report is on an undecided shard when it is made; the
// decision, if it follows, carries the canonical hash in its own event).
func redactEvent(e coordinator.Event, m identity.Member) coordinator.Event {
	if r, ok := e.(coordinator.ResultReported); ok && !seesUndecided(m) {
		r.Result = ""
		return r
	}
	return e
}

// BlobReadable decides whether member m may read a blob that use says is
// a reported result: aggregators always; nobody else while any shard it
// was reported on is undecided; after the decision, every member when the
// job's regime is own or consortium (named members), and in an open pool
// only the job's submitter and operators. A blob that is no report's
// result (bundles, content, inputs, reduced results) is readable by every
// member who can name its hash.
func BlobReadable(use coordinator.ResultUse, m identity.Member) bool {
	switch {
	case seesUndecided(m):
		return true
	case use.Undecided:
		return false
	case len(use.Decided) == 0:
		return true
	}
	for _, j := range use.Decided {
		if j.Regime != trust.Open || m.Role == identity.Operator || (j.Submitter != "" && j.Submitter == m.Name) {
			return true
		}
	}
	return false
}
