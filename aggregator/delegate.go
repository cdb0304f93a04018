package aggregator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/testfault"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// A child cluster in a tree of coordinator clusters (docs/tree.md). Every
// node of a child cluster is configured with the parent federation, the
// delegate key (the key of the child's member entry, role cluster, in the
// parent federation) and that member's name. The node that leads the
// child runs the delegate loop:
//
//  1. lease up to Batch shards of the parent's jobs from the parent
//     cluster, as the delegate;
//  2. copy the parent job's bundle and content into this cluster's blob
//     store and propose a sub-job — the same bundle, restricted to those
//     shards, its coordinator.Delegation naming the parent job and shards
//     — to this cluster's Raft log;
//  3. keep the parent leases of every running sub-job alive (renewed as
//     one batch);
//  4. once a sub-job is decided (its shards verified by this cluster's
//     workers and verification regime), upload the verified results to
//     the parent and report them in batches, each signed by the delegate
//     key and citing this cluster's receipt chain head.
//
// What the loop has done lives in this cluster's replicated state (the
// sub-jobs), not in the leader's memory: a new leader renews and reports
// the sub-jobs the old one proposed. A sub-job already reported is found
// so on the parent (its shards decided there), and reporting again is a
// no-op there. A child that fails stops beating (beat), and the parent's
// leader revokes its parent leases on pooled shards at once (revokeGone),
// leasing the shards again, to another child.

// Delegate configures a node of a child cluster.
type Delegate struct {
	// Name is the child cluster's member name in the parent federation
	// (role cluster), whose key Identity holds.
	Name     string
	Identity *identity.Identity
	Parent   *identity.Federation
	// Batch is how many parent shards one lease asks for: one sub-job
	// (default 50); InFlight how many sub-jobs run at once (default 2).
	Batch, InFlight int
}

// CheckDelegate checks a child's delegate settings against the parent
// federation: the name is a member with the role cluster and the key is
// its key. The diagnostics name the parent federation file.
func CheckDelegate(d *Delegate) error {
	m, ok := d.Parent.Member(d.Name)
	switch {
	case !ok:
		return diag.New(diag.DelegateConfig, d.Name, "%q is not a member of the parent federation %s", d.Name, d.Parent.File).
			WithHelp("add the child cluster to the parent's federation file (role: cluster, public_key: the delegate key's public half), or fix delegate_name")
	case m.Role != identity.Cluster:
		return diag.New(diag.DelegateConfig, d.Name, "%s is a %s in the parent federation %s, not a cluster", d.Name, m.Role, d.Parent.File).
			At(m.Pos.File, m.Pos.Line, m.Pos.Col).
			WithHelp("a child cluster's member entry in its parent's federation has role: cluster")
	case !m.PublicKey.Equal(d.Identity.Public()):
		return diag.New(diag.DelegateConfig, d.Name, "the delegate key is not %s's key in the parent federation %s", d.Name, d.Parent.File).
			At(m.Pos.File, m.Pos.Line, m.Pos.Col).
			WithHelp("configure delegate_identity with the key whose public half the parent lists for %s (every node of the child cluster holds it)", d.Name)
	}
	return nil
}

// ProbeParent asks the parent cluster for its jobs as the delegate: a
// child that cannot reach its parent is refused at start (SC7602) rather
// than idling unseen.
func ProbeParent(ctx context.Context, d *Delegate) error {
	c, err := api.NewClient(d.Identity, d.Parent)
	if err != nil {
		return err
	}
	c.GiveUpAfter = 8 * time.Second
	if _, err := c.Jobs(ctx); err != nil {
		return diag.New(diag.DelegateUnreachable, d.Name, "no aggregator of the parent federation %s answered the delegate %s: %v", d.Parent.File, d.Name, err).
			WithHelp("start the parent cluster first, check the addresses in %s, and that the parent lists %s with this delegate key", d.Parent.File, d.Name)
	}
	return nil
}

// DefaultDelegateBatch is how many parent shards a sub-job takes when the
// config names no delegate_batch.
const DefaultDelegateBatch = 50

// DefaultDelegateInFlight is how many sub-jobs a child runs at once by
// default: two, so its workers compute one while the other is reported
// and the next lease is proposed.
const DefaultDelegateInFlight = 2

