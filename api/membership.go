package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// Membership changes through the log (docs/identity.md): an operator's
// signed change is checked here against the membership this node follows
// (signature, names, roles, keys, addresses), then proposed; the
// coordinator decides the rest. Members fetch the signed changes to verify
// and apply them themselves.

// ChangesResponse lists the signed membership changes after a point.
type ChangesResponse struct {
	Federation string                  `json:"federation"`
	Total      int                     `json:"total"` // changes applied in all
	Changes    []identity.SignedChange `json:"changes"`
}

// changeMembership serves POST /v1/federation/changes.
func (s *Server) changeMembership(w http.ResponseWriter, r *http.Request) {
	var sc identity.SignedChange
	if !decode(w, r, &sc) {
		return
	}
	c := sc.Change
	if _, err := s.Fed.Verify(sc); err != nil {
		writeDiags(w, http.StatusBadRequest, diagsOf(err))
		return
	}
	if ds := CheckChange(c); len(ds) > 0 {
		writeDiags(w, http.StatusBadRequest, ds)
		return
	}
	if c.Op == identity.OpRevoke && s.Voters != nil {
		if m, ok := s.Fed.Member(c.Name); ok && m.Role == identity.Aggregator && slices.Contains(s.Voters(), c.Name) {
			writeDiag(w, http.StatusConflict, diag.New(diag.MembershipQuorum, fmt.Sprintf("member %q", c.Name), "%s is still a Raft voter: the cluster counts it in its quorum", c.Name).
				WithHelp("remove it from the cluster first (scellis aggregator leave %s), then revoke it", c.Name))
			return
		}
	}
	signed, err := content.Encode(sc)
	if err != nil {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.PoolBadRequest, "change", "cannot encode the change: %v", err))
		return
	}
	cmd := coordinator.ChangeMembership{
		Seq: c.Seq, Op: string(c.Op), Operator: c.Operator, Signed: signed, Now: s.now(),
		Member: coordinator.MemberEntry{Name: c.Name, Role: string(c.Role), PublicKey: c.PublicKey, Address: c.Address, RaftAddress: c.RaftAddress},
	}
	if s.Fed.Applied() == 0 {
		cmd.Base = Entries(s.Fed.Members)
	}
	s.apply(w, r, cmd)
}

// CheckChange checks what a change says before it is proposed: a valid
// name, and for an addition a known role, a well-formed key and addresses
// where the role needs them (the checks of the federation file); a
// rotation or revocation carries nothing it does not apply, so what an
// operator signed is exactly what changes.
func CheckChange(c identity.Change) diag.List {
	var ds diag.List
	add := func(err error) {
		if err != nil {
			ds = append(ds, diagsOf(err)...)
		}
	}
	add(identity.CheckName(c.Name))
	switch c.Op {
	case identity.OpAdd:
		r, err := identity.ParseRole(string(c.Role))
		add(err)
		_, err = identity.ParsePublicKey(c.PublicKey)
		add(err)
		if c.Address != "" {
			add(identity.CheckAddress(c.Address))
		}
		if c.RaftAddress != "" {
			add(identity.CheckAddress(c.RaftAddress))
		}
		switch {
		case r == identity.Aggregator && (c.Address == "" || c.RaftAddress == ""):
			ds = append(ds, diag.New(diag.MemberAddress, c.Name, "an aggregator needs an address and a raft_address").
				WithHelp("give --address HOST:PORT and --raft-address HOST:PORT"))
		case r.Person() && c.Address != "":
			ds = append(ds, diag.New(diag.MemberAddress, c.Name, "a person (%s) serves nothing and has no address", r).
				WithHelp("leave out --address"))
		case r != identity.Aggregator && c.RaftAddress != "":
			ds = append(ds, diag.New(diag.MemberAddress, c.Name, "a %s has no Raft address", r).
				WithHelp("leave out --raft-address: only aggregators take part in Raft"))
		}
	case identity.OpRotate:
		_, err := identity.ParsePublicKey(c.PublicKey)
		add(err)
		if c.Role != "" || c.Address != "" || c.RaftAddress != "" {
			ds = append(ds, diag.New(diag.PoolBadRequest, c.Name, "a rotation carries the member's name and new key only, not a role or addresses").
				WithHelp("a rotation changes the key alone; revoke and add the member to change anything else"))
		}
	case identity.OpRevoke:
		if c.Role != "" || c.PublicKey != "" || c.Address != "" || c.RaftAddress != "" {
			ds = append(ds, diag.New(diag.PoolBadRequest, c.Name, "a revocation carries the member's name only, not a role, key or addresses").
				WithHelp("revoke the member by its name: scellis federation revoke NAME"))
		}
	default:
		ds = append(ds, diag.New(diag.PoolBadRequest, c.Name, "unknown membership operation %q", c.Op).
			WithHelp("use add, revoke or rotate"))
	}
	return ds
}

