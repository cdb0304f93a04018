package coordinator

import (
	"fmt"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
)

// A tree of coordinator clusters (docs/tree.md). A child cluster is an
// ordinary cluster whose leader leases a parent job's shards from the
// parent cluster under a delegate identity and submits them to its own
// cluster as a sub-job: the same program (the same bundle), restricted to
// those shards. The sub-job's Delegation is that record, in the child's
// replicated state, so a new leader of the child resumes what the old one
// delegated. The child's own workers compute the shards and its own
// verification regime decides them; its leader then reports the verified
// results upward, each report citing the child chain's head
// (ReportResult.Cite), and the parent's receipts keep the citations.

// Delegation makes a job the sub-job of a parent cluster's job.
type Delegation struct {
	// Delegate is the child cluster's member name in the parent
	// federation: the peer the parent leased the shards to.
	Delegate string `cbor:"delegate" json:"delegate"`
	// Job is the parent job; its bundle is the sub-job's bundle.
	Job content.Ref `cbor:"job" json:"job"`
	// Shards are the parent's index of each shard of the sub-job, in
	// increasing order: sub-job shard i is parent shard Shards[i].
	Shards []int `cbor:"shards" json:"shards"`
	// Lease is the request ID of the parent lease that granted them: the
	// same shards leased again (after this sub-job was cancelled or its
	// shards flagged) make a new sub-job, not the old one again.
	Lease string `cbor:"lease" json:"lease"`
	// Root and RootShards are set when the parent job is itself a
	// sub-job (a tree of more than two levels): Root is the job at the
	// top of the tree, whose plan the bundle compiles to, and sub-job
	// shard i is its shard RootShards[i]. A worker runs that plan.
	Root       content.Ref `cbor:"root,omitempty" json:"root,omitempty"`
	RootShards []int       `cbor:"root_shards,omitempty" json:"root_shards,omitempty"`
}

// Plan returns the job whose plan the sub-job's bundle compiles to and
// that job's index of each sub-job shard: the root of the tree's job
// (Root) when the parent job is a sub-job too, else the parent job.
func (d Delegation) Plan() (content.Ref, []int) {
	if d.Root != "" {
		return d.Root, d.RootShards
	}
	return d.Job, d.Shards
}

// SubJobID is the ID of the sub-job serving d.
func SubJobID(d Delegation) content.Ref {
	h, err := content.HashOf(struct {
		Domain string     `cbor:"domain"`
		D      Delegation `cbor:"d"`
	}{"scellis/subjob/v1", d})
	if err != nil {
		panic("coordinator: encoding a delegation: " + err.Error())
	}
	return h
}

// checkDelegation checks a sub-job's record against its submission.
func checkDelegation(c SubmitJob, subject string) *diag.Diagnostic {
	d := c.Delegated
	if d == nil {
		return nil
	}
	bad := func(format string, args ...any) *diag.Diagnostic {
		return diag.New(diag.PoolBadJob, subject, format, args...).
			WithHelp("a sub-job is proposed by a child cluster's leader for shards it leased from its parent (docs/tree.md)")
	}
	switch {
	case d.Delegate == "" || len(d.Delegate) > maxName || len(d.Lease) > maxName:
		return bad("the delegate's name must have 1 to %d bytes, the lease request ID at most %d", maxName, maxName)
	case !content.IsRef(string(d.Job)):
		return bad("parent job %q is not a content ref", d.Job)
	case len(d.Shards) != len(c.Shards):
		return bad("the delegation names %d parent shards for %d shards", len(d.Shards), len(c.Shards))
	case c.Run != "" && c.Policy.Replicas != 1:
		return bad("a round's sub-job has exactly one replica per shard (only the silo holds its data), not %d", c.Policy.Replicas)
	case d.Root != "" && !content.IsRef(string(d.Root)):
		return bad("root job %q is not a content ref", d.Root)
	case d.Root != "" && len(d.RootShards) != len(d.Shards), d.Root == "" && len(d.RootShards) > 0:
		return bad("the delegation names %d root shards for %d parent shards (and root job %q)", len(d.RootShards), len(d.Shards), d.Root)
	case SubJobID(*d) != c.Job:
		return bad("job ID %s is not the sub-job ID of its delegation (%s)", c.Job.Short(), SubJobID(*d).Short())
	}
	for i, p := range d.Shards {
		if p < 0 || (i > 0 && p <= d.Shards[i-1]) {
			return bad("parent shard %d at position %d: parent shards are distinct, non-negative and in increasing order", p, i)
		}
	}
	for i, p := range d.RootShards {
		if p < 0 || slices.Contains(d.RootShards[:i], p) {
			return bad("root shard %d at position %d: root shards are distinct and non-negative", p, i)
		}
	}
	return nil
}

func cloneDelegation(d *Delegation) *Delegation {
	if d == nil {
		return nil
	}
	c := *d
	c.Shards = slices.Clone(d.Shards)
	c.RootShards = slices.Clone(d.RootShards)
	return &c
}

// checkCite checks a report's citation of a child chain head: it names
// the reporting peer and is signed with the key that signed the report.
func checkCite(c ReportResult) string {
	if c.Cite == nil {
		return ""
	}
	switch {
	case c.Cite.Peer != c.Peer:
		return fmt.Sprintf("cites the chain of %q, not its own", c.Cite.Peer)
	case c.Cite.Seq == 0 || !content.IsRef(string(c.Cite.Head)):
		return "cites no receipt of its chain (sequence 0 or a head that is not a ref)"
	case !c.Cite.Verify(c.Key):
		return "carries a citation of its chain head not signed by its key"
	}
	return ""
}

// citesOf returns the citations of s's agreeing peers, in their order
// (nil when none cites).
func citesOf(s *shardState) []receipt.Citation {
	var out []receipt.Citation
	for _, p := range s.Agreeing {
		if rep := s.reportOf(p); rep != nil && rep.Cite != nil {
			c := *rep.Cite
			c.Sig = bytesClone(c.Sig)
			out = append(out, c)
		}
	}
	return out
}

func cloneCite(c *receipt.Citation) *receipt.Citation {
	if c == nil {
		return nil
	}
	out := *c
	out.Sig = bytesClone(c.Sig)
	return &out
}
