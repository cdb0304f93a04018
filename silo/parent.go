package silo

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
)

// A silo led by a child cluster (docs/tree.md, "Training runs") reads a
// hierarchical round's bundle through its child: the child copies the
// parent's bundle and serves it, and the silo seals its unmasking shares
// to the X25519 key in its sub-cohort's Params (Params.Parent). A child
// that served a bundle with a key of its own there would open the shares
// and learn its sub-cohort's sum. With parent_federation set, the silo
// asks a parent aggregator — as itself, over mutual TLS pinned to the
// parent's federation, which lists it under its child — for the parent
// job the round serves (GET /v1/jobs/{id}, readable by every member) and
// takes part only when:
//
//   - the child's sub-job names a parent job, as the delegate the parent
//     lists this silo under;
//   - that job's bundle is the bundle the silo decoded (the SHA-256 of
//     the bytes the child served), for the same run and round;
//   - the parent's shard the silo's shard stands for is pinned to this
//     silo, to be leased via that child;
//   - the bundle puts the silo in exactly one sub-cohort, its child's —
//     the Params (and parent key) the silo then uses.
//
// Every compared value is a public hash or name, so plain equality is
// exact and leaks nothing. The check runs beside the fetches of the run
// spec and the global model, and is waited for before anything else:
// before the round's lock, ledger look-up and journal, so a round that
// fails it is declined with nothing charged, counted or sent — no advert,
// no share box, no masked input (SC7611; SC7612 when no parent aggregator
// answers within Parent.Timeout). What it does not cover: a silo without
// parent_federation, and rounds of the child's own runs (no parent job,
// no sub-cohorts), which are the child's to plan.

// Parent is a silo's view of its parent cluster.
type Parent struct {
	// Fed is the parent's federation; Cluster the child cluster it lists
	// this silo under (the delegate that leases its shards).
	Fed     *identity.Federation
	Cluster string
	// Client reaches the parent's aggregators as this silo.
	Client *api.Client
	// Timeout bounds the check of one round (default
	// DefaultParentTimeout): a parent that does not answer in time is
	// one the silo cannot check the round with.
	Timeout time.Duration
}

// DefaultParentTimeout is how long a round waits for the parent: well
// inside the advertising phase a child gives its silos (the aggregators'
// round_join_timeout, 10 minutes by default).
const DefaultParentTimeout = time.Minute

// ParentListing returns the child cluster parent lists silo name under,
// or why it does not (SC7610): the silo must be a member of role silo
// with a cluster.
func ParentListing(parent *identity.Federation, name string) (string, *diag.Diagnostic) {
	m, ok := parent.Member(name)
	switch {
	case !ok:
		return "", diag.New(diag.SiloParentConfig, name, "the parent federation %s has no member %q", parent.File, name).
			WithHelp("the parent's operator lists this silo there (role: silo, its public key, cluster: the child that leads it; scellis topology split writes it), or remove parent_federation")
	case m.Role != identity.Silo || m.Cluster == "":
		what := fmt.Sprintf("a %s", m.Role)
		if m.Role == identity.Silo {
			what = "a silo led by the parent itself (no cluster:)"
		}
		return "", diag.New(diag.SiloParentConfig, name, "the parent federation %s lists %s as %s, not as a silo led by a child cluster (%s:%d)", parent.File, name, what, m.Pos.File, m.Pos.Line).
			WithHelp("parent_federation is for a silo a child cluster leads: its entry there has role: silo and cluster: CHILD; remove the key for a silo of a flat pool")
	}
	return m.Cluster, nil
}

// OpenParent loads c.ParentFederation and checks it lists the silo, under
// its key, under a child cluster (SC7610, at the config's
// parent_federation line). Nil when the key is not set.
func OpenParent(c *config.Silo, id *identity.Identity) (*Parent, error) {
	if c.ParentFederation == "" {
		return nil, nil
	}
	fed, err := identity.LoadFederation(c.ParentFederation)
	if err != nil {
		return nil, err
	}
	cluster, d := ParentListing(fed, c.Name)
	if d == nil {
		if m, _ := fed.Member(c.Name); !m.PublicKey.Equal(id.Public()) {
			d = diag.New(diag.SiloParentConfig, c.Name, "the parent federation %s lists %s with another key than this silo's (%s:%d)", fed.File, c.Name, m.Pos.File, m.Pos.Line).
				WithHelp("the parent lists each silo with the public key of its identity file (scellis keygen printed it); fix the entry or the identity")
		}
	}
	if d != nil {
		return nil, c.Pos.At(d, c.File, "parent_federation")
	}
	client, err := api.NewClient(id, fed)
	if err != nil {
		return nil, err
	}
	return &Parent{Fed: fed, Cluster: cluster, Client: client}, nil
}

