package aggregator

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/wire"
	"github.com/scellis/scellis/trust"
)

// A child cluster's part of a hierarchical round (hier.go; docs/tree.md,
// "Training runs"). The parent's round job pins each silo's shard to the
// silo and lets the child that leads it lease it (ShardPlan.Via). The
// delegate loop leases those shards like any other and, for a round:
//
//  1. copies the round's bundle, run spec, strategy and global model
//     from the parent (the silos fetch them from their own cluster);
//  2. opens the sub-cohort's secure-aggregation round on this leader's
//     host with the Params of the parent's bundle (the parent's key in
//     them: the child cannot open the sum, only relay it);
//  3. proposes the sub-job: the round's bundle, run and round number,
//     one shard per silo of the sub-cohort, each pinned to its silo;
//  4. with two or more sub-cohorts in the round, posts this child's
//     signed outer key to the parent's host as the round opens and
//     long-polls the other children's (wire.PostOuterKey,
//     FetchOuterKeys), checking each against the delegate keys of this
//     cluster's own copy of the parent federation (secagg.OuterMask);
//  5. takes the round's partial sum (wire.Host.WaitPartial), adds its
//     outer mask (so the parent cannot read the sub-cohort's sum, only
//     the total over all sub-cohorts) and forwards it to the parent's
//     host (wire.Forward, as the delegate);
//  6. waits for the contributors' reports, flags the silent silos, and
//     lets the loop report the decided sub-job upward like any other,
//     citing this cluster's chain head — only once the partial sum has
//     gone to the parent (delegator.unsent): a sub-cohort round that
//     fails reports nothing up.
//
// The sub-round lives in this leader's memory only. A round sub-job this
// leader did not open (its predecessor died), or whose round failed, is
// given up: its parent leases are handed back (the parent then ends its
// round and retries it under a new round ID) and it is cancelled here.

// roundJob is what the loop keeps of a parent round job.
type roundJob struct {
	b   fl.RoundBundle
	sub fl.SubCohort
	// host is the parent's secure-aggregation host (its Reducer's API).
	host string
}

// parentRound copies a parent round job's content here and returns the
// loop's record of it, or refuses it (pj.refused) when this cluster has
// no sub-cohort in it.
func (g *delegator) parentRound(ctx context.Context, st coordinator.JobStatus) (*parentJob, error) {
	raw, err := g.copyBlob(ctx, st.Bundle)
	if err != nil {
		return nil, fmt.Errorf("round bundle: %w", err)
	}
	var b fl.RoundBundle
	if err := content.Decode(raw, &b); err != nil || b.Format != fl.RoundFormat || b.Run != st.Run || b.Round != st.Round {
		return &parentJob{st: st, refused: fmt.Sprintf("its bundle %s is not the round's (%v)", st.Bundle.Short(), err)}, nil
	}
	sub, ok := b.SubCohortOf(g.d.Name)
	if !ok {
		return &parentJob{st: st, refused: "the round has no sub-cohort for " + g.d.Name}, nil
	}
	m, ok := g.d.Parent.Member(b.Reducer)
	if !ok || m.Role != identity.Aggregator || m.Address == "" {
		return &parentJob{st: st, refused: fmt.Sprintf("the round's host %q is no aggregator of the parent federation", b.Reducer)}, nil
	}
	refs := []content.Ref{st.Run, b.Global}
	if _, builtin := g.n.planner.builtin.Lookup(string(b.Strategy)); !builtin {
		refs = append(refs, b.Strategy)
	}
	for _, base := range b.Base {
		refs = append(refs, base.Global)
	}
	if err := g.copyBlobs(ctx, refs); err != nil {
		return nil, err
	}
	return &parentJob{st: st, copied: true, round: &roundJob{b: b, sub: *sub, host: "https://" + m.Address}}, nil
}