// Entries converts federation members to replicated membership entries.
func Entries(ms []identity.Member) []coordinator.MemberEntry {
	out := make([]coordinator.MemberEntry, len(ms))
	for i, m := range ms {
		out[i] = coordinator.MemberEntry{Name: m.Name, Role: string(m.Role), PublicKey: m.PublicKey.String(), Address: m.Address, RaftAddress: m.RaftAddress}
	}
	return out
}

// Members converts replicated membership entries back to members; an
// entry that does not parse is left out (the server checked every one
// before it was proposed).
func Members(es []coordinator.MemberEntry) []identity.Member {
	out := make([]identity.Member, 0, len(es))
	for _, e := range es {
		k, err := identity.ParsePublicKey(e.PublicKey)
		if err != nil {
			continue
		}
		out = append(out, identity.Member{Name: e.Name, Role: identity.Role(e.Role), PublicKey: k, Address: e.Address, RaftAddress: e.RaftAddress})
	}
	return out
}

// ChangesPage is the most changes one GET /v1/federation/changes answers:
// a long-lived federation's history is fetched in pages (Total says how
// many there are), so one request's response stays bounded.
const ChangesPage = 256

// changes serves GET /v1/federation/changes?after=N: the changes after the
// first N, at most ChangesPage of them.
func (s *Server) changes(w http.ResponseWriter, r *http.Request) {
	after := 0
	if a := r.URL.Query().Get("after"); a != "" {
		n, err := strconv.Atoi(a)
		if err != nil || n < 0 {
			writeDiag(w, http.StatusBadRequest, diag.New(diag.PoolBadRequest, "after", "after=%q is not a change count", a))
			return
		}
		after = n
	}
	var all [][]byte
	if s.Changes != nil {
		all = s.Changes()
	}
	out := ChangesResponse{Federation: s.Fed.Name, Total: len(all), Changes: []identity.SignedChange{}}
	page := all[min(after, len(all)):]
	page = page[:min(len(page), ChangesPage)]
	for _, b := range page {
		var sc identity.SignedChange
		if err := content.Decode(b, &sc); err != nil {
			s.logError("membership change", err)
			break
		}
		out.Changes = append(out.Changes, sc)
	}
	writeJSON(w, http.StatusOK, out)
}

func diagsOf(err error) diag.List {
	if ds, ok := diag.As(err); ok {
		return ds
	}
	return diag.List{diag.New(diag.PoolBadRequest, "change", "%v", err)}
}

// SyncMembership fetches the membership changes fed has not applied yet
// from the aggregators and applies them, each verified against the
// membership before it (identity.Federation.ApplyChanges): a member
// follows what operators signed, whatever the aggregator that answers.
// It returns how many changes it applied.
func SyncMembership(ctx context.Context, c *Client, fed *identity.Federation) (int, error) {
	applied := 0
	for {
		resp, err := c.MembershipChanges(ctx, fed.Applied())
		if err != nil {
			return applied, err
		}
		if resp.Federation != fed.Name {
			return applied, diag.New(diag.MembershipSignature, "federation", "the aggregators serve federation %q, not %q", resp.Federation, fed.Name).
				WithHelp("check the federation file")
		}
		n, err := fed.ApplyChanges(resp.Changes)
		applied += n
		if err != nil || n == 0 || fed.Applied() >= resp.Total {
			return applied, err // done, or a page that moved nothing: no loop
		}
	}
}

// FollowMembership keeps fed's membership up to date: at once, then every
// interval, it syncs (SyncMembership) and reports what changed through logf, until ctx
// ends. Silos, workers and long-running clients run it, so that a member
// added, revoked or re-keyed (an aggregator's rotated key) is followed
// without a restart.
func FollowMembership(ctx context.Context, c *Client, fed *identity.Federation, every time.Duration, logf func(format string, args ...any)) {
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		n, err := SyncMembership(ctx, c, fed)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing && logf != nil { // once per outage, not every interval
				logf("membership: %v", err)
			}
			failing = true
		case err == nil:
			failing = false
			if n > 0 && logf != nil {
				logf("membership: applied %d change(s); %d in all", n, fed.Applied())
			}
		}
	}
}
