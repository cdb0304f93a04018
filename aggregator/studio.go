package aggregator

import (
	"context"
	"fmt"
	"net"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/studio"
)

// The Studio (package studio) is served by every node on its own address
// when studio_listen is set. It reads this node's replica through
// studioSource; the only work it causes is reading blobs (decided results,
// round results, contribution records) and compiling a sweep's plan once
// in a child, under the same caps as planning, to lay out its grid.

// studioSource adapts a node to studio.Source.
type studioSource struct{ n *Node }

var _ studio.Source = studioSource{}

func (s studioSource) Jobs() []coordinator.JobStatus { return s.n.fsm.machine().Jobs() }
func (s studioSource) Job(id content.Ref) (coordinator.JobStatus, error) {
	return s.n.fsm.machine().Job(id)
}
func (s studioSource) Runs() []coordinator.RunStatus { return s.n.fsm.machine().Runs() }
func (s studioSource) Receipts(since uint64) []receipt.Receipt {
	return s.n.fsm.machine().Receipts(since)
}
func (s studioSource) Contributions() map[string]int64               { return s.n.fsm.machine().Contributions() }
func (s studioSource) Subscribe() (<-chan coordinator.Event, func()) { return s.n.hub.Subscribe("") }

func (s studioSource) Blob(ctx context.Context, ref content.Ref) ([]byte, error) {
	return s.n.fetchBlob(ctx, ref)
}

func (s studioSource) Cluster() studio.Cluster {
	st := s.n.Status()
	c := studio.Cluster{Node: st.Node, State: string(st.Raft.State), Leader: st.Raft.Leader.ID, Term: st.Raft.Term,
		CommitIndex: st.Raft.CommitIndex, AppliedIndex: st.Raft.AppliedIndex, ChainSeq: st.ChainSeq, ChainHead: st.ChainHead, StateHash: st.StateHash}
	for _, sv := range st.Raft.Servers {
		c.Servers = append(c.Servers, sv.ID)
	}
	return c
}

// studioPlan is what the studio-plan child answers.
type studioPlan struct {
	Params []map[string]any `cbor:"params"`
	Metric string           `cbor:"metric"`
	Goal   string           `cbor:"goal"`
}

const studioPlanHandler = "aggregator.studio-plan"

func init() { sandboxproc.Register(studioPlanHandler, childStudioPlan) }

// Plan compiles the job's bundle in a child, as planning does, and
// returns its shards' parameters.
func (s studioSource) Plan(ctx context.Context, js coordinator.JobStatus) (studio.Plan, error) {
	p := s.n.planner
	if err := p.local(ctx, js.Bundle); err != nil {
		return studio.Plan{}, err
	}
	out, err := p.inChild(ctx, studioPlanHandler, planRequest{Bundle: js.Bundle, BlobDir: p.blobDir, CacheDir: p.cacheDir, Caps: p.wireCaps()})
	if err != nil {
		return studio.Plan{}, err
	}
	var sp studioPlan
	if err := content.Decode(out, &sp); err != nil {
		return studio.Plan{}, fmt.Errorf("studio plan child answered garbage: %w", err)
	}
	return studio.Plan{Params: sp.Params, Metric: sp.Metric, Goal: sp.Goal}, nil
}

func childStudioPlan(ctx context.Context, raw []byte) ([]byte, error) {
	var req planRequest
	if err := content.Decode(raw, &req); err != nil {
		return nil, err
	}
	pl, _, err := compileInChild(ctx, req.Bundle, req.BlobDir, req.CacheDir, req.Caps)
	if err != nil {
		return nil, err
	}
	sp := studioPlan{Params: make([]map[string]any, len(pl.Shards))}
	for i, sh := range pl.Shards {
		sp.Params[i] = sh.Params
	}
	sp.Metric, _ = pl.Spec.Reducer.Params["metric"].(string)
	sp.Goal, _ = pl.Spec.Reducer.Params["goal"].(string)
	return content.Encode(sp)
}

// startStudio serves the Studio on addr until the node closes.
func (n *Node) startStudio(addr string) error {
	host, _, _ := net.SplitHostPort(addr)
	cfg, fp, err := studio.TLSConfig(n.id, n.fed, host)
	if err != nil {
		return err
	}
	srv := studio.NewServer(studioSource{n}, n.fed, n.log)
	ctx, cancel := context.WithCancel(context.Background())
	bound, stop, err := srv.Listen(ctx, addr, cfg)
	if err != nil {
		cancel()
		return err
	}
	n.studioAddr, n.studioFingerprint = bound, fp
	n.studioStop = func() {
		cancel()
		stop()
	}
	return nil
}

// StudioAddr is the address the Studio listens on (nil when it is off)
// and the SHA-256 fingerprint of the certificate browsers get.
func (n *Node) StudioAddr() (net.Addr, string) { return n.studioAddr, n.studioFingerprint }