// proposeRound opens the sub-cohort's round here and proposes its
// sub-job. The grants must cover the whole sub-cohort: one round is one
// sub-job.
func (g *delegator) proposeRound(ctx context.Context, id content.Ref, lease string, grants []coordinator.LeaseGrant, pj *parentJob) error {
	rj := pj.round
	del, shards, err := g.subShards(id, lease, grants, pj, func(ps coordinator.ShardStatus) error {
		if ps.Via != g.d.Name || !slices.ContainsFunc(rj.sub.SecAgg.Members, func(m secagg.Member) bool { return m.ID == ps.Peer }) {
			return fmt.Errorf("the parent leased shard %d of silo %q, which is not in this cluster's sub-cohort", ps.Index, ps.Peer)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range shards { // each silo's shard stays its own here too
		shards[i].Peer = pj.st.Shards[del.Shards[i]].Peer
	}
	if len(shards) != len(rj.sub.SecAgg.Members) {
		return fmt.Errorf("the parent leased %d of the sub-cohort's %d shards; a round's sub-cohort is one sub-job (is delegate_batch below the sub-cohort's size?)", len(shards), len(rj.sub.SecAgg.Members))
	}
	round := rj.sub.SecAgg.Round
	bundle, err := g.forgedBundle(ctx, pj) // a test fault; "" otherwise
	if err != nil {
		return err
	}
	if bundle == "" {
		bundle = pj.st.Bundle
	}
	if err := g.n.sagg.Open(rj.sub.SecAgg, g.n.siloRoundDeadlines()); err != nil {
		return fmt.Errorf("opening the sub-cohort's round %s: %w", round, err)
	}
	sub := coordinator.SubJobID(del)
	g.mu.Lock()
	g.unsent[sub] = true // before its silos can report
	g.mu.Unlock()
	res, err := g.n.Apply(ctx, coordinator.SubmitJob{
		Job: sub, Name: fmt.Sprintf("%s (sub-cohort of %s)", pj.st.Name, g.d.Name), Bundle: bundle,
		Run: pj.st.Run, Round: pj.st.Round, Shards: shards, Delegated: &del, Submitter: g.d.Name,
		Inputs: []trust.Item{{Name: rj.b.Run.Short(), Class: trust.Confidential}},
		Policy: coordinator.Policy{Replicas: 1, LeaseTTL: pj.st.Policy.LeaseTTL}, Now: time.Now().UnixMilli(),
	})
	if err == nil && len(res.Refusal) > 0 {
		err = res.Refusal
	}
	if err != nil {
		g.mu.Lock()
		delete(g.unsent, sub)
		g.mu.Unlock()
		g.n.sagg.Abort(round, "its sub-job was not committed")
		return err
	}
	if g.rounds == nil {
		g.rounds = map[content.Ref]context.CancelFunc{}
	}
	rctx, cancel := context.WithCancel(g.ctx)
	g.rounds[sub] = cancel
	g.n.done.Add(1)
	go func() {
		defer g.n.done.Done()
		g.subRound(rctx, sub, pj)
	}()
	return nil
}

// subRound takes the sub-cohort's partial sum, forwards it to the
// parent, and settles the sub-job (see the file comment).
func (g *delegator) subRound(ctx context.Context, sub content.Ref, pj *parentJob) {
	rj := pj.round
	round := rj.sub.SecAgg.Round
	excuseCtx, stopExcusing := context.WithCancel(ctx)
	var declines sync.Map
	go g.n.excuseDecliners(excuseCtx, sub, round, &declines)
	go g.n.excuseLapsed(excuseCtx, round, rj.sub.SecAgg.Members)
	octx, stopOuter := context.WithCancel(ctx) // the outer keys' fetch, if the round fails first
	defer stopOuter()
	outer, keys, err := g.outerKeys(octx, pj)
	var ps *secagg.PartialSum
	if err == nil {
		ps, err = g.n.sagg.WaitPartial(ctx, round)
	}
	stopExcusing()
	if err == nil && outer != nil {
		err = g.outerMask(ctx, rj, outer, keys, ps)
	}
	if err == nil {
		err = g.forward(ctx, rj, ps)
	}
	g.mu.Lock()
	if err != nil {
		g.reported[sub] = true // nothing of a failed round goes up
	} else {
		delete(g.unsent, sub) // its shards go up once decided
	}
	g.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			g.giveUp(sub, fmt.Sprintf("its sub-cohort's round failed: %v", err))
		}
		return
	}
	select {
	case g.reportNow <- struct{}{}:
	default:
	}
	g.n.log.Info("delegate: forwarded a sub-cohort's partial sum", "run", rj.b.Run.Short(), "round", rj.b.Round, "survivors", len(ps.Survivors), "outer mask", outer != nil)
	g.n.awaitReports(ctx, sub, ps.Survivors)
	if js, err := g.n.fsm.machine().Job(sub); err == nil && js.State == coordinator.JobRunning {
		if err := g.n.flagDropped(ctx, sub, fmt.Sprintf("the sub-cohort's round summed %d of %d silos", len(ps.Survivors), len(rj.sub.SecAgg.Members))); err != nil && ctx.Err() == nil {
			g.n.log.Warn("delegate: flagging a sub-cohort's silent silos", "job", sub.Short(), "err", err)
		}
	}
}

// outerKeys draws this child's outer key for the round when it has two or
// more sub-cohorts (else it returns a nil mask: the parent's total is this
// sub-cohort's sum anyway), posts it to the parent's host and fetches the
// other children's keys in the background, bounded by the round's phase
// deadlines: the keys are in before the sub-cohort's partial sum, which
// takes the whole round.
func (g *delegator) outerKeys(ctx context.Context, pj *parentJob) (*secagg.OuterMask, <-chan outerFetch, error) {
	rj := pj.round
	if len(rj.b.SubCohorts) < 2 {
		return nil, nil, nil
	}
	o, err := secagg.NewOuterMask(rj.b.SecAgg.Round, rj.sub.SecAgg.Round, g.d.Name, g.d.Identity.PrivateKey())
	if err != nil {
		return nil, nil, err
	}
	hc, err := g.parentClient(rj)
	if err != nil {
		return nil, nil, err
	}
	post := o.Key()
	bad := g.badOuterKey(pj.st.Name, post) // a test fault; nil otherwise
	if bad != nil {
		post = bad
	}
	out := make(chan outerFetch, 1)
	g.n.done.Add(1)
	go func() {
		defer g.n.done.Done()
		defer hc.CloseIdleConnections()
		kctx, cancel := context.WithTimeout(ctx, g.n.siloRoundDeadlines().Total())
		defer cancel()
		err := wire.PostOuterKey(kctx, hc, rj.host, rj.b.SecAgg.Round, post)
		var keys *secagg.OuterKeys
		if err == nil {
			keys, err = wire.FetchOuterKeys(kctx, hc, rj.host, rj.b.SecAgg.Round)
		}
		out <- outerFetch{keys, err, bad != nil}
	}()
	return o, out, nil
}

// outerFetch is what outerKeys' background fetch found.
type outerFetch struct {
	keys *secagg.OuterKeys
	err  error
	// bad: this child posted testfault.BadOuterKey's key, not its own.
	bad bool
}

// outerMask adds this child's outer mask to ps once the other children's
// keys are in, each checked against the delegate key this cluster's
// parent_federation lists for its cluster (never a key the parent hands
// over).
func (g *delegator) outerMask(ctx context.Context, rj *roundJob, o *secagg.OuterMask, keys <-chan outerFetch, ps *secagg.PartialSum) error {
	var f outerFetch
	select {
	case f = <-keys:
	case <-ctx.Done():
		return ctx.Err()
	}
	if f.err != nil {
		return fmt.Errorf("the other children's outer keys: %w", f.err)
	}
	plan := make([]secagg.SubCohort, len(rj.b.SubCohorts))
	for i, sc := range rj.b.SubCohorts {
		plan[i] = secagg.SubCohort{Round: sc.SecAgg.Round, Cluster: sc.Cluster}
	}
	set := f.keys.Keys
	if f.bad {
		set = ownKeyBack(set, o.Key())
	}
	return o.Apply(rj.sub.SecAgg, ps, plan, set, func(cluster string) (ed25519.PublicKey, bool) {
		m, ok := g.d.Parent.Member(cluster)
		return m.PublicKey.Ed25519(), ok && m.Role == identity.Cluster
	})
}

// parentClient is an HTTP client to the parent's secure-aggregation host,
// as the delegate.
func (g *delegator) parentClient(rj *roundJob) (*http.Client, error) {
	cfg, err := identity.ClientTLSConfig(g.d.Identity, g.d.Parent, rj.b.Reducer, identity.Aggregator)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: api.Transport(cfg)}, nil
}

