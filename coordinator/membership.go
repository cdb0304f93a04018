package coordinator

import (
	"fmt"
	"slices"
	"strings"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
)

// Membership through the log. The federation file is the bootstrap; the
// first ChangeMembership carries the proposing leader's file members as
// Base, which seeds the replicated membership, so that every replica decides
// every later change against the same list whatever file it was started
// with. The signature was checked by the server that proposed the change
// (the machine verifies no membership signature; it checks only result and
// verdict signatures, against these keys: signed.go); it keeps the signed bytes in
// order for members to fetch and verify themselves, and decides the rules
// here: names, keys and addresses unique, keys never reused, an operator
// and an aggregator always left.

// MemberEntry is one member of the replicated membership.
type MemberEntry struct {
	Name        string `cbor:"name" json:"name"`
	Role        string `cbor:"role" json:"role"`
	PublicKey   string `cbor:"public_key" json:"public_key"`
	Address     string `cbor:"address,omitempty" json:"address,omitempty"`
	RaftAddress string `cbor:"raft_address,omitempty" json:"raft_address,omitempty"`
}

// ChangeMembership applies one operator-signed membership change: Op is
// "add" (Member complete), "revoke" (Member.Name) or "rotate"
// (Member.Name and its new Member.PublicKey). A revoked member's live
// leases are revoked with it. Seq must be the number of changes applied
// so far (SC1118 otherwise: another change came first).
type ChangeMembership struct {
	// Base seeds the membership when it is still the file's: the
	// proposer's federation file members. Ignored once seeded.
	Base     []MemberEntry `cbor:"base,omitempty" json:"base,omitempty"`
	Seq      int           `cbor:"seq" json:"seq"`
	Op       string        `cbor:"op" json:"op"`
	Member   MemberEntry   `cbor:"member" json:"member"`
	Operator string        `cbor:"operator" json:"operator"`
	// Signed is the canonical encoding of the operator's signed change,
	// kept for members to verify; opaque to the machine.
	Signed []byte `cbor:"signed" json:"signed"`
	Now    int64  `cbor:"now" json:"now"`
}

func (ChangeMembership) command() {}

// MembershipResponse answers ChangeMembership.
type MembershipResponse struct {
	Seq           int        `json:"seq"` // the change's place; the next one carries Seq+1
	Op            string     `json:"op"`
	Name          string     `json:"name"`
	LeasesRevoked []ShardRef `json:"leases_revoked"`
}

// MembershipChanged: a membership change applied.
type MembershipChanged struct {
	Seq  int    `json:"seq"`
	Op   string `json:"op"`
	Name string `json:"name"`
}

func (MembershipChanged) Kind() string       { return "membership-changed" }
func (MembershipChanged) JobID() content.Ref { return "" }

// membershipState is the replicated membership once seeded.
type membershipState struct {
	// Members sorted by name.
	Members []MemberEntry `cbor:"members"`
	// Retired are the keys of revoked members and the old keys of rotated
	// ones, sorted: never accepted for a member again.
	Retired []string `cbor:"retired,omitempty"`
	// Changes are the signed changes in order (Change i has Seq i).
	Changes [][]byte `cbor:"changes,omitempty"`
}

// maxMembers bounds the replicated membership (as the federation file is).
const maxMembers = 5000

