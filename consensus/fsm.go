package consensus

import (
	"fmt"
	"io"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/scellis/scellis/diag"
)

// StateMachine is what consensus replicates.
//
// Contract: Apply is called from one goroutine at a time, in log order, on
// every node; it must be deterministic (law 10: no clocks, no randomness, no
// I/O inside) — time and random choices travel inside cmd. Snapshot and
// Restore capture the whole state: Snapshot is called between two Applies
// and returns bytes the machine no longer touches; Restore replaces the whole
// state, never concurrently with Apply. A node opens with its machine in the
// initial (empty) state; the latest snapshot and the log rebuild the rest.
type StateMachine interface {
	// Apply applies one command and returns the response for its caller.
	Apply(cmd []byte) []byte
	// Snapshot returns the whole state.
	Snapshot() ([]byte, error)
	// Restore replaces the whole state with one returned by Snapshot.
	Restore(state []byte) error
}

// Capturer is a StateMachine whose state is cheap to capture and costly
// to encode. Raft takes a snapshot on the goroutine that applies the log,
// so with a plain StateMachine nothing applies while Snapshot encodes the
// whole state; a Capturer's Capture runs there instead, between two
// Applies, and returns a function that encodes what it captured — the
// bytes Snapshot would have returned at that moment. Raft calls that
// function while persisting the snapshot, off the apply goroutine and
// alongside later Applies, so it must touch nothing Apply changes.
type Capturer interface {
	StateMachine
	Capture() (encode func() ([]byte, error), err error)
}

// snapshotV1 is the first byte of every snapshot this package writes; the
// state machine's bytes follow.
const snapshotV1 byte = 0x01

// fsm adapts a StateMachine to raft.FSM: it unpacks batch envelopes and
// applies their commands in order. It is deliberately not a
// raft.BatchingFSM: with application-level batching, entries are few and
// large, and the entry count per fsync is not the bottleneck.
type fsm struct {
	sm StateMachine
	// applied is the index of the last command entry the machine has
	// applied (Raft's AppliedIndex counts entries handed to this
	// goroutine, which may still be queued): Node.AppliedThrough.
	applied atomic.Uint64
}

var _ raft.FSM = (*fsm)(nil)

// Apply applies one committed entry. The response, seen only by the node
// that proposed the entry, is one []byte per command of a batch.
//
// A committed entry this node cannot decode is a broken invariant — every
// entry was written by this package's encoder — so Apply panics rather than
// skip it and diverge from nodes that can.
func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	defer f.applied.Store(l.Index)
	kind, cmds, err := decodeEntry(l.Data)
	if err != nil {
		panic(fmt.Sprintf("consensus: committed log entry %d cannot be applied (invariant: every entry is a valid envelope): %v", l.Index, err))
	}
	if kind == entryNoop {
		return nil
	}
	resps := make([][]byte, len(cmds))
	for i, c := range cmds {
		resps[i] = f.sm.Apply(c)
	}
	return resps
}

// Snapshot captures the state machine between two Applies, on the apply
// goroutine: a Capturer's state is only captured here and encoded in
// Persist; any other machine's is encoded here.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	if c, ok := f.sm.(Capturer); ok {
		encode, err := c.Capture()
		if err != nil {
			return nil, fmt.Errorf("consensus: state machine capture: %w", err)
		}
		return &fsmSnapshot{encode: encode}, nil
	}
	state, err := f.sm.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("consensus: state machine snapshot: %w", err)
	}
	return &fsmSnapshot{state: state}, nil
}

// Restore replaces the state machine's state with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("consensus: read snapshot: %w", err)
	}
	if len(b) == 0 || b[0] != snapshotV1 {
		return diag.New(diag.ConsensusSnapshot, "snapshot", "unknown snapshot format").
			WithHelp("remove the node's data directory and let it catch up from the cluster")
	}
	if err := f.sm.Restore(b[1:]); err != nil {
		return fmt.Errorf("consensus: state machine restore: %w", err)
	}
	return nil
}

// fsmSnapshot is a captured state, written by Persist while Apply goes on:
// the encoded state, or (from a Capturer) the function that encodes it.
type fsmSnapshot struct {
	state  []byte
	encode func() ([]byte, error)
}

// Persist encodes the state if it was only captured, then writes it. Raft
// runs it on its snapshot goroutine, not the apply goroutine.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if s.encode != nil {
		state, err := s.encode()
		if err != nil {
			_ = sink.Cancel()
			return fmt.Errorf("consensus: state machine snapshot: %w", err)
		}
		s.state, s.encode = state, nil
	}
	if _, err := sink.Write([]byte{snapshotV1}); err != nil {
		_ = sink.Cancel()
		return err
	}
	if _, err := sink.Write(s.state); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

// Release drops the state, so that raft, which may keep the snapshot
// object a while, does not keep the captured state alive with it.
func (s *fsmSnapshot) Release() { s.state, s.encode = nil, nil }
