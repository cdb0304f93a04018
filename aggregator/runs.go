package aggregator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/secagg"
	silopkg "github.com/scellis/scellis/silo"
	"github.com/scellis/scellis/trust"
)

// Training runs on the aggregator. A run is a chain of round jobs (law 1);
// the leader plans each round when the previous one is done, hosts its
// secure aggregation (the reducer peer's data plane, wire.Prefix), and
// reduces it: fl.ServerStep on the sum and the total weight only (law 7),
// the next global state stored as a blob on two nodes, and its round
// result document's hash reported through ReportReduced (law 3: the
// coordinator sees hashes only).

// Round parameters the aggregator fixes for every round.
const (
	// roundClip bounds each summed value, |x| ≤ 1e6. Secure aggregation
	// works in the 64-bit ring: with n ≤ 255 sites the sum needs
	// log2(255·1e6) ≈ 28 integer bits, which leaves about 2^-35 … 2^-40 of
	// fixed-point resolution (secagg picks f so that n·clip < 2^62): far
	// below the noise of DP and the precision SGD updates need. Updates
	// and summed metrics (a site's loss × examples, examples) fit well
	// inside it; DP clipping bounds the update far more tightly anyway.
	roundClip = 1e6
	// roundMaxWeight bounds a site's weight (its example count, or 1).
	roundMaxWeight = 1e9
	// statsClip bounds each summed value of the statistics and evaluation
	// steps:
	// Σx² of raw features over a site's rows (1e5-scale values over
	// thousands of rows) needs far more range than an update, and far
	// less resolution (255·1e12 < 2^48 leaves about 14 fractional bits).
	statsClip = 1e12
	// roundPriceBasis prices a round's shard: one work unit per silo.
	roundPriceBasis = "training round: 1 work unit per participating silo"
)

// roundThreshold is a round's secure-aggregation threshold: ⌊2n/3⌋+1
// (secagg.ActiveThreshold: private against an aggregator that equivocates
// about dropouts while colluding with fewer than n/3 sites; silos refuse a
// lower one unless their policy says secagg_threshold: majority), raised
// to the run's cohort.min so that no sum can be unmasked with fewer sites
// than the run promised (silos refuse a threshold below their own
// min_cohort), and at most n.
func roundThreshold(n, minCohort int) int {
	return min(n, max(secagg.ActiveThreshold(n), minCohort))
}

// runCtx is what the leader knows of a run from its spec blob.
type runCtx struct {
	canon *fl.Canonical
	strat *fl.Strategy
	cat   *catalog.Catalog
	// builtin: the strategy is a built-in entry (no source blob).
	builtin bool
}

// loadRun reads, checks and caches a run's canonical spec and strategy.
func (n *Node) loadRun(ctx context.Context, ref content.Ref) (*runCtx, error) {
	if v, ok := n.runCache.Load(ref); ok {
		return v.(*runCtx), nil
	}
	raw, err := n.planner.fetch(ctx, ref)
	if err != nil {
		return nil, err
	}
	var canon fl.Canonical
	if err := content.Decode(raw, &canon); err != nil {
		return nil, diag.New(diag.PoolBadJob, "run "+ref.Short(), "not a run spec: %v", err).
			WithHelp("upload the run's canonical spec (fl.Canonical, content.Encode) and launch its ref")
	}
	again, err := content.Encode(&canon)
	if err != nil || !bytes.Equal(again, raw) || canon.Format == "" {
		return nil, diag.New(diag.PoolBadJob, "run "+ref.Short(), "the run spec blob is not a canonical run spec (format %q)", canon.Format).
			WithHelp("upload exactly the canonical encoding of the resolved run (RunSpec.Resolve)")
	}
	rc := &runCtx{canon: &canon, cat: n.planner.builtin}
	e, ok := n.planner.builtin.Lookup(string(canon.Strategy))
	if ok {
		rc.builtin = true
	} else {
		src, err := n.planner.fetch(ctx, canon.Strategy)
		if err != nil {
			return nil, err
		}
		name := canon.Spec.Strategy
		if name == "" || strings.ContainsAny(name, "/\\") {
			name = "strategy"
		}
		if e, err = catalog.Parse(name+".star", src); err != nil {
			return nil, err
		}
		if rc.cat, err = catalog.Builtin(); err != nil {
			return nil, err
		}
		if err := rc.cat.Add(e); err != nil {
			return nil, err
		}
	}
	if rc.strat, err = fl.NewStrategy(e, canon.Params()); err != nil {
		return nil, err
	}
	if _, err := rc.cat.Closure(e); err != nil {
		return nil, err
	}
	n.runCache.Store(ref, rc)
	return rc, nil
}