// delegator is a leader's delegate loop state for one tenure.
type delegator struct {
	n      *Node
	d      *Delegate
	parent *api.Client
	// parents caches what the loop needs of each parent job: its status
	// (bundle, policy, shard prices) and whether its blobs are here.
	parents map[content.Ref]*parentJob
	// reported: sub-jobs whose results went up in this tenure (or, for
	// a round sub-job whose sub-cohort round failed, never will).
	reported map[content.Ref]bool
	// unsent: round sub-jobs whose sub-cohort round this tenure opened
	// and whose partial sum has not gone to the parent yet. Their shards
	// are not reported up until it has (delegate_round.go, subRound): a
	// round that fails is the parent's to retry, and reports of its
	// shards (its silos' declines, say) would decide them there first —
	// the child's hand-back would then not end the parent's round, and
	// the retry would leave those silos out as decliners.
	unsent map[content.Ref]bool
	// reportNow wakes the reporter (reportLoop).
	reportNow chan struct{}
	// refused: parent jobs this cluster cannot serve (undelegable),
	// logged once.
	refused map[content.Ref]bool
	// leaseAfter: no lease before then (refusedBackoff).
	leaseAfter time.Time
	// mu guards parents, reported and unsent: the reporter
	// (reportLoop), the lease loop and the sub-rounds use them.
	mu sync.Mutex
	// inherited: sub-jobs already decided when this tenure began; an
	// earlier leader may have reported them (reportUp asks the parent).
	inherited map[content.Ref]bool
	// decidedUp: the parent's decided shards of each parent job, as read
	// in the current reporting pass (reportLoop's goroutine only).
	decidedUp map[content.Ref]map[int]bool
	// ctx is the tenure; rounds holds the round sub-jobs whose
	// sub-cohort round this tenure opened (delegate_round.go), each with
	// the cancel of its goroutine; gaveUp those it handed back. Both are
	// the lease loop's only.
	ctx    context.Context
	rounds map[content.Ref]context.CancelFunc
	gaveUp map[content.Ref]bool
	// idle: when each running pooled sub-job was last seen to move (a
	// worker's live lease on it, or one more shard decided), and its
	// decided count then; starved: sub-jobs handed back in a row for want
	// of a worker since any moved (handBackStalled). The lease loop's
	// only.
	idle    map[content.Ref]subProgress
	starved int
}

// subProgress is what handBackStalled last saw of a sub-job.
type subProgress struct {
	since   time.Time
	decided int
}

// errRefusedJob: the parent job is one a child cannot serve.
var errRefusedJob = errors.New("a parent job this cluster cannot serve")

// undelegable says why a parent job with policy p cannot be served by a
// child as built ("" when it can): a child reports each result once,
// outright (no commit–reveal), and its sub-job is verified by exact
// match; so a parent job of two or more replicas, or checked in the
// convergent tier or by Freivalds, stays with the parent's own peers.
func undelegable(p coordinator.Policy) string {
	switch {
	case p.Replicas > 1:
		return fmt.Sprintf("it needs %d agreeing replicas, and a child reports without commit–reveal", p.Replicas)
	case p.Check != "":
		return fmt.Sprintf("its shards are checked by %s, and a child's sub-job is verified by exact match", p.Check)
	case p.Mode == coordinator.ModeAdaptive:
		return "it is verified by spot checks, which audit peers, not clusters"
	}
	return ""
}

// tooFewPeers says why a child whose federation is fed cannot verify a
// pooled sub-job under its own regime ("" when it can): the sub-job gets
// the regime's default replicas, each on a distinct peer (a worker, a
// silo, or a child cluster of this one, which leases as one peer), so an
// open or consortium child with one worker would run every shard once and
// never decide it — holding the parent's shards until handBackStalled
// gave them back, then taking more.
func tooFewPeers(regime trust.Regime, fed *identity.Federation) string {
	need := coordinator.DefaultReplicas(regime)
	have := 0
	for _, r := range []identity.Role{identity.Worker, identity.Silo, identity.Cluster} {
		have += len(fed.ByRole(r))
	}
	if have >= need {
		return ""
	}
	return fmt.Sprintf("this cluster's %s regime verifies each shard on %d distinct peers, and its federation lists %d (workers, silos and child clusters)", regime, need, have)
}

type parentJob struct {
	st     coordinator.JobStatus
	copied bool
	// refused says why this cluster will not run the job's shards (its
	// inputs or models are not admissible under this cluster's regime);
	// nothing of such a job but its bundle is copied here.
	refused string
	// round: the job is a round of a training run (delegate_round.go).
	round *roundJob
}

// admitHere checks a parent job's bundle against this cluster's regime,
// as trust.Admit checks a job submitted here: its inputs' and models'
// classes and whether it is security-critical. The job's declared regime
// is the parent's, so it is not compared with this cluster's.
func admitHere(regime trust.Regime, b *job.Bundle) diag.List {
	req := trust.Request{Subject: "parent job " + b.Name, SecurityCritical: b.SecurityCritical}
	for _, name := range slices.Sorted(maps.Keys(b.Inputs)) {
		req.Inputs = append(req.Inputs, trust.Item{Name: name, Class: trust.Class(b.Inputs[name].Class)})
	}
	for _, k := range slices.Sorted(maps.Keys(b.Classes)) {
		req.Models = append(req.Models, trust.Item{Name: "the job's " + k, Class: trust.Class(b.Classes[k])})
	}
	return trust.Admit(regime, req)
}