// forward posts the partial sum to the parent's host, as the delegate.
func (g *delegator) forward(ctx context.Context, rj *roundJob, ps *secagg.PartialSum) error {
	hc, err := g.parentClient(rj)
	if err != nil {
		return err
	}
	defer hc.CloseIdleConnections()
	fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return wire.Forward(fctx, hc, rj.host, rj.b.SecAgg.Round, ps)
}

// giveUp hands a round sub-job's parent leases back and cancels it here:
// the parent ends its round at once and retries it.
func (g *delegator) giveUp(sub content.Ref, why string) {
	js, err := g.n.fsm.machine().Job(sub)
	if err != nil || js.Delegated == nil {
		return
	}
	g.n.log.Warn("delegate: giving a round's sub-cohort back to the parent", "job", sub.Short(), "parent job", js.Delegated.Job.Short(), "why", why)
	var grants []coordinator.LeaseGrant
	for _, s := range js.Delegated.Shards {
		grants = append(grants, coordinator.LeaseGrant{Job: js.Delegated.Job, Shard: s})
	}
	g.release(js.Delegated.Job, grants)
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := g.n.Apply(cctx, coordinator.CancelJob{Job: sub, Peer: g.d.Name, Reason: why, Now: time.Now().UnixMilli()}); err != nil {
		g.n.log.Debug("delegate: cancelling a round sub-job", "job", sub.Short(), "err", err)
	}
}
