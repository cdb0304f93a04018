package aggregator

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg"
)

// Hierarchical rounds: a training run over a tree of coordinator clusters
// (docs/tree.md, "Training runs"; docs/secagg.md, "Hierarchical secure
// aggregation"). A silo the parent's federation lists with `cluster:
// CHILD` is led by that child cluster: it polls and takes part in rounds
// there, never here. A run whose cohort is such silos runs every round
// as a hierarchical round, planned here:
//
//   - the sampled cohort is split by child (each part a sub-cohort of at
//     least three sites, or the run's cohort.min);
//   - the leader draws the round's X25519 key (crypto/rand) and keeps its
//     private half in its secure-aggregation host only; the public half is
//     in every sub-cohort's secagg.Params (Params.Parent), inside the
//     round bundle, so each site reads it from the parent's plan;
//   - each silo's shard is pinned to the silo and may be leased by its
//     child (coordinator.ShardPlan.Via); the child's delegate loop hosts
//     the sub-cohort's round and forwards its masked partial sum here
//     (delegate_round.go);
//   - this host opens the parent round (wire.Host.OpenParent) and takes
//     the total (WaitParent); the strategy steps on it as on a flat sum.
//
// A child that loses its sub-cohort's round (its leader died, its round
// failed) hands the round's leases back; a lease that ends without a
// report ends the parent round at once, and the run retries it under a
// new round ID (retryRound), as a flat round whose host is lost. A child
// that is gone (its heartbeat, liveness.go: every node's connection
// closed, or none beat within the lease) ends the round the same way,
// and the retry leaves its silos out as absent (runRound): the other
// children's sub-cohorts go on when they still make a round. Its silos
// rejoin at the first round planned after it beats again.

// hierCohort splits members by the child cluster that leads each silo.
// It returns nil (a flat round) when no member is led by a child, and
// refuses a cohort that mixes silos led here with silos led by children
// (SC7604) or a sub-cohort below the round minimum (SC9301).
func (n *Node) hierCohort(subject string, members []string, minCohort int) (map[string][]string, error) {
	byChild := map[string][]string{}
	var here []string
	for _, s := range members {
		m, _ := n.fed.Member(s)
		if m.Cluster == "" {
			here = append(here, s)
			continue
		}
		byChild[m.Cluster] = append(byChild[m.Cluster], s)
	}
	if len(byChild) == 0 {
		return nil, nil
	}
	if len(here) > 0 {
		return nil, diag.New(diag.TreeRound, subject, "silos %s are led by this cluster and the others by child clusters; a round is summed either here or at the children, not both", strings.Join(here, ", ")).
			WithHelp("name in the run only silos led by child clusters (silos: in the run spec), or only this cluster's own")
	}
	need := max(coordinator.MinSites, minCohort)
	for _, c := range slices.Sorted(maps.Keys(byChild)) {
		if len(byChild[c]) < need {
			return nil, diag.New(diag.RunTooFewSites, subject, "child cluster %s leads %d of the round's silos (%s); each sub-cohort needs at least %d",
				c, len(byChild[c]), strings.Join(byChild[c], ", "), need).
				WithHelp("each child sums its sub-cohort, and the parent learns that sum: give each child at least %d of the run's silos (or lower cohort.min)", need)
		}
	}
	return byChild, nil
}

// cohortGroups splits a round's alive members for sampling
// (fl.RunSpec.RoundCohortOf): the silos led here first, then those of
// each child cluster, by the child's name. A flat federation is one
// group, so a flat round draws as fl simulate does.
func (n *Node) cohortGroups(members []secagg.Member) [][]string {
	var here []string
	byChild := map[string][]string{}
	for _, mem := range members {
		m, _ := n.fed.Member(mem.ID)
		if m.Cluster == "" {
			here = append(here, mem.ID)
			continue
		}
		byChild[m.Cluster] = append(byChild[m.Cluster], mem.ID)
	}
	groups := [][]string{here}
	for _, c := range slices.Sorted(maps.Keys(byChild)) {
		groups = append(groups, byChild[c])
	}
	return groups
}

// heOverTree is the refusal of a threshold-he run whose silos child
// clusters lead. The tree splits a round into sub-cohort rounds, each
// hosted by a child that forwards only its masked partial sum, under an
// outer mask the children agree on, so the parent learns only the total.
// Threshold-he has no such split: the round's one collective key is
// summed from every site's signed key share, each site Shamir-shares its
// secret key with every other, and t > n/2 sites of the whole cohort
// decrypt the one summed ciphertext — while a child's silos reach only
// their child. Per-child threshold-he rounds would each decrypt their
// sub-cohort's sum in the clear, which is what the outer masks hide.
func heOverTree(subject string) *diag.Diagnostic {
	return diag.New(diag.TreeRound, subject, "the run's silos are led by child clusters, and a threshold-he round is not summed over a tree: "+
		"its one collective key and its decryption by more than half of the whole cohort need every silo in one round, "+
		"while each child hosts only its own silos' round (per-child rounds would each decrypt their sub-cohort's sum in the clear)").
		WithHelp("drop aggregation: threshold-he (masking, the default, pairwise or masking: secagg+, is summed over the tree under the children's outer masks), or launch the run on a cluster that leads its silos itself; docs/tree.md, \"Training runs\"")
}

// subRoundID names a sub-cohort's secure-aggregation round: fresh with
// the parent round (every attempt of a round has its own).
func subRoundID(parent, cluster string) string {
	h := sha256.Sum256([]byte("scellis/secagg-subround/v1\x00" + parent + "\x00" + cluster))
	return hex.EncodeToString(h[:16])
}