// parentClient is a client of the parent as this node's delegate
// identity, or nil (logged under what) if the delegate's settings do not
// make one.
func (n *Node) parentClient(what string) *api.Client {
	d := n.opt.Delegate
	parent, err := api.NewClient(d.Identity, d.Parent)
	if err != nil {
		n.log.Error(what, "err", err)
		return nil
	}
	return parent
}

// delegateLoop runs while this node leads (ctx is the tenure).
func (n *Node) delegateLoop(ctx context.Context) {
	d := n.opt.Delegate
	parent := n.parentClient("delegate")
	if parent == nil {
		return
	}
	parent.Log = n.log
	decided := make(chan struct{}, 1)
	g := &delegator{n: n, d: d, parent: parent, parents: map[content.Ref]*parentJob{}, reported: map[content.Ref]bool{}, unsent: map[content.Ref]bool{}, reportNow: decided,
		refused: map[content.Ref]bool{}, inherited: map[content.Ref]bool{}, ctx: ctx, rounds: map[content.Ref]context.CancelFunc{}, gaveUp: map[content.Ref]bool{}, idle: map[content.Ref]subProgress{}}
	for _, js := range g.subJobs() {
		if js.State != coordinator.JobRunning {
			g.inherited[js.ID] = true
		}
	}
	events, cancel := n.hub.Subscribe("")
	defer func() { cancel() }()
	// Reporting runs beside this loop, not in it: uploading a sub-job's
	// results and reporting them may take seconds (a new leader reports
	// what its predecessor had decided), and meanwhile the running
	// sub-jobs' parent leases must be renewed and new work leased, or
	// they expire and the cluster's workers idle.
	reporter := make(chan struct{})
	go func() {
		defer close(reporter)
		g.reportLoop(ctx, decided)
	}()
	defer func() { <-reporter }()
	renewEvery := 500 * time.Millisecond
	lastRenew := time.Time{}
	orphansChecked := false
	for ctx.Err() == nil {
		running, unreported := g.running()
		if unreported {
			select {
			case decided <- struct{}{}:
			default:
			}
		}
		if time.Since(lastRenew) >= renewEvery {
			if ttl := g.renew(ctx, running); ttl > 0 {
				renewEvery = max(ttl/3, 100*time.Millisecond)
			}
			g.handBackStalled(ctx, running)
			lastRenew = time.Now()
		}
		if !orphansChecked {
			// What earlier leaders left, once the running sub-jobs'
			// parent leases are renewed and before this tenure's first
			// lease: the parent leases no sub-job holds go back.
			g.releaseOrphans(ctx)
			orphansChecked = true
		}
		leased := false
		inFlight := d.InFlight
		if inFlight <= 0 {
			inFlight = DefaultDelegateInFlight
		}
		if len(running) < inFlight && time.Now().After(g.leaseAfter) {
			leased = g.lease(ctx)
		}
		if leased {
			continue
		}
		// Renewals follow the parent's lease TTL (a round's is an hour);
		// a child with room asks its parent for work every leasePoll
		// (the parent answers an idle poll without a log write).
		wait := renewEvery
		if len(running) < inFlight {
			wait = min(wait, leasePoll)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case _, ok := <-events:
			if !ok {
				events, cancel = n.hub.Subscribe("")
			}
		case <-t.C:
		}
		t.Stop()
	}
}