// PlanRun implements api.RunPlanner: the StartRun of a launched run.
func (n *Node) PlanRun(ctx context.Context, req api.RunRequest, submitter string) (coordinator.StartRun, error) {
	rc, err := n.loadRun(ctx, req.Spec)
	if err != nil {
		return coordinator.StartRun{}, err
	}
	spec := rc.canon.Spec
	subject := "run " + spec.Name
	if req.Strategy != "" && req.Strategy != rc.canon.Strategy {
		return coordinator.StartRun{}, diag.New(diag.PoolBadRequest, subject, "the request names strategy %s but the spec resolves it to %s",
			req.Strategy.Short(), rc.canon.Strategy.Short()).WithHelp("send the strategy ref of the canonical spec, or none")
	}
	refs := []content.Ref{req.Spec}
	if !rc.builtin {
		refs = append(refs, rc.canon.Strategy)
	}
	if rc.canon.Trainer != "" {
		refs = append(refs, rc.canon.Trainer) // silos fetch it (trainer runs)
	}
	for _, ref := range refs {
		if err := n.durable(ctx, ref); err != nil {
			return coordinator.StartRun{}, err
		}
	}
	cohort, err := n.cohort(spec)
	if err != nil {
		return coordinator.StartRun{}, err
	}
	// A cohort led by child clusters is summed there (hier.go): refused
	// at launch when it cannot be.
	if byChild, err := n.hierCohort(subject, cohort, spec.MinCohort); err != nil {
		return coordinator.StartRun{}, err
	} else if byChild != nil && spec.AggregationMode() == fl.AggThresholdHE {
		return coordinator.StartRun{}, heOverTree(subject)
	}
	if spec.WarmStart != "" {
		// A model that does not fit is refused at launch, not at round 0.
		if _, err := n.initialGlobal(ctx, n.env(rc, req.Spec, 0), rc.strat.With(map[string]any{"round": int64(0), "sites": int64(len(cohort))}), rc); err != nil {
			return coordinator.StartRun{}, err
		}
		if err := n.durable(ctx, spec.WarmStart); err != nil {
			return coordinator.StartRun{}, err
		}
	}
	return coordinator.StartRun{
		// Rounds counts the run's steps: statistics, training rounds, final evaluation.
		Run: req.Spec, Name: spec.Name, Rounds: spec.StepCount(), Silos: cohort, Submitter: submitter,
		DP: spec.DP, SecureAgg: spec.SecureAgg,
		// A silo's training data is confidential unless proven otherwise.
		Dataset: trust.Item{Name: spec.Dataset, Class: trust.Confidential},
		Models:  spec.Classed(),
	}, nil
}