func (m *Machine) changeMembership(c ChangeMembership) Result {
	if d := checkTime(c.Now); d != nil {
		return refuse(d)
	}
	ms := m.st.Membership
	if ms == nil {
		if len(c.Base) == 0 {
			return refuse(badCommand("the first membership change must carry the bootstrap members"))
		}
		if d := checkMembers(c.Base); d != nil {
			return refuse(d)
		}
		ms = &membershipState{Members: sortedMembers(c.Base)}
	} else {
		ms = ms.clone()
	}
	subject := fmt.Sprintf("member %q", c.Member.Name)
	if c.Seq != len(ms.Changes) {
		return refuse(diag.New(diag.MembershipStale, subject, "the change was made against %d earlier changes; the federation has %d", c.Seq, len(ms.Changes)).
			WithHelp("another membership change was applied first; run the command again"))
	}
	if len(c.Signed) == 0 || len(c.Signed) > 16<<10 {
		return refuse(badCommand("a membership change carries its signed form (at most 16 KiB)"))
	}
	if op, ok := ms.member(c.Operator); !ok || op.Role != "operator" {
		return refuse(diag.New(diag.MembershipSignature, subject, "%q is not an operator of the federation", c.Operator).
			WithHelp("sign membership changes with the key of a member whose role is operator"))
	}
	cur, exists := ms.member(c.Member.Name)
	var events []Event
	resp := &MembershipResponse{Seq: c.Seq, Op: c.Op, Name: c.Member.Name, LeasesRevoked: []ShardRef{}}
	switch c.Op {
	case "add":
		e := c.Member
		if e.Name == "" || e.Role == "" || e.PublicKey == "" {
			return refuse(badCommand("an added member needs a name, a role and a public key"))
		}
		if exists {
			return refuse(diag.New(diag.MembershipDuplicate, subject, "a member named %q is already in the federation (a %s)", e.Name, cur.Role).
				WithHelp("choose another name, or rotate the member's key (scellis federation rotate)"))
		}
		if d := ms.keyFree(subject, e.PublicKey); d != nil {
			return refuse(d)
		}
		for _, a := range []string{e.Address, e.RaftAddress} {
			if a == "" {
				continue
			}
			for _, o := range ms.Members {
				if o.Address == a || o.RaftAddress == a {
					return refuse(diag.New(diag.MembershipDuplicate, subject, "address %s is already %s's", a, o.Name).
						WithHelp("each member serves on its own address"))
				}
			}
		}
		if len(ms.Members) >= maxMembers {
			return refuse(badCommand("the federation has %d members, the most it may have", maxMembers))
		}
		ms.Members = sortedMembers(append(ms.Members, e))
	case "revoke":
		if !exists {
			return refuse(unknownMember(subject, c.Member.Name, ms))
		}
		if cur.Role == "operator" && ms.count("operator") == 1 {
			return refuse(diag.New(diag.MembershipLastOperator, subject, "%s is the federation's last operator", cur.Name).
				WithHelp("add another operator first (scellis federation add --role operator); without one, membership could never change again"))
		}
		if cur.Role == "aggregator" && ms.count("aggregator") == 1 {
			return refuse(diag.New(diag.MembershipQuorum, subject, "%s is the federation's last aggregator", cur.Name).
				WithHelp("a federation needs at least one aggregator"))
		}
		ms.Members = slices.DeleteFunc(ms.Members, func(o MemberEntry) bool { return o.Name == cur.Name })
		ms.retire(cur.PublicKey)
		// Its leases go now: its work will never be reported.
		r := m.release(ReleaseLeases{Peer: cur.Name, Now: c.Now})
		if rr, ok := r.Response.(*ReleaseResponse); ok {
			resp.LeasesRevoked = rr.Released
			for _, ev := range r.Events {
				if le, ok := ev.(LeaseEnded); ok && le.Reason == LeaseReleased && le.Peer == cur.Name {
					le.Reason = LeaseRevoked
					ev = le
				}
				events = append(events, ev)
			}
		}
	case "rotate":
		if !exists {
			return refuse(unknownMember(subject, c.Member.Name, ms))
		}
		if c.Member.PublicKey == "" {
			return refuse(badCommand("a rotation needs the new public key"))
		}
		if c.Member.PublicKey == cur.PublicKey {
			return refuse(diag.New(diag.MembershipDuplicate, subject, "%s already has this key", cur.Name).
				WithHelp("give the public key of the member's new identity (scellis keygen)"))
		}
		if d := ms.keyFree(subject, c.Member.PublicKey); d != nil {
			return refuse(d)
		}
		for i := range ms.Members {
			if ms.Members[i].Name == cur.Name {
				ms.Members[i].PublicKey = c.Member.PublicKey
			}
		}
		ms.retire(cur.PublicKey)
	default:
		return refuse(badCommand("unknown membership operation %q: add, revoke or rotate", c.Op))
	}
	ms.Changes = append(ms.Changes, slices.Clone(c.Signed))
	m.st.Membership = ms
	m.st.Now = m.clock(c.Now)
	events = append(events, MembershipChanged{Seq: c.Seq, Op: c.Op, Name: c.Member.Name})
	return Result{Response: resp, Events: events}
}

