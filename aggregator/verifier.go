package aggregator

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"time"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/job"
)

// The leader's reducer peer is the verifier of checked jobs (the
// convergent tier, Freivalds): the coordinator never sees result bytes, so
// for every shard waiting for a verdict this node fetches the reported
// results, runs the content's compare or verify function in a child
// process (the content is the submitter's), signs the verdict with its
// identity key and proposes it. Freivalds' random vectors are drawn here
// from crypto/rand, in the child, after every judged result was committed
// and revealed: the worker that produced C cannot predict them.

// verdictRequest is what a verifying child is told.
type verdictRequest struct {
	Plan    planRequest   `cbor:"plan"`
	Job     content.Ref   `cbor:"job"`
	Shard   int           `cbor:"shard"`
	Check   string        `cbor:"check"`
	Peers   []string      `cbor:"peers"`
	Results []content.Ref `cbor:"results"`
}

// verdictReply is the child's judgement.
type verdictReply struct {
	Agreeing  []string    `cbor:"agreeing"`
	Canonical content.Ref `cbor:"canonical"`
	Detail    string      `cbor:"detail"`
}

const verdictHandler = "aggregator.verdict"

func init() { sandboxproc.Register(verdictHandler, childVerdict) }

// verifyDue starts a verdict for every shard waiting for one (leader only;
// at most one per shard and report count at a time).
func (n *Node) verifyDue(ctx context.Context, m *coordinator.Machine) {
	for _, t := range m.VerdictsDue() {
		key := fmt.Sprintf("%s/%d/%d", t.Job, t.Shard, t.Judged)
		if _, busy := n.verifying.LoadOrStore(key, struct{}{}); busy {
			continue
		}
		go func() {
			defer n.verifying.Delete(key)
			if err := n.verifyShard(ctx, t); err != nil {
				n.log.Warn("verdict", "job", t.Job.Short(), "shard", t.Shard, "err", err)
			}
		}()
	}
}

func (n *Node) verifyShard(ctx context.Context, t coordinator.VerdictTask) error {
	st, err := n.fsm.machine().Job(t.Job)
	if err != nil {
		return err
	}
	if err := n.planner.local(ctx, st.Bundle); err != nil {
		return err
	}
	req := verdictRequest{
		Plan: planRequest{Bundle: st.Bundle, BlobDir: n.planner.blobDir, CacheDir: n.planner.cacheDir, Caps: n.planner.wireCaps()},
		Job:  t.Job, Shard: t.Shard, Check: t.Check,
	}
	for _, r := range t.Reports {
		if _, err := n.fetchBlob(ctx, r.Result); err != nil {
			return fmt.Errorf("result %s of %s: %w", r.Result.Short(), r.Peer, err)
		}
		req.Peers = append(req.Peers, r.Peer)
		req.Results = append(req.Results, r.Result)
	}
	raw, err := n.planner.inChild(ctx, verdictHandler, req)
	if err != nil {
		return err
	}
	var rep verdictReply
	if err := content.Decode(raw, &rep); err != nil {
		return err
	}
	v := coordinator.ReportVerdict{
		Job: t.Job, Shard: t.Shard, Verifier: n.Self.Name, Key: n.id.Public().String(), Judged: t.Judged,
		Agreeing: rep.Agreeing, Canonical: rep.Canonical, Detail: rep.Detail,
	}
	v.Sig = identity.Sign(n.id, identity.PurposeVerdict, coordinator.VerdictBytes(v))
	v.Now = time.Now().UnixMilli()
	res, err := n.Apply(ctx, v)
	if err != nil {
		return err
	}
	if len(res.Refusal) > 0 {
		return fmt.Errorf("refused: %v", res.Refusal)
	}
	return nil
}