// cohort returns the run's silos: the spec's, or every silo of the
// federation, sorted; each must be a silo member, and at least the spec's
// minimum cohort.
func (n *Node) cohort(spec fl.RunSpec) ([]string, error) {
	subject := "run " + spec.Name
	var out []string
	var problems diag.List
	if len(spec.Silos) == 0 {
		for _, m := range n.fed.ByRole(identity.Silo) {
			out = append(out, m.Name)
		}
	}
	for _, s := range spec.Silos {
		if m, ok := n.fed.Member(s); !ok || m.Role != identity.Silo {
			problems = append(problems, diag.New(diag.RunBadRound, subject, "cohort member %q is not a silo of federation %q", s, n.fed.Name).
				WithHelp("name silos as the federation file does"))
			continue
		}
		out = append(out, s)
	}
	if len(problems) > 0 {
		return nil, problems
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if need := max(spec.MinCohort, coordinator.MinSites); len(out) < need {
		return nil, diag.New(diag.RunTooFewSites, subject, "the cohort has %d silos; the run needs at least %d", len(out), need).
			WithHelp("with two sites each could subtract its own update from the sum and learn the other's; admit at least three")
	}
	return out, nil
}

// driveRuns is the leader's run duty, once per leaderDuties pass: for
// every running run whose retry time has come and that no goroutine here
// drives, drive it (driveRun). ctx ends when this node stops leading.
func (n *Node) driveRuns(ctx context.Context, m *coordinator.Machine) {
	now := time.Now().UnixMilli()
	for _, st := range m.Runs() {
		if st.State == coordinator.RunPaused {
			n.resumeHealed(ctx, st, now) // resume.go
			continue
		}
		if st.State != coordinator.RunRunning || st.RetryAt > now {
			continue
		}
		if _, busy := n.activeRuns.LoadOrStore(st.ID, struct{}{}); busy {
			continue
		}
		n.done.Add(1)
		go func(id content.Ref) {
			defer n.done.Done()
			defer n.activeRuns.Delete(id)
			if err := n.driveRun(ctx, id); err != nil && ctx.Err() == nil {
				n.log.Warn("training round", "run", id.Short(), "err", err)
			}
		}(st.ID)
	}
}

// driveRun plans, hosts and reduces a run's next round, or restarts a
// round that an earlier leader opened (its secure aggregation state was in
// that process: the round starts again under a new round ID, and every silo
// that already paid for it re-sends the update it paid for). The run is
// read again here, once this goroutine holds the run: the pass's view may
// predate the round a goroutine that just ended completed, and planning
// from it re-planned a finished round.
//
// A round that completes is followed at once by the run's next round, in
// this goroutine (issue 19): left to the next leaderDuties pass, the next
// round waited for another event or the duty tick (up to 200 ms), since
// the event of the round's own ReportReduced arrives while this goroutine
// still holds the run. It goes on only while rounds complete, so a round
// that makes no progress (retried, refused, a new tenure) hands the run
// back to the passes as before.
func (n *Node) driveRun(ctx context.Context, id content.Ref) error {
	for done := -1; ; {
		m := n.fsm.machine()
		st, err := m.Run(id)
		if err != nil || st.State != coordinator.RunRunning || st.RetryAt > time.Now().UnixMilli() {
			return nil
		}
		if done >= 0 && len(st.Models) <= done {
			return nil // the last round did not complete: the passes take it from here
		}
		if k := len(st.Jobs); k > 0 {
			if js, err := m.Job(st.Jobs[k-1]); err == nil && js.State != coordinator.JobDone && js.State != coordinator.JobAbandoned {
				return n.retryRound(ctx, st, js.ID, false,
					fmt.Sprintf("round %d was opened by an earlier leader; its secure aggregation starts again under a new round ID", js.Round))
			}
		}
		if len(st.Models) >= st.Rounds || ctx.Err() != nil {
			return nil
		}
		done = len(st.Models)
		if err := n.runRound(ctx, st); err != nil {
			return err
		}
	}
}

// retryRound ends the current attempt of st's next round (job, if one was
// submitted). A failed attempt counts toward Options.RoundAttempts and the
// next waits a backoff; a lost host (failed false) is retried at once. A
// failed attempt here is one that can heal by itself (silos unreachable, a
// secure aggregation that lost its sites, a blob no node served): a run it
// pauses resumes once enough silos are alive (resume.go); retryFault is
// for the rest.
func (n *Node) retryRound(ctx context.Context, st coordinator.RunStatus, job content.Ref, failed bool, reason string) error {
	return n.retryAttempt(ctx, st, job, failed, failed, reason)
}

// retryFault ends an attempt that failed in a way the same inputs repeat
// (the server step or the statistics fail on the sum): it counts, and a
// run it pauses waits for a person (fl resume), with its reason.
func (n *Node) retryFault(ctx context.Context, st coordinator.RunStatus, job content.Ref, reason string) error {
	return n.retryAttempt(ctx, st, job, true, false, reason)
}

// haltRound ends an attempt whose outcome cannot be trusted (the
// cross-check failed): the run is paused at once, and waits for a person.
func (n *Node) haltRound(ctx context.Context, st coordinator.RunStatus, job content.Ref, reason string) error {
	return n.retryAttemptMax(ctx, st, job, true, false, reason, st.Failures+1)
}

// retryAttempt proposes RetryRound. The backoff doubles per failed attempt
// and per automatic resume of the round (resume.go). A failure that heals
// is not counted when this leader caused it (selfInflicted).
func (n *Node) retryAttempt(ctx context.Context, st coordinator.RunStatus, job content.Ref, failed, heals bool, reason string) error {
	return n.retryAttemptMax(ctx, st, job, failed, heals, reason, n.roundAttempts())
}

// retryAttemptMax is retryAttempt pausing the run after maxAttempts
// failed attempts in a row.
func (n *Node) retryAttemptMax(ctx context.Context, st coordinator.RunStatus, job content.Ref, failed, heals bool, reason string, maxAttempts int) error {
	if len(reason) > 1000 {
		reason = reason[:1000]
	}
	now := time.Now()
	retryAt := now
	if failed {
		retryAt = now.Add(n.backoff(st.Failures + st.Resumes))
		if why := n.selfInflicted(ctx, job, heals); why != "" {
			failed = false
			reason += "; not counted: " + why
		}
	}
	res, err := n.Apply(ctx, coordinator.RetryRound{
		Run: st.ID, Round: len(st.Models), Job: job, Reason: reason, Failed: failed, Heals: heals,
		MaxAttempts: maxAttempts, RetryAt: retryAt.UnixMilli(), Now: now.UnixMilli(),
	})
	if err != nil {
		return err
	}
	if len(res.Refusal) > 0 {
		if stale(res.Refusal) {
			return nil // the run moved on meanwhile
		}
		return fmt.Errorf("retrying the round refused: %v", res.Refusal)
	}
	var out coordinator.RetryRoundResponse
	if json.Unmarshal(res.Response, &out) == nil && out.State == coordinator.RunPaused {
		n.log.Warn("training run paused", "run", st.ID.Short(), "round", len(st.Models), "failures", out.Failures, "heals", heals, "reason", reason)
	} else {
		n.log.Info("training round retried", "run", st.ID.Short(), "round", len(st.Models), "failed", failed, "reason", reason)
	}
	return nil
}

// stale reports whether a refusal only says that the proposer's view of
// the run was out of date (the round was planned, finished or the run
// paused meanwhile): nothing to do, the next pass sees the new state.
func stale(ds diag.List) bool {
	for _, d := range ds {
		if d.Code != diag.RunBadRound && d.Code != diag.RunNotRunning {
			return false
		}
	}
	return len(ds) > 0
}

// roundAttempts is how many failed attempts of one round pause its run.
func (n *Node) roundAttempts() int {
	if n.opt.RoundAttempts > 0 {
		return n.opt.RoundAttempts
	}
	return 5
}

// backoff is the wait before the next attempt of a round that failed
// failures times already (plus the times the leader resumed it):
// RetryBackoff doubled per failure, at most a minute.
func (n *Node) backoff(failures int) time.Duration {
	d := n.opt.RetryBackoff
	if d <= 0 {
		d = time.Second
	}
	for range min(failures, 16) {
		d *= 2
	}
	return min(d, time.Minute)
}

// roundID names a secure-aggregation round: fresh for every round job of
// every run (the coordinator admits one job per round number while it is
// open; a retried round is a later job, hence a new ID).
func roundID(run content.Ref, round, attempt int) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("scellis/secagg-round/v1\x00%s\x00%d\x00%d", run, round, attempt)))
	return hex.EncodeToString(h[:16])
}