// Membership returns the replicated members (sorted by name) and the
// signed changes in order; seeded is false while the membership is still
// the federation file's (no change applied yet).
func (m *Machine) Membership() (members []MemberEntry, changes [][]byte, seeded bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	ms := m.st.Membership
	if ms == nil {
		return nil, nil, false
	}
	out := make([][]byte, len(ms.Changes))
	for i, c := range ms.Changes {
		out[i] = slices.Clone(c)
	}
	return slices.Clone(ms.Members), out, true
}

// revokedPeer reports a peer that is not a member of the seeded
// membership: its requests are refused even if they reach the machine.
func (m *Machine) revokedPeer(peer string) *diag.Diagnostic {
	if receipt.IsVolunteer(peer) {
		return nil // not a member at all: see volunteerMay
	}
	if ms := m.st.Membership; ms != nil {
		if _, ok := ms.member(peer); !ok {
			return diag.New(diag.MemberRefused, peer, "%q is not a member of the federation (revoked, or never added)", peer).
				WithHelp("ask an operator: scellis federation add")
		}
	}
	return nil
}

func unknownMember(subject, name string, ms *membershipState) *diag.Diagnostic {
	names := make([]string, len(ms.Members))
	for i, o := range ms.Members {
		names[i] = o.Name
	}
	help := "scellis federation members lists them"
	if s := diag.Suggest(name, names); s != "" {
		help = fmt.Sprintf("did you mean %q? %s", s, help)
	}
	return diag.New(diag.MembershipUnknown, subject, "no member is named %q", name).WithHelp("%s", help)
}

func (ms *membershipState) member(name string) (MemberEntry, bool) {
	i, ok := slices.BinarySearchFunc(ms.Members, name, func(e MemberEntry, n string) int { return strings.Compare(e.Name, n) })
	if !ok {
		return MemberEntry{}, false
	}
	return ms.Members[i], true
}

func (ms *membershipState) count(role string) int {
	n := 0
	for _, o := range ms.Members {
		if o.Role == role {
			n++
		}
	}
	return n
}

func (ms *membershipState) keyFree(subject, key string) *diag.Diagnostic {
	for _, o := range ms.Members {
		if o.PublicKey == key {
			return diag.New(diag.MembershipDuplicate, subject, "this public key is already %s's", o.Name).
				WithHelp("every member needs its own key (scellis keygen)")
		}
	}
	if _, retired := slices.BinarySearch(ms.Retired, key); retired {
		return diag.New(diag.MembershipDuplicate, subject, "this public key was revoked or rotated away and is never accepted again").
			WithHelp("make a new key (scellis keygen)")
	}
	return nil
}

func (ms *membershipState) retire(key string) {
	if i, ok := slices.BinarySearch(ms.Retired, key); !ok {
		ms.Retired = slices.Insert(ms.Retired, i, key)
	}
}

func (ms *membershipState) clone() *membershipState {
	return &membershipState{Members: slices.Clone(ms.Members), Retired: slices.Clone(ms.Retired), Changes: slices.Clone(ms.Changes)}
}

func sortedMembers(ms []MemberEntry) []MemberEntry {
	out := slices.Clone(ms)
	slices.SortFunc(out, func(a, b MemberEntry) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// checkMembers checks a membership list: names non-empty and distinct,
// every member with a role and a key.
func checkMembers(ms []MemberEntry) *diag.Diagnostic {
	if len(ms) > maxMembers {
		return badCommand("%d members, at most %d", len(ms), maxMembers)
	}
	seen := map[string]bool{}
	for _, e := range ms {
		if e.Name == "" || e.Role == "" || e.PublicKey == "" || seen[e.Name] {
			return badCommand("membership entry %q: a name given once, a role and a key", e.Name)
		}
		seen[e.Name] = true
	}
	return nil
}