// startParentCheck starts checking a round with the parent (see the file
// comment) and returns what waits for its verdict: nil, or a diagnostic
// to decline the round with. full is the bundle as decoded, raw its bytes.
func (a *Appliance) startParentCheck(ctx context.Context, g coordinator.LeaseGrant, st coordinator.JobStatus, raw []byte, full fl.RoundBundle, subject string) func() error {
	if a.Parent == nil || (st.Delegated == nil && len(full.SubCohorts) == 0) {
		return func() error { return nil } // no parent, or a round of the child's own run
	}
	done := make(chan error, 1)
	go func() { done <- a.checkWithParent(ctx, g, st, content.Hash(raw), full, subject) }()
	return func() error { return <-done }
}

func (a *Appliance) checkWithParent(ctx context.Context, g coordinator.LeaseGrant, st coordinator.JobStatus, served content.Ref, full fl.RoundBundle, subject string) error {
	p := a.Parent
	mismatch := func(format string, args ...any) error {
		return diag.New(diag.SiloParentMismatch, subject, format, args...).
			WithHelp("the silo takes no part in this round and sends nothing keyed to it; tell the operators of child cluster %s and of the parent (%s): a child that serves its silos another round than the parent's may be trying to open its sub-cohort's sum", p.Cluster, p.Fed.File)
	}
	d := st.Delegated
	switch {
	case d == nil:
		return mismatch("the round is hierarchical (%d sub-cohorts) but child cluster %s names no parent job it serves", len(full.SubCohorts), p.Cluster)
	case d.Delegate != p.Cluster:
		return mismatch("the round is a sub-job delegated to %q, but the parent lists this silo under child cluster %s", d.Delegate, p.Cluster)
	case g.Shard < 0 || g.Shard >= len(d.Shards):
		return mismatch("shard %d is not one of the %d parent shards the child's sub-job serves", g.Shard, len(d.Shards))
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = DefaultParentTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	pj, err := p.Client.Job(cctx, d.Job)
	cancel()
	if err != nil {
		if ds, ok := diag.As(err); ok && ds[0].Code == diag.PoolUnknownJob {
			return mismatch("the parent has no job %s, which child cluster %s says the round serves", d.Job.Short(), p.Cluster)
		}
		if ctx.Err() != nil {
			return ctx.Err() // the round ended first
		}
		return diag.New(diag.SiloParentUnreachable, subject, "the aggregators of the parent federation %s did not say within %v whether the round's bundle is the parent's: %v", p.Fed.File, timeout, err).
			WithHelp("the silo takes no part in a round it cannot check (nothing is charged or sent); check that the parent's aggregators in %s are up and reachable from this silo", p.Fed.File)
	}
	if pj.Bundle != served || pj.Run != st.Run || pj.Round != st.Round {
		return mismatch("child cluster %s served round bundle %s (run %s round %d), but the parent's job %s has bundle %s (run %s round %d)",
			p.Cluster, served.Short(), st.Run.Short(), st.Round, d.Job.Short(), pj.Bundle.Short(), pj.Run.Short(), pj.Round)
	}
	i := d.Shards[g.Shard]
	if i < 0 || i >= len(pj.Shards) || pj.Shards[i].Peer != a.Name || pj.Shards[i].Via != p.Cluster {
		var s coordinator.ShardStatus
		if i >= 0 && i < len(pj.Shards) {
			s = pj.Shards[i]
		}
		return mismatch("the parent's shard %d of job %s is pinned to %q via %q, not to this silo via %s", i, d.Job.Short(), s.Peer, s.Via, p.Cluster)
	}
	var in []string
	for _, sc := range full.SubCohorts {
		if slices.ContainsFunc(sc.SecAgg.Members, func(m secagg.Member) bool { return m.ID == a.Name }) {
			in = append(in, sc.Cluster)
		}
	}
	if len(full.SubCohorts) > 0 && (len(in) != 1 || in[0] != p.Cluster) {
		return mismatch("the parent's round puts this silo in the sub-cohorts of %v, not in child cluster %s's alone", in, p.Cluster)
	}
	a.logf("%s: checked with the parent: the round's bundle %s is parent job %s's, sub-cohort of %s", subject, served.Short(), d.Job.Short(), p.Cluster)
	return nil
}