// roundJobID is the round job's ID: the hash of its bundle.
func roundJobID(bundle content.Ref) (content.Ref, error) {
	return content.HashOf(struct {
		Format string      `cbor:"format"`
		Bundle content.Ref `cbor:"bundle"`
	}{"scellis/round-job/v1", bundle})
}

func (n *Node) env(rc *runCtx, run content.Ref, round int) script.Env {
	seed := sha256.Sum256([]byte(fmt.Sprintf("scellis/round-server/v1\x00%s\x00%d", run, round)))
	return script.Env{Catalog: rc.cat, Seed: seed[:]}
}

// awaitReports waits until every contributor's shard of the round job is
// decided, or ReportGrace passes. It wakes on the job's events from the
// hub (every applied report publishes one), never on a tick: a
// subscription dropped for falling behind is taken again, and the state is
// read again after it, so no event is missed in between. A contributor
// whose lease lapses (a silo killed between sending its input and
// reporting) is not waited for: it wakes on the lost poll or at the
// lapse's moment, and the shard is flagged at once instead of after the
// whole grace.
func (n *Node) awaitReports(ctx context.Context, job content.Ref, contributors []string) {
	grace := n.opt.ReportGrace
	if grace <= 0 {
		grace = 2 * time.Minute
	}
	events, cancel := n.hub.Subscribe(job)
	defer func() { cancel() }()
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	lapse := time.NewTimer(time.Hour)
	defer lapse.Stop()
	for {
		gone := n.peerGone.wait()
		js, err := n.fsm.machine().Job(job)
		if err != nil || js.State != coordinator.JobRunning {
			return
		}
		pending, next := false, time.Hour
		for _, s := range js.Shards {
			if s.State != coordinator.StateVerified && s.State != coordinator.StateUnverified && slices.Contains(contributors, s.Peer) {
				who := s.Peer
				if s.Via != "" {
					who = s.Via // the child cluster reports for its silo
				}
				if d := n.lapsesIn(who); d >= 0 {
					pending, next = true, min(next, d)
				}
			}
		}
		if !pending {
			return
		}
		lapse.Reset(next + time.Millisecond)
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-gone:
		case <-lapse.C:
		case _, ok := <-events:
			if !ok {
				// Dropped for falling behind: subscribe again; the
				// loop reads the job's state before waiting.
				cancel()
				events, cancel = n.hub.Subscribe(job)
			}
		}
	}
}

