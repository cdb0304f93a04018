package volunteer

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/trust"
)

// The work API. Every call acts as the session's volunteer peer; the
// coordinator decides what it may lease (open jobs that are not rounds
// and read no input tables),
// checks its signatures (SC7305) and applies reputation and spot checks
// to it as to any peer.

// Project is what the page shows before Start.
type Project struct {
	Pool   string       `json:"pool"`
	Regime trust.Regime `json:"regime"`
	Open   bool         `json:"open"`
	Jobs   []ProjectJob `json:"jobs"`
	// MaxLeases is how many shards one tab may hold at once: the page
	// runs at most that many Web Workers (more would be refused, SC7510).
	MaxLeases int `json:"max_leases"`
	// Rules say what runs and what it may not do.
	Rules []string `json:"rules"`
}

// ProjectJob is one running open job.
type ProjectJob struct {
	ID      content.Ref `json:"id"`
	Name    string      `json:"name"`
	Shards  int         `json:"shards"`
	Decided int         `json:"decided"`
}

// Rules are shown on the page (and in docs/volunteers.md).
var Rules = []string{
	"Only jobs of an open pool run here, and admission lets an open job read public inputs only.",
	"Each shard runs in the Starlark sandbox compiled to WebAssembly, with a step and memory budget.",
	"The content has no builtins for files, network (fetch), timers, clocks, the page (DOM) or the environment.",
	"Your tab signs each result with a key it made; receipts credit that key. Export it to keep your credit.",
	"Stop, a hidden tab or a battery below your floor hands every lease back at once.",
}

func (s *Server) project(w http.ResponseWriter, r *http.Request) {
	p := Project{Pool: s.opt.Pool, Regime: s.be.Regime(), Open: s.be.Regime() == trust.Open, Jobs: []ProjectJob{}, Rules: Rules,
		MaxLeases: cmp.Or(s.opt.MaxLeases, coordinator.DefaultVolunteerLeases)}
	if p.Open {
		for _, j := range s.be.Jobs() {
			if j.State != coordinator.JobRunning || j.Regime != trust.Open || j.Run != "" || j.ReadsInputs {
				continue
			}
			p.Jobs = append(p.Jobs, ProjectJob{ID: j.ID, Name: j.Name, Shards: j.Counts.Total, Decided: j.Counts.Verified + j.Counts.Unverified})
		}
	}
	writeJSON(w, http.StatusOK, p)
}

// LeaseRequest asks for up to Max shards.
type LeaseRequest struct {
	Max int `json:"max"`
}

// Grant is one leased shard, with what the tab signs for it.
type Grant struct {
	coordinator.LeaseGrant
	Tier string `json:"tier"`
}

// LeaseResponse answers a lease.
type LeaseResponse struct {
	Grants []Grant `json:"grants"`
	Peer   string  `json:"peer"`
}

func (s *Server) apply(w http.ResponseWriter, r *http.Request, cmd coordinator.Command) (json.RawMessage, bool) {
	res, err := s.be.Apply(r.Context(), cmd)
	if err != nil {
		var nl *api.NotLeaderError
		if errors.As(err, &nl) {
			writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.VolunteerNotLeader, "pool", "%v", err).
				WithHelp("the pool has no leader this node can reach (an election, or this node is cut off); the page retries"))
			return nil, false
		}
		if ds, ok := diag.As(err); ok {
			writeDiags(w, http.StatusBadRequest, ds)
			return nil, false
		}
		writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.VolunteerNotLeader, "pool", "the command was not committed: %v", err).WithHelp("the page retries"))
		return nil, false
	}
	if len(res.Refusal) > 0 {
		status := http.StatusBadRequest
		switch res.Refusal[0].Code {
		case diag.PoolNoLease, diag.PoolLeaseNotLive, diag.PoolRevealEarly:
			status = http.StatusConflict
		case diag.PoolUnknownJob:
			status = http.StatusNotFound
		case diag.VolunteerLeaseCap:
			status = http.StatusTooManyRequests
		}
		writeDiags(w, status, res.Refusal)
		return nil, false
	}
	return res.Response, true
}