// beat holds this node's heartbeat toward the parent cluster for the
// node's life (api.LeaseRequest.Heartbeat; liveness.go). Every node of a
// child beats, not only its leader: a leader change is no silence at the
// parent, and the parent judges the child gone only when every node's
// connection has closed, or when none has beaten for its silo lease. A
// node beats only while it hears from a leader of its own cluster
// (consensus.Node.Fresh): a child without quorum can host nothing, and
// its silence lets the parent's rounds go on without it.
func (n *Node) beat(ctx context.Context) {
	parent := n.parentClient("delegate heartbeat")
	if parent == nil {
		return
	}
	pause := func(d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	for ctx.Err() == nil {
		if !n.raft.Fresh() {
			pause(beatRetry / 4) // an election: beat again once it has a leader
			continue
		}
		// The parent holds it within its silo lease (api.Server.MaxHold)
		// and answers; the next is sent at once.
		if _, err := parent.Lease(ctx, api.LeaseRequest{Heartbeat: true, WaitMS: int(beatWait.Milliseconds())}); err != nil && ctx.Err() == nil {
			n.log.Debug("delegate heartbeat", "err", err)
			pause(beatRetry)
		}
	}
}

// beatWait is how long a heartbeat asks to be held (the parent holds it
// less: half its silo lease at most); beatRetry the pause after one
// failed.
const (
	beatWait  = 30 * time.Second
	beatRetry = time.Second
)

// running returns the running sub-jobs, and whether any other is
// decided and not yet reported in this tenure.
func (g *delegator) running() (running []coordinator.JobStatus, unreported bool) {
	var lost []content.Ref // round sub-jobs to give back, outside the lock
	defer func() {
		for _, id := range lost {
			g.giveUp(id, "its sub-cohort's round was hosted by an earlier leader of this cluster")
		}
	}()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, js := range g.subJobs() {
		if js.State == coordinator.JobRunning {
			if js.Run != "" && g.rounds[js.ID] == nil {
				// A round sub-job an earlier leader opened: its
				// sub-cohort's round died with that leader.
				if !g.gaveUp[js.ID] {
					g.gaveUp[js.ID] = true
					lost = append(lost, js.ID)
				}
				continue
			}
			running = append(running, js)
		} else if !g.reported[js.ID] {
			unreported = true
		}
	}
	return running, unreported
}

// subJobs lists this cluster's sub-jobs for this delegate, without their
// shard counts: the lease loop looks at every event, and Jobs, which
// counts every shard of every job ever submitted, would cost time growing
// with the cluster's history.
func (g *delegator) subJobs() []coordinator.JobStatus {
	var out []coordinator.JobStatus
	// Cancelled pooled ones too: what a sub-job handed back
	// (handBackStalled) or lost (renew) had verified is still reported,
	// and the rest released, by reportUp. (A round sub-job given up is
	// over: its sub-cohort's round is the parent's to retry.)
	for _, js := range g.n.fsm.machine().JobsIn(coordinator.JobRunning, coordinator.JobDecided, coordinator.JobDone, coordinator.JobCancelledState) {
		if js.Delegated != nil && js.Delegated.Delegate == g.d.Name && (js.State != coordinator.JobCancelledState || js.Run == "") {
			out = append(out, js)
		}
	}
	return out
}

// reportLoop reports every decided sub-job not yet reported, each time
// the lease loop says there are some, until ctx ends. A report that
// fails is tried again at the next signal (the lease loop sends one at
// every pass while any is unreported).
func (g *delegator) reportLoop(ctx context.Context, decided <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-decided:
		}
		clear(g.decidedUp) // the parent's decisions are read again each pass
		for _, js := range g.subJobs() {
			if ctx.Err() != nil {
				return
			}
			if js.State == coordinator.JobRunning {
				continue
			}
			g.mu.Lock()
			done := g.reported[js.ID] || g.unsent[js.ID]
			g.mu.Unlock()
			if done {
				continue
			}
			if err := g.reportUp(ctx, js.ID); err != nil {
				if ctx.Err() == nil {
					g.n.log.Warn("delegate: reporting to the parent", "job", js.ID.Short(), "err", err)
				}
				continue
			}
			g.mu.Lock()
			g.reported[js.ID] = true
			g.mu.Unlock()
		}
	}
}

// renew renews the parent leases of the running sub-jobs and returns
// the parent lease TTL seen (0 when none). A sub-job none of whose parent
// leases is live any more (they expired while this cluster had no leader,
// or the parent decided the shards) is cancelled here: its slot goes to
// new work, and what it verified is still reported (a late report counts
// while the parent's shard is undecided).
func (g *delegator) renew(ctx context.Context, running []coordinator.JobStatus) time.Duration {
	var reqs []api.RenewRequest
	var owner []int // the running sub-job of each request
	var ttl time.Duration
	for i, js := range running {
		for _, s := range js.Delegated.Shards {
			reqs = append(reqs, api.RenewRequest{Job: js.Delegated.Job, Shard: s})
			owner = append(owner, i)
		}
		if d := g.knownTTL(js.Delegated.Job); d > 0 && (ttl == 0 || d < ttl) {
			ttl = d // the shortest TTL of the running sub-jobs' parent jobs
		}
	}
	live := make([]bool, len(running))
	answered := make([]bool, len(running))
	for at := 0; at < len(reqs); at += api.MaxBatch {
		k := min(len(reqs)-at, api.MaxBatch)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		items, err := g.parent.RenewBatch(rctx, reqs[at:at+k])
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				g.n.log.Debug("delegate: renewing parent leases", "err", err)
			}
			return ttl // the parent did not answer: nothing is known lost
		}
		for j, it := range items {
			o := owner[at+j]
			answered[o] = true
			if it.Err() == nil {
				live[o] = true
			}
		}
	}
	for i, js := range running {
		if !answered[i] || live[i] {
			continue
		}
		g.n.log.Info("delegate: the parent holds none of a sub-job's leases any more; cancelling it", "job", js.ID.Short(), "parent job", js.Delegated.Job.Short())
		if stop := g.rounds[js.ID]; stop != nil {
			stop() // its sub-cohort's round is over for the parent
		}
		if _, err := g.n.Apply(ctx, coordinator.CancelJob{Job: js.ID, Peer: g.d.Name, Reason: "the parent cluster's leases on its shards ended", Now: time.Now().UnixMilli()}); err != nil {
			g.n.log.Debug("delegate: cancelling a sub-job", "job", js.ID.Short(), "err", err)
		}
	}
	return ttl
}

