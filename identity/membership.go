package identity

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/scellis/scellis/diag"
)

// Membership changes.
//
// The federation file is the bootstrap. Afterwards an operator adds,
// revokes and re-keys members with Changes it signs (PurposeMembership);
// the aggregators check and order them through the Raft log, and every
// node replaces the effective member list of its Federation, so TLS
// pinning follows without a restart. Silos, workers and people fetch the
// signed changes from an aggregator and verify each one against the
// membership as it stood before it (ApplyChanges): an aggregator can
// withhold changes, but cannot forge one.

// ChangeOp is what a membership change does.
type ChangeOp string

const (
	// OpAdd adds a member (name, role, key, addresses).
	OpAdd ChangeOp = "add"
	// OpRevoke removes a member: its key is refused from then on.
	OpRevoke ChangeOp = "revoke"
	// OpRotate gives a member a new public key; the old one is refused.
	OpRotate ChangeOp = "rotate"
)

// Change is one membership change as an operator signs it.
type Change struct {
	// Federation names the federation, so a change cannot be replayed in
	// another one.
	Federation string `cbor:"federation" json:"federation"`
	// Seq is how many changes the federation had before this one: a change
	// applies once, at its place in the order, never replayed.
	Seq  int      `cbor:"seq" json:"seq"`
	Op   ChangeOp `cbor:"op" json:"op"`
	Name string   `cbor:"name" json:"name"`
	// Role, Address and RaftAddress: the new member's (add only).
	Role        Role   `cbor:"role,omitempty" json:"role,omitempty"`
	Address     string `cbor:"address,omitempty" json:"address,omitempty"`
	RaftAddress string `cbor:"raft_address,omitempty" json:"raft_address,omitempty"`
	// PublicKey is the new member's key (add) or the member's new key
	// (rotate), in text form.
	PublicKey string `cbor:"public_key,omitempty" json:"public_key,omitempty"`
	// Operator is the member who signs the change; it must hold the
	// operator role when the change applies.
	Operator string `cbor:"operator" json:"operator"`
}

// SignedChange is a Change with its operator's signature.
type SignedChange struct {
	Change    Change `cbor:"change" json:"change"`
	Signature []byte `cbor:"signature" json:"signature"`
}

// SignChange signs c as the operator id.
func SignChange(id *Identity, c Change) (SignedChange, error) {
	sig, err := SignValue(id, PurposeMembership, c)
	if err != nil {
		return SignedChange{}, err
	}
	return SignedChange{Change: c, Signature: sig}, nil
}

// Verify checks sc against the membership f has now: the signer must be a
// member with the operator role whose key made the signature, and the
// change must be for this federation. A refusal is SC1113.
func (f *Federation) Verify(sc SignedChange) (Member, error) {
	c := sc.Change
	if c.Federation != f.Name {
		return Member{}, changeDiag(c, "the change is for federation %q, not %q", c.Federation, f.Name)
	}
	op, ok := f.Member(c.Operator)
	if !ok {
		return Member{}, changeDiag(c, "%q, who signed it, is not a member", c.Operator)
	}
	if op.Role != Operator {
		return Member{}, changeDiag(c, "%q, who signed it, is a %s, not an operator", c.Operator, op.Role)
	}
	if !VerifyValue(op.PublicKey, PurposeMembership, c, sc.Signature) {
		return Member{}, changeDiag(c, "the signature is not %s's", c.Operator)
	}
	return op, nil
}

func changeDiag(c Change, format string, args ...any) *diag.Diagnostic {
	return diag.New(diag.MembershipSignature, fmt.Sprintf("membership change %d (%s %s)", c.Seq, c.Op, c.Name), format, args...).
		WithHelp("membership changes are signed by a member with the operator role (scellis federation add|revoke|rotate --identity OPERATOR_KEY)")
}

// MemberOf returns the member a change adds or re-keys; for a revocation,
// just its name.
func (c Change) MemberOf() (Member, error) {
	m := Member{Name: c.Name, Role: c.Role, Address: c.Address, RaftAddress: c.RaftAddress}
	if c.Op == OpRevoke {
		return m, nil
	}
	k, err := ParsePublicKey(c.PublicKey)
	if err != nil {
		return m, err
	}
	m.PublicKey = k
	return m, nil
}