// flagDropped flags a round job's undecided shards.
func (n *Node) flagDropped(ctx context.Context, job content.Ref, reason string) error {
	return n.applyAccepted(ctx, coordinator.FlagDropped{Job: job, Reason: reason, Now: time.Now().UnixMilli()}, "flagging dropped silos")
}

func (n *Node) stopRun(ctx context.Context, run content.Ref, reason string) error {
	if len(reason) > 1000 {
		reason = reason[:1000]
	}
	n.log.Warn("stopping training run", "run", run.Short(), "reason", reason)
	return n.applyAccepted(ctx, coordinator.StopRun{Run: run, Reason: reason, Now: time.Now().UnixMilli()}, "stopping the run")
}

// applyAccepted applies cmd, and makes a refusal an error: what (the
// command, as a phrase) "refused: " the refusal.
func (n *Node) applyAccepted(ctx context.Context, cmd coordinator.Command, what string) error {
	res, err := n.Apply(ctx, cmd)
	if err != nil {
		return err
	}
	if len(res.Refusal) > 0 {
		return fmt.Errorf("%s refused: %v", what, res.Refusal)
	}
	return nil
}

// storeDurableAll stores every blob of bs here and on a second
// aggregator, and returns once both copies are durable. The blobs of one
// round step (its global model and bundle, its next model and result
// document) lie on the round's critical path, so the two copies are made
// at once rather than one after the other, and the blobs travel to the
// peers together (copyToAPeer: one request) and are written here side by
// side (blob.Store.PutBatch: one group commit) — a round step paid a local
// fsync, then a peer's round trip and fsync, per blob (docs/fl.md, where a
// round's time goes).
func (n *Node) storeDurableAll(ctx context.Context, bs ...[]byte) error {
	var local error
	here := make(chan struct{})
	go func() {
		defer close(here)
		_, local = n.blobs.PutBatch(bs)
	}()
	remote := n.copyAll(ctx, bs)
	<-here
	return errors.Join(local, remote)
}