// handBackStalled cancels each running pooled sub-job that no worker of
// this cluster has moved — no live lease on any of its shards, no shard
// decided — for the parent job's lease TTL. A child that beats keeps its
// parent leases for as long as it lives, so without this a child whose
// workers all died (or that has none) would hold its shards forever; now
// it holds them no longer than the parent lets a silent worker hold one.
// The cancelled sub-job is then reported like any other (reportUp): what
// it verified goes up, the rest is released to the parent at once. The
// next lease waits half a TTL, so the parent's other peers take the
// shards first, and asks for fewer shards (lease) until a sub-job moves.
func (g *delegator) handBackStalled(ctx context.Context, running []coordinator.JobStatus) {
	now := time.Now()
	m := g.n.fsm.machine()
	seen := map[content.Ref]bool{}
	for _, js := range running {
		if js.Run != "" {
			continue // a round's sub-cohort: its silos answer to the round's deadlines
		}
		seen[js.ID] = true
		full, err := m.Job(js.ID)
		if err != nil {
			continue
		}
		decided, busy := 0, false
		for _, s := range full.Shards {
			switch {
			case s.State == coordinator.StateVerified || s.State == coordinator.StateUnverified:
				decided++
			default:
				for _, l := range s.Leases {
					busy = busy || l.Expiry > now.UnixMilli()
				}
			}
		}
		last, known := g.idle[js.ID]
		if busy || !known || decided != last.decided {
			if busy || (known && decided != last.decided) {
				g.starved = 0
			}
			g.idle[js.ID] = subProgress{since: now, decided: decided}
			continue
		}
		ttl := g.parentTTL(js.Delegated.Job)
		if now.Sub(last.since) < ttl {
			continue
		}
		g.n.log.Warn("delegate: no worker of this cluster has taken a sub-job's shards within the parent's lease TTL; handing them back",
			"job", js.ID.Short(), "parent job", js.Delegated.Job.Short(), "shards", len(full.Shards)-decided, "idle", now.Sub(last.since).Round(time.Second))
		if _, err := g.n.Apply(ctx, coordinator.CancelJob{Job: js.ID, Peer: g.d.Name, Reason: "no worker of this cluster took its shards within the parent's lease TTL", Now: now.UnixMilli()}); err != nil {
			g.n.log.Debug("delegate: cancelling a stalled sub-job", "job", js.ID.Short(), "err", err)
			continue
		}
		delete(g.idle, js.ID)
		g.starved++
		g.leaseAfter = now.Add(ttl / 2)
	}
	for id := range g.idle {
		if !seen[id] {
			delete(g.idle, id)
		}
	}
}

// releaseOrphans hands back, at the start of a tenure, the parent leases
// this cluster holds that none of its sub-jobs does: an earlier leader
// leased them and died (or lost its leadership) before its sub-job was
// committed. No node of this cluster knows of them, and the cluster still
// beats, so they would otherwise come back only when the parent's leases
// expire. After a barrier every sub-job an earlier tenure committed is
// applied here, and this tenure leases nothing before this returns, so
// what it finds unheld is no one's. A parent that does not answer costs
// only the wait: the leases then expire as before.
func (g *delegator) releaseOrphans(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := g.n.raft.Barrier(rctx); err != nil {
		return
	}
	jobs, err := g.parent.Jobs(rctx)
	if err != nil {
		g.n.log.Debug("delegate: listing the parent's jobs", "err", err)
		return
	}
	covered := map[content.Ref]map[int]bool{}
	for _, js := range g.subJobs() {
		if covered[js.Delegated.Job] == nil {
			covered[js.Delegated.Job] = map[int]bool{}
		}
		for _, s := range js.Delegated.Shards {
			covered[js.Delegated.Job][s] = true
		}
	}
	now := time.Now().UnixMilli()
	for _, pj := range jobs {
		if pj.State != coordinator.JobRunning || pj.Run != "" || pj.Counts.Leased == 0 {
			continue
		}
		st, err := g.parent.Job(rctx, pj.ID)
		if err != nil {
			g.n.log.Debug("delegate: reading a parent job", "job", pj.ID.Short(), "err", err)
			return
		}
		var orphans []coordinator.LeaseGrant
		for _, s := range st.Shards {
			if covered[pj.ID][s.Index] {
				continue
			}
			for _, l := range s.Leases {
				if l.Peer == g.d.Name && l.Expiry > now {
					orphans = append(orphans, coordinator.LeaseGrant{Job: pj.ID, Shard: s.Index})
					break
				}
			}
		}
		if len(orphans) > 0 {
			g.n.log.Warn("delegate: parent leases no sub-job of this cluster holds (an earlier leader leased them and died); handing them back",
				"parent job", pj.ID.Short(), "leases", len(orphans))
			g.release(pj.ID, orphans)
		}
	}
}

// parentTTL is the lease TTL of parent job id (the parent's default when
// its status is not known here).
func (g *delegator) parentTTL(id content.Ref) time.Duration {
	if d := g.knownTTL(id); d > 0 {
		return d
	}
	return time.Duration(coordinator.DefaultLeaseTTL) * time.Millisecond
}