// Applied is how many membership changes f has applied (ApplyChanges), or
// the Seq that the next one must carry.
func (f *Federation) Applied() int {
	if f.live == nil {
		return 0
	}
	return int(f.live.applied.Load())
}

// ApplyChanges verifies and applies signed changes in order on top of the
// current membership. Each must carry the next Seq (one already applied is
// skipped) and verify against the membership as it stood before it
// (Verify), so a change signed by a revoked operator never applies. It
// stops at the first change that fails and returns how many it applied.
// The checks of a change's content (duplicates, the last operator…) are the
// aggregators'; a member only follows what an operator signed.
func (f *Federation) ApplyChanges(changes []SignedChange) (int, error) {
	if f.live == nil {
		return 0, fmt.Errorf("identity: federation %q was not parsed from a file", f.Name)
	}
	f.live.mu.Lock()
	defer f.live.mu.Unlock()
	n := 0
	for _, sc := range changes {
		next := int(f.live.applied.Load())
		if sc.Change.Seq < next {
			continue
		}
		if sc.Change.Seq > next {
			return n, changeDiag(sc.Change, "change %d is missing before it", next)
		}
		if _, err := f.Verify(sc); err != nil {
			return n, err
		}
		members, err := applyChange(f.current(), sc.Change)
		if err != nil {
			return n, err
		}
		f.live.members.Store(&members)
		f.live.applied.Add(1)
		n++
	}
	return n, nil
}

// applyChange returns members with c applied: an added member replaces one
// of the same name, a revoked one is removed, a rotated one gets its new
// key.
func applyChange(members []Member, c Change) ([]Member, error) {
	m, err := c.MemberOf()
	if err != nil {
		return nil, err
	}
	out := slices.Clone(members)
	i := slices.IndexFunc(out, func(x Member) bool { return x.Name == c.Name })
	switch c.Op {
	case OpAdd:
		if i >= 0 {
			out[i] = m
		} else {
			out = append(out, m)
		}
	case OpRevoke:
		if i >= 0 {
			out = slices.Delete(out, i, i+1)
		}
	case OpRotate:
		if i < 0 {
			return nil, changeDiag(c, "no member is named %q", c.Name)
		}
		out[i].PublicKey = m.PublicKey
	default:
		return nil, changeDiag(c, "unknown operation %q", c.Op)
	}
	return out, nil
}

// SetMembers replaces the effective membership with members and records
// that applied changes made it. Aggregators call it with the replicated
// membership after every change they apply (and after a snapshot restore).
func (f *Federation) SetMembers(members []Member, applied int) {
	if f.live == nil {
		panic("identity: SetMembers on a federation not parsed from a file")
	}
	f.live.mu.Lock()
	defer f.live.mu.Unlock()
	ms := slices.Clone(members)
	f.live.members.Store(&ms)
	f.live.applied.Store(int64(applied))
}

// Current returns the effective membership: the file's members with every
// applied change.
func (f *Federation) Current() []Member { return slices.Clone(f.current()) }

// With returns a separate Federation whose membership is f's plus m, for a
// node that an operator added through the log but whose copy of the file
// does not list it: it can authenticate with its own certificate (which
// needs its own entry) while it fetches the changes that add it. Changes to
// one do not reach the other.
func (f *Federation) With(m Member) *Federation {
	g := *f
	ms := append(f.Current(), m)
	g.live = newLive(ms)
	g.live.applied.Store(int64(f.Applied()))
	return &g
}

func (f *Federation) current() []Member {
	if f.live == nil {
		return f.Members
	}
	return *f.live.members.Load()
}

// liveMembers is the effective membership of a Federation: replaced
// wholesale (copy on write), read without locks by every handshake.
type liveMembers struct {
	mu      sync.Mutex // serialises writers
	members atomic.Pointer[[]Member]
	applied atomic.Int64
}

func newLive(ms []Member) *liveMembers {
	l := &liveMembers{}
	ms = slices.Clone(ms)
	l.members.Store(&ms)
	return l
}