// splitRound makes b a hierarchical round over byChild: one grid and one
// ring layout for all sub-cohorts (the run's grid, or the finest the whole
// cohort's round would take, so that the sum equals the flat round's;
// Params.Sites the whole cohort), the parent's fresh
// X25519 key in every sub-cohort's Params. It returns the private key,
// which goes to this node's host only.
func splitRound(b *fl.RoundBundle, byChild map[string][]string, minCohort int) (*ecdh.PrivateKey, error) {
	if b.HE != nil {
		return nil, heOverTree(fmt.Sprintf("run %s round %d", b.Run.Short(), b.Round))
	}
	if b.SecAgg.GridBits == 0 {
		f, err := b.SecAgg.FracBits()
		if err != nil {
			return nil, err
		}
		b.SecAgg.GridBits = f
	}
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	pub := key.PublicKey().Bytes()
	for _, c := range slices.Sorted(maps.Keys(byChild)) {
		p := b.SecAgg
		p.Round, p.Parent = subRoundID(b.SecAgg.Round, c), pub
		// Every sub-cohort is laid out for the whole cohort: one ring
		// and one grid (the weight's too), so the parent adds their
		// masked sums as ring words and decodes only the total.
		p.Sites = len(b.SecAgg.Members)
		p.Members = slices.DeleteFunc(slices.Clone(b.SecAgg.Members), func(m secagg.Member) bool { return !slices.Contains(byChild[c], m.ID) })
		p.Threshold = roundThreshold(len(p.Members), minCohort)
		b.SubCohorts = append(b.SubCohorts, fl.SubCohort{Cluster: c, SecAgg: p})
	}
	return key, nil
}

// viaOf returns the child cluster that leads silo, or "".
func (n *Node) viaOf(silo string) string {
	m, _ := n.fed.Member(silo)
	return m.Cluster
}

// waitParent waits for a hierarchical round's total. It ends early, with
// an error, when a child gives up its part: a lease on a silo's shard
// held by the child ends (handed back or expired) while the shard is
// undecided — the child lost its sub-cohort's round and will not forward
// its partial sum — or the child is gone (its heartbeat lapsed) before
// its partial sum arrived. The
// round's phase deadlines bound the wait (a child that beats and holds
// its leases but never forwards).
func (n *Node) waitParent(ctx context.Context, b *fl.RoundBundle, job content.Ref) (*secagg.Result, error) {
	d := n.opt.SecAgg
	if d.Advertise <= 0 {
		d.Advertise = 10 * time.Minute
	}
	limit := d.Advertise + max(d.Share, time.Minute) + max(d.Mask, 2*time.Minute) + max(d.Consistency, time.Minute) + max(d.Unmask, time.Minute)
	wctx, cancel := context.WithTimeoutCause(ctx, limit, errors.New("the children's partial sums did not all arrive within the round's deadlines"))
	defer cancel()
	lost := make(chan string, 1)
	go n.watchChildren(wctx, job, b.SecAgg.Round, b.SubCohorts, lost)
	type out struct {
		res *secagg.Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := n.sagg.WaitParent(wctx, b.SecAgg.Round)
		done <- out{res, err}
	}()
	select {
	case o := <-done:
		if o.err != nil && wctx.Err() != nil && ctx.Err() == nil {
			return nil, context.Cause(wctx)
		}
		return o.res, o.err
	case why := <-lost:
		n.sagg.AbortParent(b.SecAgg.Round, why)
		<-done
		return nil, errors.New(why)
	}
}

// watchChildren sends on lost when a child's lease on an undecided shard
// of the round job ends without a report, or when a child whose partial
// sum the parent round (round) does not hold yet is gone (see
// waitParent). It sleeps until the earliest moment a child's heartbeat
// can lapse, or until a held one's connection closes, as excuseLapsed
// does: no fixed tick.
func (n *Node) watchChildren(ctx context.Context, job content.Ref, round string, children []fl.SubCohort, lost chan<- string) {
	events, cancel := n.hub.Subscribe(job)
	defer func() { cancel() }()
	lapse := time.NewTimer(time.Hour)
	defer lapse.Stop()
	for {
		gone := n.peerGone.wait()
		next := time.Hour
		for _, c := range children {
			if n.sagg.HasPartial(round, c.SecAgg.Round) {
				continue // its part is in: the total no longer needs it
			}
			d := n.lapsesIn(c.Cluster)
			if d < 0 {
				select {
				case lost <- fmt.Sprintf("child cluster %s is gone (no node of it beats here: every connection closed, or none beat within the lease)", c.Cluster):
				default:
				}
				return
			}
			next = min(next, d)
		}
		lapse.Reset(next + time.Millisecond)
		select {
		case <-ctx.Done():
			return
		case <-gone:
		case <-lapse.C:
		case e, ok := <-events:
			if !ok {
				cancel()
				events, cancel = n.hub.Subscribe(job)
				continue
			}
			le, isEnd := e.(coordinator.LeaseEnded)
			if !isEnd || le.Reason == coordinator.LeaseRevoked {
				continue
			}
			js, err := n.fsm.machine().Job(job)
			if err != nil || le.Shard < 0 || le.Shard >= len(js.Shards) {
				continue
			}
			s := js.Shards[le.Shard]
			if s.Via == le.Peer && s.State != coordinator.StateVerified && s.State != coordinator.StateUnverified && !reported(s, le.Peer) {
				select {
				case lost <- fmt.Sprintf("child cluster %s gave up its sub-cohort (its lease on %s's shard %s)", le.Peer, s.Peer, le.Reason):
				default:
				}
				return
			}
		}
	}
}

func reported(s coordinator.ShardStatus, peer string) bool {
	for _, r := range s.Reports {
		if r.Peer == peer {
			return true
		}
	}
	return false
}