// knownTTL is the lease TTL of parent job id, 0 when not known here.
func (g *delegator) knownTTL(id content.Ref) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if pj := g.parents[id]; pj != nil && pj.st.Policy.LeaseTTL > 0 {
		return time.Duration(pj.st.Policy.LeaseTTL) * time.Millisecond
	}
	return 0
}

// lease asks the parent for shards and proposes them as sub-jobs; it
// reports whether it proposed any.
func (g *delegator) lease(ctx context.Context) bool {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	batch := g.d.Batch
	if batch <= 0 {
		batch = DefaultDelegateBatch
	}
	// A cluster whose last sub-jobs went back for want of a worker asks
	// for fewer shards each time, down to one, until one moves again.
	batch = max(1, batch>>min(g.starved, 6))
	rid := newRequestID()
	resp, err := g.parent.Lease(lctx, api.LeaseRequest{Max: batch, RequestID: rid})
	if err != nil {
		if ctx.Err() == nil {
			g.n.log.Debug("delegate: leasing from the parent", "err", err)
		}
		return false
	}
	if len(resp.Grants) == 0 {
		return false
	}
	byJob := map[content.Ref][]coordinator.LeaseGrant{}
	var order []content.Ref
	for _, gr := range resp.Grants {
		if _, ok := byJob[gr.Job]; !ok {
			order = append(order, gr.Job)
		}
		byJob[gr.Job] = append(byJob[gr.Job], gr)
	}
	proposed, refused := false, 0
	for _, id := range order {
		grants := byJob[id]
		if err := g.propose(ctx, id, rid, grants); err != nil {
			if errors.Is(err, errRefusedJob) {
				refused++
			} else {
				g.n.log.Warn("delegate: proposing a sub-job", "parent job", id.Short(), "err", err)
			}
			g.release(id, grants)
			continue
		}
		proposed = true
	}
	if refused == len(order) {
		// Only work this cluster hands back: ask again later, not at
		// every pass, so the parent's own peers take it meanwhile (the
		// loop goes on renewing what runs).
		g.leaseAfter = time.Now().Add(refusedBackoff)
	}
	return proposed
}

// leasePoll is how often a child with room for a sub-job asks its parent
// for shards when nothing else wakes its loop.
const leasePoll = 250 * time.Millisecond

// refusedBackoff is how long a child waits before leasing again after a
// lease that held only shards of parent jobs it cannot serve.
const refusedBackoff = 5 * time.Second

// release hands leases back to the parent.
func (g *delegator) release(id content.Ref, grants []coordinator.LeaseGrant) {
	var refs []coordinator.ShardRef
	for _, gr := range grants {
		refs = append(refs, coordinator.ShardRef{Job: id, Shard: gr.Shard})
	}
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g.parent.Release(rctx, api.ReleaseRequest{Shards: refs})
}

// parentJob returns what the loop knows of a parent job, asking the
// parent once and copying the job's bundle and content here.
func (g *delegator) parentJob(ctx context.Context, id content.Ref) (*parentJob, error) {
	g.mu.Lock()
	pj := g.parents[id]
	g.mu.Unlock()
	if pj != nil && (pj.copied || pj.refused != "") {
		return pj, nil
	}
	st, err := g.parent.Job(ctx, id)
	if err != nil {
		return nil, err
	}
	if st.Run != "" {
		pj, err := g.parentRound(ctx, st)
		if err != nil {
			return nil, err
		}
		g.mu.Lock()
		g.parents[id] = pj
		g.mu.Unlock()
		return pj, nil
	}
	raw, err := g.copyBlob(ctx, st.Bundle)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	var b job.Bundle
	if err := content.Decode(raw, &b); err != nil {
		return nil, fmt.Errorf("bundle %s: %w", st.Bundle.Short(), err)
	}
	// The parent admitted the job under its own regime; the shards would
	// run here, on this cluster's workers, so its inputs and models must
	// be admissible under this cluster's regime too (a confidential table
	// must not reach an open child's peers). Checked before any input is
	// copied here.
	if ds := admitHere(g.n.fsm.machine().Regime(), &b); ds.HasErrors() {
		pj := &parentJob{st: st, refused: "this cluster's regime refuses it: " + ds.Error()}
		g.mu.Lock()
		g.parents[id] = pj
		g.mu.Unlock()
		return pj, nil
	}
	var refs []content.Ref
	for _, ref := range b.Content {
		if _, builtin := g.n.planner.builtin.Lookup(string(ref)); !builtin {
			refs = append(refs, ref)
		}
	}
	for _, in := range b.Inputs {
		refs = append(refs, in.Ref)
	}
	if err := g.copyBlobs(ctx, refs); err != nil {
		return nil, err
	}
	pj = &parentJob{st: st, copied: true}
	g.mu.Lock()
	g.parents[id] = pj
	g.mu.Unlock()
	return pj, nil
}

