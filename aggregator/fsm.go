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
	return encodeResponse(resp)
}

// appliedPrefix opens the encoding of an api.Applied holding only a
// response.
const appliedPrefix = `{"response":`

// encodeResponse encodes api.Applied{Response: resp} for resp straight
// from json.Marshal — compact and HTML-escaped, so the bytes are those
// encodeApplied would write — without scanning and copying resp again.
func encodeResponse(resp []byte) []byte {
	if len(resp) == 0 || string(resp) == "null" {
		return encodeApplied(api.Applied{Response: resp})
	}
	b := make([]byte, 0, len(appliedPrefix)+len(resp)+1)
	b = append(b, appliedPrefix...)
	b = append(b, resp...)
	return append(b, '}')
}

// decodeApplied decodes what fsm.Apply returned. An outcome that holds
// only a response (encodeResponse: every command not refused) is sliced,
// not scanned again; the response is valid JSON, the machine's own
// json.Marshal output. Anything else is decoded as JSON.
func decodeApplied(out []byte) (api.Applied, error) {
	if len(out) > len(appliedPrefix)+1 && string(out[:len(appliedPrefix)]) == appliedPrefix && out[len(out)-1] == '}' {
		return api.Applied{Response: out[len(appliedPrefix) : len(out)-1]}, nil
	}
	var a api.Applied
	err := json.Unmarshal(out, &a)
	return a, err
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
