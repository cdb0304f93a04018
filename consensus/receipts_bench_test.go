package consensus

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/trust"
)

// BenchmarkReceipts measures receipts committed per second on a 3-node
// loopback cluster (TLS, raft-wal with fsync) whose state machine is the
// real coordinator: each measured operation is one ReportResult, proposed
// through the batched Apply, that verifies its shard (replicas 1, regime
// own) and mints one receipt. The baseline, in the same run on the same
// cluster, is raw raft.Apply of no-op entries of the size of one encoded
// report, bypassing the batcher; the receipt rate is also reported as a
// multiple of it (x-raw). Both report p50/p99 latency per caller.
//
// Setup, untimed: one job per b.N-sized invocation (split into jobs of at
// most receiptsJobShards shards), every shard leased up front to a few
// peers with a long TTL. After the run every node's receipt-chain head and
// state hash must match and the receipts must equal the reports.
//
// The receipts-batched runs propose coordinator.Batch commands of per-cmd
// reports each (what a batching worker's POST /v1/results/batch
// proposes): many receipts per command and per log entry. Their x-raw is
// receipts/s over raw no-op entries/s, each entry one report's size.
//
// Every run also reports the CPU time the whole cluster (three nodes in
// this process) spent per receipt (cpu-us/receipt) and as a multiple of a
// raw entry's (cpu-x-raw): on a two-core machine others share, the rates
// swing with their load, the CPU figures much less. With one receipt per
// request the rate is bounded by writers / commit latency (Little's law:
// 64 writers over a commit of about two fsyncs, the leader's then a
// follower's); with many per request, by the CPU a receipt costs.
//
//	go test -run '^$' -bench Receipts -benchtime 2000x ./consensus/
func BenchmarkReceipts(b *testing.B) {
	c, sms := newCoordCluster(b, 3)
	leader := c.electFirst("n1")
	n := c.nodes[leader]
	const writers = 64

	size := len(reportCmd(b, content.Hash([]byte("size")), receiptsPeer(0), 1000))
	noop := append([]byte{entryNoop}, bytes.Repeat([]byte{'r'}, size-1)...)

	var rawRate, rawCPU float64
	b.Run(fmt.Sprintf("raw/writers=%d", writers), func(b *testing.B) {
		var cpu time.Duration
		rawRate, cpu = measureN(b, writers, b.N, func() error { return n.raft.Apply(noop, 0).Error() })
		b.ReportMetric(float64(size), "entry-bytes")
		if cpu > 0 {
			rawCPU = cpuMicros(cpu, b.N)
			b.ReportMetric(rawCPU, "cpu-us/entry")
		}
	})
	// cpuMetrics reports the CPU time the cluster (three nodes in this
	// process) spent per receipt, and as a multiple of a raw entry's: on a
	// machine others share it is steadier than the rates.
	cpuMetrics := func(b *testing.B, cpu time.Duration, receipts int) {
		if cpu <= 0 {
			return
		}
		per := cpuMicros(cpu, receipts)
		b.ReportMetric(per, "cpu-us/receipt")
		if rawCPU > 0 {
			b.ReportMetric(per/rawCPU, "cpu-x-raw")
		}
	}

	var jobs, reports int
	b.Run(fmt.Sprintf("receipts/writers=%d", writers), func(b *testing.B) {
		jobs++
		cmds := leaseAll(b, n, jobs, b.N)
		seq0, _ := sms[leader].m.Head()
		start := n.raft.LastIndex()
		var next atomic.Int64
		rate, cpu := measureN(b, writers, b.N, func() error {
			resp, err := n.Apply(context.Background(), cmds[next.Add(1)-1])
			if err != nil {
				return err
			}
			if len(resp) == 0 || resp[0] != 0 {
				return fmt.Errorf("report refused: %s", resp)
			}
			return nil
		})
		reports += b.N
		b.ReportMetric(rate, "receipts/s")
		if rawRate > 0 {
			b.ReportMetric(rate/rawRate, "x-raw")
		}
		b.ReportMetric(float64(b.N)/float64(max(1, n.raft.LastIndex()-start)), "cmds/entry")
		cpuMetrics(b, cpu, b.N)
		if seq, _ := sms[leader].m.Head(); seq != seq0+uint64(b.N) {
			b.Fatalf("leader's chain grew by %d receipts for %d reports", seq-seq0, b.N)
		}
		checkReplicas(b, sms, leader, reports)
	})

	// Many receipts per command: each writer proposes a coordinator.Batch
	// of perCmd reports (what POST /v1/results/batch proposes for a
	// batching worker), so one log entry carries many receipts and the
	// batcher still packs several writers' batches per entry.
	for _, perCmd := range []int{16, 64} {
		b.Run(fmt.Sprintf("receipts-batched/writers=%d/per-cmd=%d", writers, perCmd), func(b *testing.B) {
			jobs++
			reps := leaseAllReports(b, n, jobs, b.N)
			var cmds [][]byte
			for first := 0; first < len(reps); first += perCmd {
				var batch coordinator.Batch
				for _, r := range reps[first:min(first+perCmd, len(reps))] {
					batch.Commands = append(batch.Commands, r)
				}
				cmd, err := coordinator.EncodeCommand(batch)
				if err != nil {
					b.Fatal(err)
				}
				cmds = append(cmds, cmd)
			}
			seq0, _ := sms[leader].m.Head()
			start := n.raft.LastIndex()
			var next atomic.Int64
			_, cpu := measureN(b, writers, len(cmds), func() error {
				resp, err := n.Apply(context.Background(), cmds[next.Add(1)-1])
				if err != nil {
					return err
				}
				if len(resp) == 0 || resp[0] != 0 || bytes.Contains(resp, []byte(`"refusal"`)) {
					return fmt.Errorf("a report refused: %.300s", resp)
				}
				return nil
			})
			reports += b.N
			rate := float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(rate, "receipts/s")
			if rawRate > 0 {
				b.ReportMetric(rate/rawRate, "x-raw")
			}
			b.ReportMetric(float64(b.N)/float64(max(1, n.raft.LastIndex()-start)), "receipts/entry")
			cpuMetrics(b, cpu, b.N)
			if seq, _ := sms[leader].m.Head(); seq != seq0+uint64(b.N) {
				b.Fatalf("leader's chain grew by %d receipts for %d reports", seq-seq0, b.N)
			}
			checkReplicas(b, sms, leader, reports)
		})
	}
}