// copyBlobs copies each of refs once (see copyBlob); it sorts refs.
func (g *delegator) copyBlobs(ctx context.Context, refs []content.Ref) error {
	slices.Sort(refs)
	for _, ref := range slices.Compact(refs) {
		if _, err := g.copyBlob(ctx, ref); err != nil {
			return err
		}
	}
	return nil
}

// copyBlob fetches ref from the parent unless it is here, and makes it
// durable in this cluster (here and on a second node).
func (g *delegator) copyBlob(ctx context.Context, ref content.Ref) ([]byte, error) {
	b, err := g.n.fetchBlob(ctx, ref)
	if err != nil {
		if b, err = g.parent.GetBlob(ctx, ref); err != nil {
			return nil, err
		}
		if _, err := g.n.blobs.PutBytes(b); err != nil {
			return nil, err
		}
	}
	return b, g.n.durable(ctx, ref)
}

// propose submits grants of parent job id as one sub-job of this cluster.
func (g *delegator) propose(ctx context.Context, id content.Ref, lease string, grants []coordinator.LeaseGrant) error {
	pj, err := g.parentJob(ctx, id)
	if err != nil {
		return err
	}
	why := pj.refused
	if why == "" {
		why = undelegable(pj.st.Policy)
	}
	if why == "" && pj.round == nil {
		why = tooFewPeers(g.n.fsm.machine().Regime(), g.n.fed)
	}
	if why != "" {
		if !g.refused[id] {
			g.n.log.Warn("delegate: a parent job this cluster cannot serve; handing its shards back", "parent job", id.Short(), "why", why)
			g.refused[id] = true
		}
		return errRefusedJob
	}
	if pj.round != nil {
		return g.proposeRound(ctx, id, lease, grants, pj)
	}
	if testfault.Fires(testfault.KillBeforeSubJob, pj.st.Name) {
		g.n.log.Warn("test fault: parent shards leased, no sub-job proposed; killing the process", "fault", testfault.KillBeforeSubJob, "parent job", id.Short(), "shards", len(grants))
		testfault.Kill()
	}
	del, shards, err := g.subShards(id, lease, grants, pj, nil)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("%s (shards %d–%d of %s, for %s)", pj.st.Name, del.Shards[0], del.Shards[len(del.Shards)-1], id.Short(), g.d.Name)
	res, err := g.n.Apply(ctx, coordinator.SubmitJob{
		Job: coordinator.SubJobID(del), Name: name, Bundle: pj.st.Bundle, SecurityCritical: pj.st.SecurityCritical,
		Shards: shards, Delegated: &del, Submitter: g.d.Name, Now: time.Now().UnixMilli(),
	})
	if err != nil {
		return err
	}
	if len(res.Refusal) > 0 {
		return res.Refusal
	}
	return nil
}

// subShards checks the parent's grants of job id against its status
// (and each granted shard against check, when set) and returns the
// sub-job's delegation and shards, in parent shard order.
func (g *delegator) subShards(id content.Ref, lease string, grants []coordinator.LeaseGrant, pj *parentJob, check func(coordinator.ShardStatus) error) (coordinator.Delegation, []coordinator.ShardPlan, error) {
	slices.SortFunc(grants, func(a, b coordinator.LeaseGrant) int { return a.Shard - b.Shard })
	del := coordinator.Delegation{Delegate: g.d.Name, Job: id, Lease: lease}
	var shards []coordinator.ShardPlan
	for i, gr := range grants {
		if gr.Shard < 0 || gr.Shard >= len(pj.st.Shards) || pj.st.Shards[gr.Shard].ID != gr.ShardID {
			return del, nil, fmt.Errorf("the parent leased shard %d, which its job status does not list", gr.Shard)
		}
		ps := pj.st.Shards[gr.Shard]
		if check != nil {
			if err := check(ps); err != nil {
				return del, nil, err
			}
		}
		del.Shards = append(del.Shards, gr.Shard)
		shards = append(shards, coordinator.ShardPlan{Index: i, ID: ps.ID, Price: ps.Price, PriceBasis: ps.PriceBasis})
	}
	// The parent job is itself a sub-job (a tree of three levels or
	// more): the bundle compiles to the root's job, so the delegation
	// carries the root's index of each shard for the workers.
	if pd := pj.st.Delegated; pd != nil {
		root, rootShards := pd.Plan()
		del.Root = root
		for _, s := range del.Shards {
			if s >= len(rootShards) {
				return del, nil, fmt.Errorf("the parent's sub-job %s maps %d shards to its root job, not shard %d", id.Short(), len(rootShards), s)
			}
			del.RootShards = append(del.RootShards, rootShards[s])
		}
	}
	return del, shards, nil
}

