package aggregator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/verify"
)

// The second reducer: once a job is done, one other aggregator node — the
// first by name that is not the job's reducer — reduces the same accepted
// results itself (the same child-process reduction as the first) and
// reports its hash through the leader's API. Equal hashes confirm a
// replayable reduction; for a convergent job this node also compares the
// two result.json documents: everything but "result" must be
// byte-identical, and "result" within the job's tolerance.

// reductionRetry is how long a failed second reduction waits before the
// next try (a job whose reduction fails must not spin child processes).
const reductionRetry = 10 * time.Second

// checkReductions starts the second reduction of every done job this node
// is the second reducer of and has not checked yet.
func (n *Node) checkReductions(ctx context.Context, m *coordinator.Machine) {
	if n.peerClient == nil {
		return
	}
	for _, js := range m.JobsIn(coordinator.JobDone) {
		// Round jobs are reduced by their run's round (runs.go).
		if js.State != coordinator.JobDone || js.Run != "" || js.Reduced == "" || js.Reducer == n.Self.Name {
			continue
		}
		if n.secondReducer(js.Reducer) != n.Self.Name || slices.ContainsFunc(js.ReductionChecks, func(c coordinator.ReductionCheck) bool { return c.Peer == n.Self.Name }) {
			continue
		}
		key := "second/" + string(js.ID)
		if _, busy := n.reducing.LoadOrStore(key, struct{}{}); busy {
			continue
		}
		go func(js coordinator.JobStatus) {
			err := n.secondReduction(ctx, js)
			if err == nil {
				n.reducing.Delete(key)
				return
			}
			n.log.Warn("second reduction", "job", js.ID.Short(), "err", err)
			time.AfterFunc(reductionRetry, func() { n.reducing.Delete(key) })
		}(js)
	}
}

// secondReducer is the node that checks reducer's reductions.
func (n *Node) secondReducer(reducer string) string {
	var names []string
	for _, m := range n.fed.ByRole(identity.Aggregator) {
		if m.Name != reducer {
			names = append(names, m.Name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return slices.Min(names)
}

func (n *Node) secondReduction(ctx context.Context, js coordinator.JobStatus) error {
	ref, err := n.reduceJob(ctx, js.ID)
	if err != nil {
		return err
	}
	within := false
	if ref != js.Reduced && js.Policy.Check == coordinator.CheckCompare {
		if within, err = n.reductionsWithin(ctx, js, ref); err != nil {
			return err
		}
	}
	return n.peerClient.ReportReduced(ctx, api.ReducedReport{Job: js.ID, Reduced: ref, Within: within})
}

// reductionsWithin compares this node's result.json (mine) with the
// recorded one: identical but for "result", which must be within the
// job's tolerance.
func (n *Node) reductionsWithin(ctx context.Context, js coordinator.JobStatus, mine content.Ref) (bool, error) {
	tol, err := verify.ParseTolerance(js.Policy.Tolerance)
	if err != nil {
		return false, err
	}
	var docs [2]map[string]any
	for i, ref := range []content.Ref{mine, js.Reduced} {
		b, err := n.fetchBlob(ctx, ref)
		if err != nil {
			return false, err
		}
		if err := json.Unmarshal(b, &docs[i]); err != nil {
			return false, fmt.Errorf("result document %s: %w", ref.Short(), err)
		}
	}
	a, b := docs[0]["result"], docs[1]["result"]
	delete(docs[0], "result")
	delete(docs[1], "result")
	ra, _ := json.Marshal(docs[0])
	rb, _ := json.Marshal(docs[1])
	if !bytes.Equal(ra, rb) {
		return false, nil
	}
	return verify.Compare(a, b, tol).Within, nil
}