// cpuMicros is cpu per op, in microseconds.
func cpuMicros(cpu time.Duration, ops int) float64 {
	return float64(cpu.Nanoseconds()) / float64(max(1, ops)) / 1000
}

// receiptsJobShards bounds the shards of one job, so a SubmitJob command
// stays far below a megabyte.
const receiptsJobShards = 5000

// receiptsNow is the time stamped into every command: the leases' TTL is
// far longer than any run, so no lease expires.
const receiptsNow int64 = 1_750_000_000_000

var receiptsResult = content.Hash([]byte("result"))

func receiptsPeer(i int) string { return fmt.Sprintf("peer-%d", i) }

// leaseAll submits jobs with count shards in all, leases every shard to
// one of four peers, and returns one encoded ReportResult per shard.
func leaseAll(b *testing.B, n *Node, salt, count int) [][]byte {
	b.Helper()
	reps := leaseAllReports(b, n, salt, count)
	cmds := make([][]byte, len(reps))
	for i, r := range reps {
		cmd, err := coordinator.EncodeCommand(r)
		if err != nil {
			b.Fatal(err)
		}
		cmds[i] = cmd
	}
	return cmds
}

// leaseAllReports is leaseAll returning the ReportResult commands.
func leaseAllReports(b *testing.B, n *Node, salt, count int) []coordinator.ReportResult {
	b.Helper()
	const peers = 4
	cmds := make([]coordinator.ReportResult, 0, count)
	for first := 0; first < count; first += receiptsJobShards {
		shards := min(receiptsJobShards, count-first)
		job := content.Hash(fmt.Appendf(nil, "receipts-bench-%d-%d", salt, first))
		sub := coordinator.SubmitJob{
			Job: job, Name: fmt.Sprintf("receipts-%d-%d", salt, first), Bundle: content.Hash([]byte("bundle")),
			Policy: coordinator.Policy{Replicas: 1}, Now: receiptsNow,
		}
		for i := range shards {
			sub.Shards = append(sub.Shards, coordinator.ShardPlan{
				Index: i, ID: content.Hash(fmt.Appendf(nil, "%s/%d", job, i)), Price: 1, PriceBasis: "flat 1 per shard",
			})
		}
		coordApply(b, n, sub)
		leased := 0
		for p := range peers {
			var lr coordinator.LeaseResponse
			resp := coordApply(b, n, coordinator.Lease{
				Peer: receiptsPeer(p), Now: receiptsNow, TTL: coordinator.MaxLeaseTTL,
				Max: (shards + peers - 1) / peers, Job: job,
			})
			if err := json.Unmarshal(resp, &lr); err != nil {
				b.Fatal(err)
			}
			for _, g := range lr.Grants {
				cmds = append(cmds, coordinator.ReportResult{Peer: receiptsPeer(p), Job: job, Shard: g.Shard, Result: receiptsResult, Now: receiptsNow})
			}
			leased += len(lr.Grants)
		}
		if leased != shards {
			b.Fatalf("job %s: %d of %d shards leased", job.Short(), leased, shards)
		}
	}
	return cmds
}