func childVerdict(ctx context.Context, raw []byte) ([]byte, error) {
	req, pl, _, _, err := decodeCompiled[verdictRequest](ctx, raw)
	if err != nil {
		return nil, err
	}
	if pl.ID != req.Job || req.Shard < 0 || req.Shard >= len(pl.Shards) || len(req.Peers) != len(req.Results) {
		return nil, fmt.Errorf("verdict request does not match job %s", pl.ID.Short())
	}
	store, err := blob.Open(req.Plan.BlobDir, 0)
	if err != nil {
		return nil, err
	}
	sh := pl.Shards[req.Shard]
	results := make([]*job.Result, len(req.Results))
	for i, ref := range req.Results {
		b, err := store.Get(ref)
		if err != nil {
			return nil, fmt.Errorf("result %s: %w", ref.Short(), err)
		}
		// A result that does not decode agrees with nothing.
		if results[i], err = job.DecodeResult(sh, b); err != nil {
			results[i] = nil
		}
	}
	var rep verdictReply
	switch req.Check {
	case coordinator.CheckFreivalds:
		rep = judgeProducts(ctx, pl, sh, req.Peers, results)
	case coordinator.CheckCompare:
		if rep, err = judgeReplicas(ctx, pl, sh, req.Peers, results); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown check %q", req.Check)
	}
	if len(rep.Detail) > 500 {
		rep.Detail = rep.Detail[:500]
	}
	return content.Encode(rep)
}

// judgeReplicas finds the largest group of results within the tolerance of
// one of them (the pivot, earliest report first on ties): its peers agree
// and the pivot's result is canonical.
func judgeReplicas(ctx context.Context, pl *job.Plan, sh job.Shard, peers []string, rs []*job.Result) (verdictReply, error) {
	var best []int
	var worst float64
	var why string
	for i, a := range rs {
		if a == nil {
			continue
		}
		group, maxAbs := []int{i}, 0.0
		for k, b := range rs {
			if k == i || b == nil {
				continue
			}
			c, err := pl.Compare(ctx, sh, a, b)
			if err != nil {
				return verdictReply{}, err
			}
			if c.Within {
				group = append(group, k)
				maxAbs = max(maxAbs, c.MaxAbs)
			} else if why == "" {
				why = fmt.Sprintf("%s against %s: %s %s", peers[i], peers[k], c.Where, c.Reason)
			}
		}
		if len(group) > len(best) {
			best, worst = group, maxAbs
		}
	}
	if len(best) == 0 {
		return verdictReply{Detail: "no result decodes"}, nil
	}
	rep := verdictReply{Canonical: rs[best[0]].Hash}
	for _, k := range best {
		rep.Agreeing = append(rep.Agreeing, peers[k])
	}
	slices.Sort(rep.Agreeing)
	rep.Detail = fmt.Sprintf("%d of %d within %s (largest difference %g)", len(best), len(rs), pl.Tolerance(), worst)
	if why != "" {
		rep.Detail += "; " + why
	}
	return rep, nil
}

// judgeProducts accepts the first result that passes the program's verify
// (Freivalds) check, with vectors from crypto/rand.
func judgeProducts(ctx context.Context, pl *job.Plan, sh job.Shard, peers []string, rs []*job.Result) verdictReply {
	var failed []string
	for i, r := range rs {
		if r == nil {
			failed = append(failed, peers[i]+" (undecodable)")
			continue
		}
		ok, err := pl.CheckProduct(ctx, sh, r, rand.Reader)
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s (%v)", peers[i], err))
			continue
		}
		if ok {
			return verdictReply{Agreeing: []string{peers[i]}, Canonical: r.Hash,
				Detail: fmt.Sprintf("%s passed %d Freivalds rounds (error probability 2^-%d)", peers[i], pl.FreivaldsRounds(), pl.FreivaldsRounds())}
		}
		failed = append(failed, peers[i])
	}
	return verdictReply{Detail: fmt.Sprintf("failed %d Freivalds rounds: %v", pl.FreivaldsRounds(), failed)}
}
