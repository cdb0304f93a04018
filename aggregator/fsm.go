// Package aggregator wires one aggregator node: the coordinator state
// machine replicated by consensus, the control-plane API, the blob store,
// the planner that compiles submitted bundles, and the reducer peer that
// reduces verified results. It holds no logic of its own beyond wiring; the
// decisions live in coordinator, the bytes in blob, the pipeline in job.
package aggregator

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/consensus"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
)

// fsm adapts the coordinator machine to consensus.StateMachine: it decodes
// each committed command, applies it, publishes its events to the local
// hub (every node sees the same events) and returns the outcome as JSON for
// the node that proposed it.
type fsm struct {
	mu  sync.Mutex // guards m across Restore
	m   *coordinator.Machine
	hub *api.Hub
	// members, if set, hears of every applied membership change and
	// restore, after the machine changed (membership.go).
	members func(*coordinator.Machine)
}

var _ consensus.Capturer = (*fsm)(nil)

func (f *fsm) machine() *coordinator.Machine {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m
}

func (f *fsm) Apply(cmd []byte) []byte {
	c, err := coordinator.DecodeCommand(cmd)
	if err != nil {
		return encodeApplied(api.Applied{Refusal: diag.List{diag.New(diag.PoolBadCommand, "command", "%v", err)}})
	}
	m := f.machine()
	res := m.Apply(c)
	if f.members != nil && !res.Refused() && changesMembers(c) {
		f.members(m)
	}
	f.hub.Publish(res.Events)
	if res.Refused() {
		return encodeApplied(api.Applied{Refusal: res.Refusal})
	}
	resp, err := json.Marshal(res.Response)
	if err != nil {
		panic(fmt.Sprintf("aggregator: coordinator response not encodable: %v", err))
	}
	return encodeApplied(api.Applied{Response: resp})
}

func encodeApplied(a api.Applied) []byte {
	b, err := json.Marshal(a)
	if err != nil {
		panic(fmt.Sprintf("aggregator: outcome not encodable: %v", err))
	}
	return b
}

func (f *fsm) Snapshot() ([]byte, error) { return f.machine().Snapshot(), nil }

// Capture makes f a consensus.Capturer: raft's snapshot only captures the
// machine's state on the apply goroutine, and encodes it (tens of MB, a
// second or more, with a long receipt chain) while persisting, so Apply —
// and the leader's lease — do not wait for the encoding.
func (f *fsm) Capture() (func() ([]byte, error), error) {
	v := f.machine().Capture()
	return func() ([]byte, error) { return v.Encode(), nil }, nil
}

func (f *fsm) Restore(state []byte) error {
	m := f.machine()
	if err := m.Restore(state); err != nil {
		return err
	}
	if f.members != nil {
		f.members(m)
	}
	return nil
}

// changesMembers reports whether c is (or a batch holds) a membership
// change.
func changesMembers(c coordinator.Command) bool {
	switch c := c.(type) {
	case coordinator.ChangeMembership:
		return true
	case coordinator.Batch:
		for _, b := range c.Commands {
			if changesMembers(b) {
				return true
			}
		}
	}
	return false
}