// copyAll stores bs on a second aggregator: together in one request when
// they are small (copyToAPeer), else blob by blob, all at once
// (replicate).
func (n *Node) copyAll(ctx context.Context, bs [][]byte) error {
	peers := n.peers()
	if len(peers) == 0 {
		return nil
	}
	size := 0
	for _, b := range bs {
		size += len(b)
	}
	if n.peerClient != nil && len(bs) > 1 && len(bs) <= blob.MaxBatch && size <= durableBatchBytes && n.copyToAPeer(ctx, peers, bs) {
		return nil
	}
	errs := make([]error, len(bs))
	var wg sync.WaitGroup
	for i, b := range bs {
		wg.Go(func() { errs[i] = n.replicate(ctx, content.Hash(b), b) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// excuseDecliners watches a round job's reports: a silo that reports a
// declined (or failed) contribution will not join secure aggregation, so
// the host stops waiting for it instead of running into the join deadline.
func (n *Node) excuseDecliners(ctx context.Context, job content.Ref, round string, declines *sync.Map) {
	events, cancel := n.hub.Subscribe(job)
	defer cancel()
	check := func(silo string, result content.Ref) {
		status, codes, ok := n.reportedRecord(ctx, silo, result)
		if ok && status != silopkg.Contributed {
			if status == silopkg.Declined { // recorded before the excuse can end the round
				declines.Store(silo, codes)
			}
			n.excuse(round, silo)
		}
	}
	// Reports that landed before the subscription.
	if js, err := n.fsm.machine().Job(job); err == nil {
		for _, s := range js.Shards {
			for _, r := range s.Reports {
				check(r.Peer, r.Result)
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-events:
			if !ok {
				return
			}
			if rr, isReport := e.(coordinator.ResultReported); isReport {
				check(rr.Peer, rr.Result)
			}
		}
	}
}

// declinedEarlier returns the silos that declined an earlier attempt of
// st's round r (their contribution records, in the round jobs' reports:
// replicated, so a new leader reads the same), with their refusal codes.
// A silo's later rounds take it in again: its policy or budget may have
// changed (a budget is never raised, but a silo may be reconfigured), and
// if not it declines at the cost of one attempt.
func (n *Node) declinedEarlier(ctx context.Context, st coordinator.RunStatus, r int) map[string]string {
	out := map[string]string{}
	m := n.fsm.machine()
	for i := len(st.Jobs) - 1; i >= 0; i-- {
		js, err := m.Job(st.Jobs[i])
		if err != nil || js.Round != r {
			break // the jobs of earlier rounds come before: done
		}
		for _, sh := range js.Shards {
			for _, rep := range sh.Reports {
				if _, seen := out[rep.Peer]; seen {
					continue
				}
				if status, codes, ok := n.reportedRecord(ctx, rep.Peer, rep.Result); ok && status == silopkg.Declined {
					out[rep.Peer] = codes
				}
			}
		}
	}
	return out
}

// reportedRecord reads the contribution record a silo reported as a
// round job's result: its status and its refusal codes joined by "+".
// ok is false when the blob cannot be read or decoded, or is another
// silo's record.
func (n *Node) reportedRecord(ctx context.Context, silo string, result content.Ref) (status, codes string, ok bool) {
	b, err := n.fetchBlob(ctx, result)
	if err != nil {
		return "", "", false
	}
	sc, err := silopkg.DecodeContribution(b)
	if err != nil || sc.Record.Silo != silo {
		return "", "", false
	}
	var cs []string
	for _, rf := range sc.Record.Refusals {
		cs = append(cs, string(rf.Code))
	}
	return sc.Record.Status, strings.Join(cs, "+"), true
}

// staleBases returns, for a buffered-asynchronous run's round r, the
// global version each sampled silo last fetched and its staleness: a silo
// fetches the global published after each of its contributions, so it
// trains from the result of the last training round it took part in (or,
// never having taken part, from the global the first training round
// started from), and its staleness is the training server steps since.
// Silos whose version is the current global (gref) are left out.
func (n *Node) staleBases(ctx context.Context, st coordinator.RunStatus, r int, gref content.Ref, sampled []string) (map[string]fl.Base, error) {
	type step struct {
		round        int
		previous     content.Ref
		model        content.Ref
		participants []string
	}
	var trains []step // the run's completed training rounds, in order
	for k := 0; k < r && k < len(st.Models); k++ {
		b, err := n.fetchBlob(ctx, st.Models[k])
		if err != nil {
			return nil, err
		}
		rr, _, err := fl.DecodeRoundResult(b)
		if err != nil {
			return nil, err
		}
		if rr.Step == "" || rr.Step == fl.StepTrain {
			trains = append(trains, step{k, rr.Previous, rr.Model, rr.Participants})
		}
	}
	if len(trains) == 0 {
		return nil, nil
	}
	out := map[string]fl.Base{}
	for _, s := range sampled {
		base, tau := trains[0].previous, len(trains)
		for i := len(trains) - 1; i >= 0; i-- {
			if slices.Contains(trains[i].participants, s) {
				base, tau = trains[i].model, len(trains)-1-i
				break
			}
		}
		if tau > 0 && base != gref {
			out[s] = fl.Base{Global: base, Staleness: tau}
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}
