package consensus

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/trust"
)

// eagerSM is coordSM without Capture: raft's snapshot encodes its whole
// state on the apply goroutine, as every snapshot did before Capturer.
type eagerSM struct{ sm *coordSM }

func (e eagerSM) Apply(cmd []byte) []byte    { return e.sm.Apply(cmd) }
func (e eagerSM) Snapshot() ([]byte, error)  { return e.sm.Snapshot() }
func (e eagerSM) Restore(state []byte) error { return e.sm.Restore(state) }

// memSink is a raft.SnapshotSink that keeps what is written.
type memSink struct {
	bytes.Buffer
	closed, cancelled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Close() error  { s.closed = true; return nil }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }

// coordWithReceipts returns a coordinator machine (regime own, replicas
// 1) holding receipts receipts, applied in process without Raft, and
// pending more ReportResult commands, each of which mints one more
// receipt, as log entries.
func coordWithReceipts(tb testing.TB, receipts, pending int) (*coordinator.Machine, []*raft.Log) {
	tb.Helper()
	m, err := coordinator.New(coordinator.Config{Regime: trust.Own})
	if err != nil {
		tb.Fatal(err)
	}
	apply := func(c coordinator.Command) coordinator.Result {
		r := m.Apply(c)
		if r.Refused() {
			tb.Fatalf("%T refused: %v", c, r.Err())
		}
		return r
	}
	var entries []*raft.Log
	const peers = 4
	total := receipts + pending
	for first := 0; first < total; first += receiptsJobShards {
		shards := min(receiptsJobShards, total-first)
		job := content.Hash(fmt.Appendf(nil, "snapshot-%d", first))
		sub := coordinator.SubmitJob{Job: job, Name: fmt.Sprintf("snapshot-%d", first), Bundle: content.Hash([]byte("bundle")),
			Policy: coordinator.Policy{Replicas: 1}, Now: receiptsNow}
		for i := range shards {
			sub.Shards = append(sub.Shards, coordinator.ShardPlan{Index: i, ID: content.Hash(fmt.Appendf(nil, "%s/%d", job, i)), Price: 1, PriceBasis: "flat 1 per shard"})
		}
		apply(sub)
		for p := range peers {
			r := apply(coordinator.Lease{Peer: receiptsPeer(p), Now: receiptsNow, TTL: coordinator.MaxLeaseTTL, Max: (shards + peers - 1) / peers, Job: job})
			for _, g := range r.Response.(*coordinator.LeaseResponse).Grants {
				rep := coordinator.ReportResult{Peer: receiptsPeer(p), Job: job, Shard: g.Shard, Result: receiptsResult, Now: receiptsNow}
				if first+g.Shard < receipts {
					apply(rep)
					continue
				}
				cmd, err := coordinator.EncodeCommand(rep)
				if err != nil {
					tb.Fatal(err)
				}
				data, err := encodeBatch([][]byte{cmd})
				if err != nil {
					tb.Fatal(err)
				}
				entries = append(entries, &raft.Log{Type: raft.LogCommand, Index: uint64(len(entries) + 1), Data: data})
			}
		}
	}
	if seq, _ := m.Head(); seq != uint64(receipts) {
		tb.Fatalf("%d receipts, want %d", seq, receipts)
	}
	return m, entries
}