// reportUp uploads a decided sub-job's verified results to the parent and
// reports them there, citing this cluster's chain head. Shards this
// cluster could not verify are handed back to the parent.
func (g *delegator) reportUp(ctx context.Context, sub content.Ref) error {
	m := g.n.fsm.machine()
	js, err := m.Job(sub)
	if err != nil {
		return err
	}
	d := js.Delegated
	pj, err := g.parentJob(ctx, d.Job)
	if err != nil {
		return err
	}
	// A sub-job decided before this tenure may have been reported by the
	// previous leader: what the parent has decided is not sent again
	// (its results need not be fetched here and uploaded once more).
	var decidedUp map[int]bool
	if g.inherited[sub] {
		if decidedUp, err = g.decidedOnParent(ctx, d.Job); err != nil {
			return err
		}
	}
	seq, head := m.Head()
	cite := &receipt.Citation{Peer: g.d.Name, Seq: seq, Head: head}
	cite.Sig = identity.Sign(g.d.Identity, identity.PurposeCite, receipt.CitationBytes(cite.Peer, cite.Seq, cite.Head))
	var reports []api.ResultReport
	var blobs []content.Ref
	var unverified []coordinator.LeaseGrant
	for i, s := range js.Shards {
		ps := d.Shards[i]
		if decidedUp[ps] {
			continue
		}
		if s.State != coordinator.StateVerified {
			unverified = append(unverified, coordinator.LeaseGrant{Job: d.Job, Shard: ps})
			continue
		}
		st := coordinator.StatementOf(d.Job, ps, s.Result, pj.st.Policy, g.d.Name)
		reports = append(reports, api.ResultReport{
			Job: d.Job, Shard: ps, Result: s.Result, Cite: cite,
			Sig: identity.Sign(g.d.Identity, identity.PurposeResult, st.Bytes()),
		})
		blobs = append(blobs, s.Result)
	}
	// A round's silent silos stay with the parent, which flags them
	// when its round is summed; handing them back would read as this
	// cluster giving up its sub-cohort (hier.go, watchChildren).
	if len(unverified) > 0 && js.Run == "" {
		// Not a shard a running sub-job holds again: this cluster may
		// have handed it back and leased it anew (a new leader reports
		// every inherited sub-job once more).
		again := g.runningShards(d.Job)
		if unverified = slices.DeleteFunc(unverified, func(gr coordinator.LeaseGrant) bool { return again[gr.Shard] }); len(unverified) > 0 {
			g.release(d.Job, unverified)
		}
	}
	for len(reports) > 0 {
		k := min(len(reports), api.MaxBatch)
		if err := g.upload(ctx, blobs[:k]); err != nil {
			return fmt.Errorf("uploading results: %w", err)
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		items, err := g.parent.ReportBatch(rctx, reports[:k])
		cancel()
		if err != nil {
			return err
		}
		for i, it := range items {
			if e := it.Err(); e != nil {
				// Decided there by another child, or refused: the
				// parent's decision stands either way.
				g.n.log.Info("delegate: a report was not counted", "parent job", d.Job.Short(), "shard", reports[i].Shard, "err", e)
			}
		}
		reports, blobs = reports[k:], blobs[k:]
	}
	return nil
}

// runningShards returns the shards of parent job id that this cluster's
// running sub-jobs hold.
func (g *delegator) runningShards(id content.Ref) map[int]bool {
	held := map[int]bool{}
	for _, js := range g.subJobs() {
		if js.State == coordinator.JobRunning && js.Delegated.Job == id {
			for _, s := range js.Delegated.Shards {
				held[s] = true
			}
		}
	}
	return held
}

// decidedOnParent returns the shards of parent job id the parent has
// decided, read once per reporting pass (a new leader's inherited
// sub-jobs mostly share one parent job, whose status lists every shard).
func (g *delegator) decidedOnParent(ctx context.Context, id content.Ref) (map[int]bool, error) {
	if got, ok := g.decidedUp[id]; ok {
		return got, nil
	}
	st, err := g.parent.Job(ctx, id)
	if err != nil {
		return nil, err
	}
	got := map[int]bool{}
	for _, s := range st.Shards {
		if s.State == coordinator.StateVerified {
			got[s.Index] = true
		}
	}
	if g.decidedUp == nil {
		g.decidedUp = map[content.Ref]map[int]bool{}
	}
	g.decidedUp[id] = got
	return got, nil
}

// upload puts result blobs on the parent cluster.
func (g *delegator) upload(ctx context.Context, refs []content.Ref) error {
	bs := make([][]byte, 0, len(refs))
	for _, ref := range refs {
		b, err := g.n.fetchBlob(ctx, ref)
		if err != nil {
			return err
		}
		bs = append(bs, b)
	}
	uctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got, err := g.parent.PutBlobs(uctx, bs)
	if err != nil {
		return err
	}
	for i, ref := range got {
		if ref != refs[i] {
			return errors.New("the parent stored a result under another hash")
		}
	}
	return nil
}

// newRequestID makes a lease request ID (an idempotent retry's key).
func newRequestID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