func reportCmd(b *testing.B, job content.Ref, peer string, shard int) []byte {
	cmd, err := coordinator.EncodeCommand(coordinator.ReportResult{
		Peer: peer, Job: job, Shard: shard, Result: receiptsResult, Now: receiptsNow,
	})
	if err != nil {
		b.Fatal(err)
	}
	return cmd
}

// coordApply proposes one coordinator command and returns its JSON
// response; a refusal fails b.
func coordApply(b *testing.B, n *Node, c coordinator.Command) []byte {
	b.Helper()
	cmd, err := coordinator.EncodeCommand(c)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := n.Apply(ctx, cmd)
	if err != nil {
		b.Fatal(err)
	}
	if len(resp) == 0 || resp[0] != 0 {
		b.Fatalf("%T refused: %s", c, resp)
	}
	return resp[1:]
}

// checkReplicas waits until every node's receipt-chain head equals the
// leader's, then checks that each holds exactly reports receipts and the
// same state hash.
func checkReplicas(b *testing.B, sms map[string]*coordSM, leader string, reports int) {
	b.Helper()
	seq, head := sms[leader].m.Head()
	waitFor(b, 30*time.Second, func() bool {
		for _, sm := range sms {
			if s, h := sm.m.Head(); s != seq || h != head {
				return false
			}
		}
		return true
	}, "every node's receipt head to be %d/%s", seq, head.Short())
	want := sms[leader].m.StateHash()
	for id, sm := range sms {
		if got := len(sm.m.Receipts(0)); got != reports {
			b.Errorf("%s holds %d receipts for %d reports", id, got, reports)
		}
		if got := sm.m.StateHash(); got != want {
			b.Errorf("%s state hash %s, leader %s", id, got.Short(), want.Short())
		}
	}
}

// coordSM is the coordinator machine as a StateMachine, as
// aggregator's fsm wires it (without the event hub, which consensus cannot
// import): decode, apply, answer JSON. The first byte of a response is 0
// with the JSON response after it, or 1 with the refusal.
type coordSM struct {
	m *coordinator.Machine
}

func (s *coordSM) Apply(cmd []byte) []byte {
	c, err := coordinator.DecodeCommand(cmd)
	if err != nil {
		return append([]byte{1}, err.Error()...)
	}
	res := s.m.Apply(c)
	if res.Refused() {
		return append([]byte{1}, res.Err().Error()...)
	}
	out, err := json.Marshal(res.Response)
	if err != nil {
		panic(fmt.Sprintf("coordinator response not encodable: %v", err))
	}
	return append([]byte{0}, out...)
}

func (s *coordSM) Snapshot() ([]byte, error) { return s.m.Snapshot(), nil }

// Capture makes coordSM a Capturer, as aggregator's fsm is.
func (s *coordSM) Capture() (func() ([]byte, error), error) {
	v := s.m.Capture()
	return func() ([]byte, error) { return v.Encode(), nil }, nil
}

func (s *coordSM) Restore(b []byte) error { return s.m.Restore(b) }

// newCoordCluster is newCluster with a coordinator machine (pool regime
// own) on each node instead of the hash chain, and the benchmarks' Raft
// timing (benchTiming).
func newCoordCluster(t testing.TB, n int) (*testCluster, map[string]*coordSM) {
	t.Helper()
	c := &testCluster{
		t: t, pins: newPins(), mod: benchTiming,
		keys: map[string]*testKey{}, addrs: map[string]string{}, dirs: map[string]string{},
		nodes: map[string]*Node{}, sms: map[string]*chainSM{},
	}
	root := t.TempDir()
	t.Cleanup(c.closeAll) // runs before TempDir's removal
	lns := map[string]net.Listener{}
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("n%d", i)
		ln := listen(t, "127.0.0.1:0")
		lns[id] = ln
		c.addrs[id] = ln.Addr().String()
		c.dirs[id] = filepath.Join(root, id)
		c.keys[id] = newTestKey(t, id)
		c.pins.pin(id, c.keys[id])
		c.boot = append(c.boot, Server{ID: id, Address: c.addrs[id]})
	}
	sms := map[string]*coordSM{}
	for _, s := range c.boot {
		m, err := coordinator.New(coordinator.Config{Regime: trust.Own})
		if err != nil {
			t.Fatal(err)
		}
		sm := &coordSM{m: m}
		node, err := Open(c.config(s.ID, lns[s.ID], c.boot), sm)
		if err != nil {
			t.Fatalf("open %s: %v", s.ID, err)
		}
		c.nodes[s.ID], sms[s.ID] = node, sm
	}
	return c, sms
}