func (s *Server) lease(w http.ResponseWriter, r *http.Request, ss *session) {
	var req LeaseRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Max < 1 || req.Max > 64 {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.VolunteerBadRequest, "max", "max %d: ask for 1 to 64 shards", req.Max))
		return
	}
	now := s.now().UnixMilli()
	if s.be.Leasable(ss.peer, now) == 0 {
		// Nothing to grant: answer from the replica, as the control
		// plane does for idle workers, so idle tabs cost no consensus.
		writeJSON(w, http.StatusOK, LeaseResponse{Grants: []Grant{}, Peer: ss.peer})
		return
	}
	out, ok := s.apply(w, r, coordinator.Lease{Peer: ss.peer, Now: now, Max: req.Max, Hold: s.opt.MaxLeases, Origin: ss.origin})
	if !ok {
		return
	}
	var lr coordinator.LeaseResponse
	if err := json.Unmarshal(out, &lr); err != nil {
		writeDiag(w, http.StatusInternalServerError, diag.New(diag.VolunteerBadRequest, "lease", "%v", err))
		return
	}
	resp := LeaseResponse{Grants: []Grant{}, Peer: ss.peer}
	for _, g := range lr.Grants {
		tier := ""
		if js, err := s.be.Job(g.Job); err == nil {
			tier = coordinator.TierOf(js.Policy)
		}
		resp.Grants = append(resp.Grants, Grant{LeaseGrant: g, Tier: tier})
	}
	writeJSON(w, http.StatusOK, resp)
}

// holds reports whether peer holds a live lease on job's shard, and the
// job's status.
func (s *Server) holds(peer string, id content.Ref, shard int) (coordinator.JobStatus, bool) {
	js, err := s.be.Job(id)
	if err != nil || shard < 0 || shard >= len(js.Shards) {
		return js, false
	}
	now := s.now().UnixMilli()
	for _, l := range js.Shards[shard].Leases {
		if l.Peer == peer && l.Expiry > now {
			return js, true
		}
	}
	return js, false
}

func noLease(peer string, id content.Ref, shard int) *diag.Diagnostic {
	return diag.New(diag.PoolNoLease, fmt.Sprintf("job %s shard %d", id.Short(), shard), "%s holds no live lease on this shard", peer).
		WithHelp("a volunteer asks for shards with POST /volunteer/v1/lease and works only on what it was granted; a lease handed back or expired is gone")
}

// bundleReq is a job's bundle and content sources, kept for its shards.
type bundleReq struct {
	bundle  []byte
	sources map[content.Ref][]byte
	inputs  bool
}

func (s *Server) bundleOf(ctx context.Context, js coordinator.JobStatus) (*bundleReq, error) {
	s.mu.Lock()
	b := s.bundles[js.ID]
	s.mu.Unlock()
	if b != nil {
		return b, nil
	}
	raw, err := s.be.Blob(ctx, js.Bundle)
	if err != nil {
		return nil, err
	}
	var bd job.Bundle
	if err := content.Decode(raw, &bd); err != nil {
		return nil, err
	}
	builtin, err := catalog.Builtin()
	if err != nil {
		return nil, err
	}
	b = &bundleReq{bundle: raw, sources: map[content.Ref][]byte{}, inputs: len(bd.Inputs) > 0}
	refs := []content.Ref{bd.Program, bd.Partitioner.Ref, bd.Reducer.Ref}
	for _, ref := range bd.Content {
		refs = append(refs, ref)
	}
	for _, ref := range refs {
		if _, ok := builtin.Lookup(string(ref)); ok || ref == "" || b.sources[ref] != nil {
			continue
		}
		src, err := s.be.Blob(ctx, ref)
		if err != nil {
			return nil, err
		}
		b.sources[ref] = src
	}
	s.mu.Lock()
	if len(s.bundles) >= 16 {
		clear(s.bundles)
	}
	s.bundles[js.ID] = b
	s.mu.Unlock()
	return b, nil
}

// ShardRefs is the form=refs answer of GET /volunteer/v1/shard: the
// blobs a tab fetches over its data plane (getBlob, which hash-checks
// them) to build the shard's job.ShardRequest itself — the bundle and
// the content sources the catalog does not have built in. The request
// the tab builds from them is the one the bytes form would have sent.
type ShardRefs struct {
	Job     content.Ref   `json:"job"`
	Shard   int           `json:"shard"`
	Bundle  content.Ref   `json:"bundle"`
	Sources []content.Ref `json:"sources"`
}