// TestSnapshotPersistsWhileApplying takes raft's snapshot of a coordinator
// machine (a Capturer: only captured on the apply goroutine), then applies
// more entries while Persist encodes on another goroutine, as raft does.
// The persisted snapshot must be the state at the capture, byte for byte:
// the eager snapshot taken then, which restores to the same StateHash.
// Under -race it also checks that encoding shares nothing Apply writes.
func TestSnapshotPersistsWhileApplying(t *testing.T) {
	m, entries := coordWithReceipts(t, 300, 300)
	f := &fsm{sm: &coordSM{m: m}}
	want := append([]byte{snapshotV1}, eagerBytes(t, m)...)
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	persisted := make(chan error, 1)
	go func() { persisted <- snap.Persist(sink) }()
	for _, e := range entries {
		for _, resp := range f.Apply(e).([][]byte) {
			if len(resp) == 0 || resp[0] != 0 {
				t.Fatalf("report refused: %s", resp)
			}
		}
	}
	if err := <-persisted; err != nil || !sink.closed || sink.cancelled {
		t.Fatalf("persist: %v (closed %v, cancelled %v)", err, sink.closed, sink.cancelled)
	}
	snap.Release()
	if !bytes.Equal(sink.Bytes(), want) {
		t.Fatalf("persisted %d bytes, the state at the snapshot encodes to %d", sink.Len(), len(want))
	}
	if seq, _ := m.Head(); seq != 600 {
		t.Fatalf("the machine holds %d receipts after the entries, want 600", seq)
	}
	fresh, err := coordinator.New(coordinator.Config{Regime: trust.Own})
	if err != nil {
		t.Fatal(err)
	}
	g := &fsm{sm: &coordSM{m: fresh}}
	if err := g.Restore(nopCloser{bytes.NewReader(sink.Bytes())}); err != nil {
		t.Fatal(err)
	}
	if fresh.StateHash() != content.Hash(want[1:]) {
		t.Fatal("the restored machine's state hash is not the snapshot's")
	}
	if seq, _ := fresh.Head(); seq != 300 {
		t.Fatalf("the restored machine holds %d receipts, want 300", seq)
	}
}

// eagerBytes is the whole state encoded on the calling goroutine, the way
// raft's snapshot of an eagerSM encodes it.
func eagerBytes(tb testing.TB, m *coordinator.Machine) []byte {
	tb.Helper()
	snap, err := (&fsm{sm: eagerSM{&coordSM{m: m}}}).Snapshot()
	if err != nil {
		tb.Fatal(err)
	}
	return snap.(*fsmSnapshot).state
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

// BenchmarkSnapshotHold measures how long raft's FSM.Snapshot holds the
// apply goroutine (nothing applies meanwhile; on the leader, a long hold
// can outlast its leader lease) for a coordinator holding snapshotReceipts
// receipts: "encode" is an eagerSM's snapshot (the whole state encoded to
// canonical CBOR there, as before Capturer), "capture" the coordinator's
// Capture (the encoding moves to Persist, off the apply goroutine). Each
// reports ms-held/op and the process's cpu-ms/op; "capture" also reports
// both as a fraction of "encode"'s in the same run (x-encode, cpu-x-encode),
// and checks that its Persist writes the eager bytes.
//
//	go test -run '^$' -bench SnapshotHold -benchtime 5x ./consensus/
func BenchmarkSnapshotHold(b *testing.B) {
	const snapshotReceipts = 20_000
	m, _ := coordWithReceipts(b, snapshotReceipts, 0)
	hold := func(b *testing.B, f *fsm) (wall, cpu float64) {
		c0, _ := cpuTime()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			snap, err := f.Snapshot()
			if err != nil {
				b.Fatal(err)
			}
			snap.Release()
		}
		elapsed := time.Since(start)
		b.StopTimer()
		c1, _ := cpuTime()
		wall = float64(elapsed.Microseconds()) / 1000 / float64(b.N)
		cpu = float64((c1 - c0).Microseconds()) / 1000 / float64(b.N)
		b.ReportMetric(wall, "ms-held/op")
		b.ReportMetric(cpu, "cpu-ms/op")
		return wall, cpu
	}
	var encWall, encCPU float64
	var eager []byte
	b.Run(fmt.Sprintf("encode/receipts=%d", snapshotReceipts), func(b *testing.B) {
		eager = eagerBytes(b, m)
		encWall, encCPU = hold(b, &fsm{sm: eagerSM{&coordSM{m: m}}})
		b.ReportMetric(float64(len(eager))/1e6, "snapshot-MB")
	})
	b.Run(fmt.Sprintf("capture/receipts=%d", snapshotReceipts), func(b *testing.B) {
		wall, cpu := hold(b, &fsm{sm: &coordSM{m: m}})
		if encWall > 0 {
			b.ReportMetric(wall/encWall, "x-encode")
		}
		if encCPU > 0 {
			b.ReportMetric(cpu/encCPU, "cpu-x-encode")
		}
		snap, err := (&fsm{sm: &coordSM{m: m}}).Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		sink := &memSink{}
		if err := snap.Persist(sink); err != nil {
			b.Fatal(err)
		}
		if eager != nil && !bytes.Equal(sink.Bytes()[1:], eager) {
			b.Fatal("the captured snapshot persists other bytes than the eager one")
		}
	})
}
