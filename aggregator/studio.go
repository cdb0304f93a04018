package aggregator

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/studio"
)

// The Studio (package studio) is served by every node on its own address
// when studio_listen is set. It reads this node's replica through
// studioSource; the only work it causes is reading blobs (decided results,
// round results, contribution records) and compiling a sweep's plan once
// in a child, under the same caps as planning, to lay out its grid.

// studioSource adapts a node to studio.Source. peers holds the other
// aggregators' health as last asked (name → studio.NodeHealth).
type studioSource struct {
	n     *Node
	peers *sync.Map
	hash  *stateHashCache
}

// stateHashCache: the state hash encodes the whole state (a snapshot), too
// dear for every picture of a busy sweep; the view shows one at most
// studio.Refresh old.
type stateHashCache struct {
	mu  sync.Mutex
	at  time.Time
	ref content.Ref
}

func (c *stateHashCache) get(m *coordinator.Machine) content.Ref {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ref == "" || time.Since(c.at) >= studio.Refresh {
		c.ref, c.at = m.StateHash(), time.Now()
	}
	return c.ref
}

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
	m := s.n.fsm.machine()
	seq, head := m.Head()
	rs := s.n.raft.Status()
	st := NodeStatus{Node: s.n.Self.Name, Raft: rs, ChainSeq: seq, ChainHead: head}
	c := studio.Cluster{Node: st.Node, State: string(st.Raft.State), Leader: st.Raft.Leader.ID, Term: st.Raft.Term,
		CommitIndex: st.Raft.CommitIndex, AppliedIndex: st.Raft.AppliedIndex, ChainSeq: st.ChainSeq, ChainHead: st.ChainHead, StateHash: s.hash.get(m)}
	for _, sv := range st.Raft.Servers {
		c.Servers = append(c.Servers, sv.ID)
	}
	for _, m := range s.n.fed.ByRole(identity.Aggregator) {
		if m.Name == st.Node {
			c.Nodes = append(c.Nodes, studio.NodeHealth{Node: m.Name, Reachable: true, State: c.State, Term: c.Term,
				CommitIndex: c.CommitIndex, AppliedIndex: c.AppliedIndex, ChainSeq: c.ChainSeq, ChainHead: c.ChainHead})
			continue
		}
		h := studio.NodeHealth{Node: m.Name}
		if v, ok := s.peers.Load(m.Name); ok {
			h = v.(studio.NodeHealth)
		}
		c.Nodes = append(c.Nodes, h)
	}
	return c
}

// watchPeers asks every other aggregator for its status every period
// until ctx ends, so the cluster view compares chain heads without a
// picture ever waiting on the network.
func (s studioSource) watchPeers(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		for _, m := range s.n.fed.ByRole(identity.Aggregator) {
			if m.Name == s.n.Self.Name {
				continue
			}
			h := studio.NodeHealth{Node: m.Name}
			qctx, cancel := context.WithTimeout(ctx, period)
			raw, err := s.n.peerClient.StatusOf(qctx, "https://"+m.Address)
			cancel()
			var st NodeStatus
			if err == nil && json.Unmarshal(raw, &st) == nil {
				h = studio.NodeHealth{Node: m.Name, Reachable: true, State: string(st.Raft.State), Term: st.Raft.Term,
					CommitIndex: st.Raft.CommitIndex, AppliedIndex: st.Raft.AppliedIndex, ChainSeq: st.ChainSeq, ChainHead: st.ChainHead}
			}
			s.peers.Store(m.Name, h)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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
	_, pl, _, _, err := decodeCompiled[planRequest](ctx, raw)
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
	src := studioSource{n: n, peers: &sync.Map{}, hash: &stateHashCache{}}
	srv := studio.NewServer(src, n.fed, n.log)
	ctx, cancel := context.WithCancel(context.Background())
	bound, stop, err := srv.Listen(ctx, addr, cfg)
	if err != nil {
		cancel()
		return err
	}
	var peersDone sync.WaitGroup
	peersDone.Add(1)
	go func() {
		defer peersDone.Done()
		src.watchPeers(ctx, studio.Refresh)
	}()
	n.studioAddr, n.studioFingerprint = bound, fp
	n.studioStop = func() {
		cancel()
		stop()
		peersDone.Wait()
	}
	return nil
}

// StudioAddr is the address the Studio listens on (nil when it is off)
// and the SHA-256 fingerprint of the certificate browsers get.
func (n *Node) StudioAddr() (net.Addr, string) { return n.studioAddr, n.studioFingerprint }