// shard answers GET /volunteer/v1/shard?job=…&shard=…: the shard's
// job.ShardRequest in canonical encoding, for a shard the volunteer
// holds; with form=refs, the refs of its blobs instead (ShardRefs).
func (s *Server) shard(w http.ResponseWriter, r *http.Request, ss *session) {
	id, err := content.ParseRef(r.URL.Query().Get("job"))
	idx, err2 := strconv.Atoi(r.URL.Query().Get("shard"))
	if err != nil || err2 != nil {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.VolunteerBadRequest, "shard", "job=%q shard=%q: want a job ref and a shard index", clip(r.URL.Query().Get("job")), clip(r.URL.Query().Get("shard"))))
		return
	}
	js, ok := s.holds(ss.peer, id, idx)
	if !ok {
		writeDiag(w, http.StatusConflict, noLease(ss.peer, id, idx))
		return
	}
	b, err := s.bundleOf(r.Context(), js)
	if err != nil {
		writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.BlobMissing, js.Bundle.Short(), "the job's bundle or content cannot be read: %v", err).WithHelp("the page hands the lease back and asks again"))
		return
	}
	if b.inputs {
		writeDiag(w, http.StatusUnprocessableEntity, diag.New(diag.VolunteerUnrunnable, "job "+id.Short(), "job %s reads input tables, which a browser tab has no folder to hold", js.Name).
			WithHelp("the page hands the lease back; native workers run this job"))
		return
	}
	switch form := r.URL.Query().Get("form"); form {
	case "":
	case "refs":
		refs := ShardRefs{Job: id, Shard: idx, Bundle: js.Bundle, Sources: []content.Ref{}}
		for ref := range b.sources {
			refs.Sources = append(refs.Sources, ref)
		}
		slices.Sort(refs.Sources)
		writeJSON(w, http.StatusOK, refs)
		return
	default:
		writeDiag(w, http.StatusBadRequest, diag.New(diag.VolunteerBadRequest, "form", "form=%q: want refs, or no form for the request's bytes", clip(form)))
		return
	}
	raw, err := content.Encode(job.ShardRequest{Bundle: b.bundle, Sources: b.sources, Job: id, Shard: idx})
	if err != nil {
		writeDiag(w, http.StatusInternalServerError, diag.New(diag.VolunteerBadRequest, "shard", "%v", err))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(raw)
}

func (s *Server) release(w http.ResponseWriter, r *http.Request, ss *session) {
	var req api.ReleaseRequest
	if !decode(w, r, &req) {
		return
	}
	out, ok := s.apply(w, r, coordinator.ReleaseLeases{Peer: ss.peer, Now: s.now().UnixMilli(), Shards: req.Shards})
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(out)
}

// ResultRequest delivers a shard's result and the volunteer's signature
// of its statement (coordinator.StatementOf). The result comes either as
// its bytes (Result) or, when the tab stored them with its data plane
// (putBlob, over a data channel or /blobs/), as their ref (ResultRef):
// exactly one of the two.
type ResultRequest struct {
	Job       content.Ref `json:"job"`
	Shard     int         `json:"shard"`
	Result    string      `json:"result,omitempty"`     // base64 (standard) of the canonical result bytes
	ResultRef content.Ref `json:"result_ref,omitempty"` // the ref of the result blob the tab stored on this node
	Sig       string      `json:"sig"`                  // base64 (standard)
}

// result takes a result from the tab and delivers it as a native worker
// does (pool.Deliver): commit to its hash under a fresh nonce, store the
// bytes durably, reveal once the reveal opens with the lease renewed
// meanwhile. The tab never sees another peer's commitment or result; the
// node commits for it because a tab's commitment would need the same
// bytes it sends here. The signature is the tab's own and is checked by
// the coordinator against the key the volunteer's name comes from.
//
// Once the commitment is in the log the node owes its reveal: the nonce
// lives only in this handler, and a committed peer is never leased the
// shard again, so a commitment left unopened would bar the tab's key
// from that shard for good (its result lost, the shard waiting on other
// peers). The rest of the delivery therefore no longer ends with the
// tab's request — Stop, a hidden tab, a low battery, a reload or a closed
// tab all abort it — but with the reveal, bounded by the reveal window
// (it opens one lease TTL after the shard's first commitment at the
// latest) and by the server's life (Close). The reveal opens the tab's
// own commitment with the tab's own signature, as it would have in the
// request; the coordinator accepts it from a peer that held the lease
// (late if the tab handed it back).
func (s *Server) result(w http.ResponseWriter, r *http.Request, ss *session) {
	var req ResultRequest
	if !decode(w, r, &req) {
		return
	}
	if (req.Result == "") == (req.ResultRef == "") {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.VolunteerBadRequest, "results", "a result comes as its bytes (result) or as the ref of the blob stored with the data plane (result_ref): exactly one").
			WithHelp("the volunteer page sends these requests by itself; reload it"))
		return
	}
	data, err1 := base64.StdEncoding.DecodeString(req.Result)
	sig, err2 := base64.StdEncoding.DecodeString(req.Sig)
	if err := errors.Join(err1, err2); err != nil || len(data) > maxResultBytes {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.VolunteerBadRequest, "results", "result and sig must be base64, the result at most %d bytes", maxResultBytes))
		return
	}
	js, ok := s.holds(ss.peer, req.Job, req.Shard)
	if !ok {
		writeDiag(w, http.StatusConflict, noLease(ss.peer, req.Job, req.Shard))
		return
	}
	ctx := r.Context()
	if req.ResultRef != "" {
		// The tab stored the bytes with its data plane: they must be
		// here (or on a peer) and hash to the ref, or nothing is
		// committed.
		var err error
		data, err = s.stored(ctx, req.ResultRef)
		if err != nil {
			writeDiag(w, http.StatusConflict, diag.New(diag.BlobMissing, "result_ref", "the result %s: %v", clip(string(req.ResultRef)), err).
				WithHelp("store the result with the data plane's putBlob first (it answers with the ref), or send its bytes as result"))
			return
		}
	}
	hash := content.Hash(data)
	rep := coordinator.ReportResult{Peer: ss.peer, Job: req.Job, Shard: req.Shard, Result: hash, Key: ss.key, Sig: sig}
	direct := !s.opt.CommitReveal || js.Policy.Replicas == 1
	if !direct {
		var nonce [coordinator.NonceBytes]byte
		rand.Read(nonce[:])
		commit := coordinator.Commitment(hash, ss.peer, req.Job, req.Shard, nonce[:])
		out, ok := s.apply(w, r, coordinator.CommitResult{Peer: ss.peer, Job: req.Job, Shard: req.Shard, Commitment: commit, Now: s.now().UnixMilli()})
		if !ok {
			return
		}
		rep.Nonce = fmt.Sprintf("%x", nonce)
		// Committed: see the reveal through even if the tab goes away.
		var cr coordinator.CommitResponse
		json.Unmarshal(out, &cr)
		until := time.UnixMilli(max(cr.RevealAt, s.now().UnixMilli()) + cmp.Or(js.Policy.LeaseTTL, coordinator.DefaultLeaseTTL))
		owed, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
		defer cancel()
		stop := context.AfterFunc(s.life, cancel)
		defer stop()
		ctx, r = owed, r.WithContext(owed)
	}
	if _, err := s.be.PutBlob(ctx, data); err != nil {
		writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.BlobMissing, hash.Short(), "the result could not be stored durably: %v", err).WithHelp("the page hands the lease back; the shard is leased again"))
		return
	}
	// Stored: the wait needs only the hash, so the base64 of the bytes
	// (up to 8 MiB) is not held through a reveal a tab that went away
	// left to the node (data itself is not used past here).
	req.Result = ""
	// Wait for the reveal, renewing the lease so the shard is not leased
	// to a third peer meanwhile, until the tab hands the lease back (Stop
	// and the like): then nothing is left to hold, and the renewals,
	// refused, would only cost log entries.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	renewed, holding := s.now(), true
	for !direct {
		if open, _ := s.be.RevealOpen(req.Job, req.Shard, s.now().UnixMilli()); open {
			break
		}
		if holding && s.now().Sub(renewed) > time.Second {
			res, err := s.be.Apply(ctx, coordinator.RenewLease{Peer: ss.peer, Job: req.Job, Shard: req.Shard, Now: s.now().UnixMilli()})
			holding = err != nil || len(res.Refusal) == 0
			renewed = s.now()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	rep.Now = s.now().UnixMilli()
	out, ok := s.apply(w, r, rep)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(out)
}

// stored returns the bytes of a result blob a tab stored, checked
// against ref and against the result bound.
func (s *Server) stored(ctx context.Context, ref content.Ref) ([]byte, error) {
	if _, err := content.ParseRef(string(ref)); err != nil {
		return nil, err
	}
	data, err := s.be.Blob(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("not stored on this node: %w", err)
	}
	if got := content.Hash(data); got != ref {
		return nil, fmt.Errorf("the stored bytes hash to %s", got.Short())
	}
	if len(data) > maxResultBytes {
		return nil, fmt.Errorf("%d bytes, more than a result's %d", len(data), maxResultBytes)
	}
	return data, nil
}
