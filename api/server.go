package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// Server serves the control-plane API of one aggregator node.
type Server struct {
	Fed   *identity.Federation
	Apply Applier
	Read  Reader
	Plan  Planner
	// Runs plans launched training runs; nil refuses POST /v1/runs.
	Runs    RunPlanner
	Events  *Hub
	Status  func() any // node status for GET /v1/status
	Log     *slog.Logger
	Now     func() time.Time
	NodeURL string
	// Durable, if set, is called before a result hash is proposed: it
	// makes sure the result's bytes are stored on enough nodes that losing
	// one loses no accepted result. An error refuses the report (503); the
	// worker retries.
	Durable func(ctx context.Context, ref content.Ref) error
	// DurableAll, if set, is Durable for the results of a batched report
	// at once (one error per ref, nil when durable); else Durable is
	// called for each.
	DurableAll func(ctx context.Context, refs []content.Ref) []error
	// Leader names the current leader and its API URL, and whether this
	// node is it; nil on a single node.
	Leader func() (name, url string, self bool)
	// Membership changes the Raft voters (join and leave); nil disables them.
	Membership Membership
	// Fresh describes how recent this node's replica is; nil: always
	// fresh (a single node). Reads from a node that is not fresh are
	// refused (SC7107) so the client asks another node.
	Fresh func() ReadInfo
	// Linearize, called on the leader, returns once every write committed
	// before the call is applied here, after confirming with a quorum that
	// this node still leads (a Raft barrier). Reads asked with
	// ?consistent=true go through it; nil: reads are always local.
	Linearize func(ctx context.Context) error
	// Seen, if set, hears of every lease request a peer makes (its
	// heartbeat: a silo polls for leases all the time, see
	// LeaseRequest.WaitMS); Gone hears of a peer whose held lease request
	// ended because the peer went away (its connection closed).
	Seen, Gone func(peer string)
	// Changes returns the signed membership changes applied so far, in
	// order (canonical encodings of identity.SignedChange); nil: none.
	Changes func() [][]byte
	// Voters names the Raft voters; a voter cannot be revoked (SC1117).
	Voters func() []string
	// Reach, if set, opens (and closes) a connection from this node to
	// aggregator node's API within ctx, for GET /v1/cluster/reach/{name}
	// (reach.go); a diagnostic refuses the name. Nil: 501.
	Reach func(ctx context.Context, node string) error
	// Model, if set, assembles and signs a run's model file from this
	// node's replica, reading only what viewer may read (GET
	// /v1/runs/{id}/model, modelfile.go). Nil: 501.
	Model func(ctx context.Context, run content.Ref, viewer identity.Member) ([]byte, error)
	// MaxHold caps how long a lease request is held (0: 30 s). The
	// aggregator sets half its silo lease: a held poll is a silo's
	// heartbeat, so it must end, and be renewed, before the lease lapses,
	// whatever poll the silo's config asks for.
	MaxHold time.Duration

	// holds counts the long-lived requests (held lease polls, event
	// streams) each member has open, bounded per member (hold.go).
	holds holds
}

// ReadInfo says where a read was answered and how fresh it is; the
// server sends it in the X-Scellis-Node, X-Scellis-Applied-Index,
// X-Scellis-Leader-Contact-Ms and X-Scellis-Linearizable headers.
type ReadInfo struct {
	Node         string `json:"node"`
	AppliedIndex uint64 `json:"applied_index"`
	// LeaderContactMs is how long ago the node last heard from the
	// leader (0 on the leader; -1 when it knows none).
	LeaderContactMs int64 `json:"leader_contact_ms"`
	Stale           bool  `json:"stale,omitempty"`
	// Linearizable: the leader confirmed its leadership and applied every
	// committed write before answering.
	Linearizable bool `json:"linearizable,omitempty"`
	// CatchingUp: the node hears the leader but has not yet applied what
	// the cluster had committed when it reached it (a node that just
	// started); Stale is then set too, and reads are refused.
	CatchingUp bool `json:"catching_up,omitempty"`
}

// Membership adds and removes aggregator voters. Both return a
// *NotLeaderError on a follower.
type Membership interface {
	Join(ctx context.Context, member string) error
	Leave(ctx context.Context, member string) error
}

// MemberRequest names a federation member for join or leave.
type MemberRequest struct {
	Member string `json:"member"`
}

type peerKey struct{}

// peerOf returns the authenticated member making the request.
func peerOf(r *http.Request) identity.Member {
	m, _ := r.Context().Value(peerKey{}).(identity.Member)
	return m
}

// auth admits only federation members (the TLS layer already refused
// unknown keys; this is the second lock) whose role e allows.
func (s *Server) auth(h http.HandlerFunc, e Endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		m, ok := s.Fed.PeerFromRequest(r)
		if !ok {
			writeDiag(w, http.StatusUnauthorized, diag.New(diag.PoolUnknownPeer, "request", "the client certificate is not a member of the federation (revoked, rotated to a new key, or never added)").
				WithHelp("an operator adds a member with scellis federation add (or its entry in the federation file)"))
			return
		}
		if !e.Allows(m.Role) {
			writeDiag(w, http.StatusForbidden, Forbidden(m, e))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, bodyLimit(e))
		h(w, r.WithContext(context.WithValue(r.Context(), peerKey{}, m)))
	}
}

// read guards a handler that answers from the local replica: a node cut
// off from the leader refuses (SC7107, the client asks another node), and
// ?consistent=true makes the read linearizable — a follower sends it to
// the leader, the leader confirms its leadership and applies every
// committed write first. The answer carries the node's applied index and
// leader contact age in headers.
func (s *Server) read(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.Fresh == nil {
			h(w, r)
			return
		}
		consistent := r.URL.Query().Get("consistent") == "true"
		if consistent && s.Leader != nil && s.Linearize != nil {
			name, url, self := s.Leader()
			if !self {
				if url == "" {
					writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.PoolNoLeader, "cluster", "no leader is elected yet, so no linearizable read").
						WithHelp("retry in a moment; clients do it by themselves"))
					return
				}
				toLeader(w, r, name, url)
				return
			}
			if err := s.Linearize(r.Context()); err != nil {
				writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.PoolNoLeader, "cluster", "could not confirm leadership for a linearizable read: %v", err).
					WithHelp("retry; clients do it by themselves"))
				return
			}
		}
		info := s.Fresh()
		info.Linearizable = consistent && s.Linearize != nil
		if info.CatchingUp {
			writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.PoolStaleRead, info.Node,
				"this aggregator is catching up (at applied index %d): it has not yet applied all the cluster had committed when it reached the leader", info.AppliedIndex).
				WithHelp("clients ask another aggregator, or this one again, by themselves; a node that just started replays its log first"))
			return
		}
		if info.Stale {
			writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.PoolStaleRead, info.Node,
				"this aggregator has not heard from a leader for %s; what it would answer may be out of date", contactAge(info.LeaderContactMs)).
				WithHelp("clients ask another aggregator by themselves; if every node says this, a majority is down or partitioned (scellis aggregator status)"))
			return
		}
		hd := w.Header()
		hd.Set("X-Scellis-Node", info.Node)
		hd.Set("X-Scellis-Applied-Index", strconv.FormatUint(info.AppliedIndex, 10))
		hd.Set("X-Scellis-Leader-Contact-Ms", strconv.FormatInt(info.LeaderContactMs, 10))
		if info.Linearizable {
			hd.Set("X-Scellis-Linearizable", "true")
		}
		h(w, r)
	}
}

func contactAge(ms int64) string {
	if ms < 0 {
		return "a while (no leader known)"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

func (s *Server) now() int64 {
	if s.Now != nil {
		return s.Now().UnixMilli()
	}
	return time.Now().UnixMilli()
}

// decode reads a bounded JSON body, refusing unknown fields.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return DecodeJSON(w, r, v, diag.PoolBadRequest, decodeHelp)
}

const decodeHelp = "control-plane requests carry hashes, not data; upload bytes to the blob endpoint"

// DecodeJSON reads one JSON value from r's body (bounded by the caller's
// http.MaxBytesReader) into v, refusing unknown fields and trailing data.
// On failure it writes the refusal — code, with help — and returns false:
// 413 for a body over its bound, 400 otherwise.
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any, code diag.Code, help string) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		status := http.StatusBadRequest
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			status = http.StatusRequestEntityTooLarge
		}
		writeDiag(w, status, diag.New(code, r.URL.Path, "malformed request body: %v", err).WithHelp("%s", help))
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeDiag(w, http.StatusBadRequest, diag.New(code, r.URL.Path, "trailing data after the JSON body"))
		return false
	}
	return true
}

// apply proposes cmd and writes its outcome: 200 with the response, 4xx
// with diagnostics when refused, 307 to the leader from a follower.
func (s *Server) apply(w http.ResponseWriter, r *http.Request, cmd coordinator.Command) {
	res, err := s.Apply.Apply(r.Context(), cmd)
	s.writeApplied(w, r, res, err)
}

// writeApplied writes the outcome of a proposed command, as apply says.
func (s *Server) writeApplied(w http.ResponseWriter, r *http.Request, res Applied, err error) {
	if err != nil {
		var nl *NotLeaderError
		if errors.As(err, &nl) {
			if nl.URL == "" {
				writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.PoolNoLeader, "cluster", "no leader is elected yet").
					WithHelp("retry in a moment"))
				return
			}
			toLeader(w, r, nl.Leader, nl.URL)
			return
		}
		if ds, ok := diag.As(err); ok {
			writeDiags(w, http.StatusBadRequest, ds)
			return
		}
		s.logError("apply", err)
		writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.PoolNoLeader, "cluster", "the command was not committed: %v", err).
			WithHelp("retry; requests are idempotent"))
		return
	}
	if len(res.Refusal) > 0 {
		writeDiags(w, statusFor(res.Refusal), res.Refusal)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(res.Response)
	w.Write([]byte("\n"))
}

func statusFor(ds diag.List) int {
	switch ds[0].Code {
	case diag.PoolUnknownJob:
		return http.StatusNotFound
	case diag.PoolNoLease, diag.PoolLeaseNotLive, diag.PoolRevealEarly:
		return http.StatusConflict
	case diag.PoolForbidden:
		return http.StatusForbidden
	case diag.PoolPlanBusy:
		return http.StatusTooManyRequests
	case diag.ContentKilled, diag.PoolPriceCap:
		return http.StatusUnprocessableEntity
	}
	return http.StatusBadRequest
}

func (s *Server) logError(what string, err error) {
	if s.Log != nil {
		s.Log.Error(what, "err", err)
	}
}

func (s *Server) submit(w http.ResponseWriter, r *http.Request) {
	var req SubmitRequest
	if !decode(w, r, &req) {
		return
	}
	if !content.IsRef(string(req.Bundle)) {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.PoolBadRequest, "submit", "bundle %q is not a ref", req.Bundle))
		return
	}
	cmd, err := s.Plan.Plan(r.Context(), req.Bundle, peerOf(r).Name)
	if err != nil {
		if ds, ok := diag.As(err); ok {
			writeDiags(w, statusFor(ds), ds)
			return
		}
		// Not a diagnostic: say so without quoting it, since it may come
		// from the submitter's files.
		s.logError("plan", err)
		writeDiag(w, http.StatusBadRequest, diag.New(diag.PoolBadJob, "submit", "the job cannot be planned").
			WithHelp("run it with scellis run to see why; upload the bundle and every blob it names before submitting"))
		return
	}
	cmd.Now = s.now()
	s.apply(w, r, cmd)
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Read.Jobs())
}

func (s *Server) jobID(w http.ResponseWriter, r *http.Request) (content.Ref, bool) {
	id, err := content.ParseRef(r.PathValue("id"))
	if err != nil {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.PoolBadRequest, "job", "%v", err))
		return "", false
	}
	return id, true
}

func (s *Server) jobStatus(w http.ResponseWriter, r *http.Request) {
	id, ok := s.jobID(w, r)
	if !ok {
		return
	}
	js, err := s.Read.Job(id)
	redactJob(&js, peerOf(r))
	s.writeRead(w, r, js, err)
}

// writeRead answers a read of the local replica. A follower that does not
// know the thing yet (it may not have applied a just-submitted job or run)
// sends the reader to the leader rather than deny that it exists.
func (s *Server) writeRead(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err == nil {
		writeJSON(w, http.StatusOK, v)
		return
	}
	if s.Leader != nil {
		if name, url, self := s.Leader(); !self && url != "" {
			toLeader(w, r, name, url)
			return
		}
	}
	ds, ok := diag.As(err)
	if !ok {
		ds = diag.List{diag.New(diag.PoolUnknownJob, r.URL.Path, "%v", err)}
	}
	writeDiags(w, http.StatusNotFound, ds)
}

func (s *Server) startRun(w http.ResponseWriter, r *http.Request) {
	var req RunRequest
	if !decode(w, r, &req) {
		return
	}
	if !content.IsRef(string(req.Spec)) || (req.Strategy != "" && !content.IsRef(string(req.Strategy))) {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.PoolBadRequest, "runs", "spec %q or strategy %q is not a ref", req.Spec, req.Strategy).
			WithHelp("upload the canonical run spec (and a strategy that is not built in) with PutBlob and send their refs"))
		return
	}
	if s.Runs == nil {
		writeDiag(w, http.StatusNotImplemented, diag.New(diag.PoolBadRequest, "runs", "this node does not run training"))
		return
	}
	cmd, err := s.Runs.PlanRun(r.Context(), req, peerOf(r).Name)
	if err != nil {
		var nl *NotLeaderError
		if errors.As(err, &nl) && nl.URL != "" {
			toLeader(w, r, nl.Leader, nl.URL)
			return
		}
		if ds, ok := diag.As(err); ok {
			writeDiags(w, http.StatusBadRequest, ds)
			return
		}
		writeDiag(w, http.StatusBadRequest, diag.New(diag.PoolBadJob, "runs", "cannot plan the run: %v", err).
			WithHelp("upload the run spec and its strategy's source before launching"))
		return
	}
	cmd.Now = s.now()
	s.apply(w, r, cmd)
}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Read.Runs())
}

func (s *Server) runStatus(w http.ResponseWriter, r *http.Request) {
	id, ok := s.jobID(w, r)
	if !ok {
		return
	}
	st, err := s.Read.Run(id)
	s.writeRead(w, r, st, err)
}

func (s *Server) lease(w http.ResponseWriter, r *http.Request) {
	var req LeaseRequest
	if !decode(w, r, &req) {
		return
	}
	peer := peerOf(r).Name
	if req.WaitMS > 0 && s.Leader != nil {
		// A long poll is the peer's heartbeat: it belongs on the leader,
		// which decides who is in a round.
		if name, url, self := s.Leader(); !self && url != "" {
			toLeader(w, r, name, url)
			return
		}
	}
	if req.Heartbeat {
		s.heartbeat(w, r, peer, time.Duration(req.WaitMS)*time.Millisecond)
		return
	}
	if d := req.Kinds.Check(); d != nil {
		writeDiag(w, http.StatusBadRequest, d)
		return
	}
	s.seen(peer)
	now := s.now()
	if s.Read.Leasable(peer, req.Kinds, now) == 0 && req.WaitMS > 0 {
		wait := time.Duration(req.WaitMS) * time.Millisecond
		if s.MaxHold > 0 {
			wait = min(wait, s.MaxHold)
		}
		leave, ok := s.holds.enter(w, "lease", peer, maxLeaseHolds)
		if !ok {
			return
		}
		held := s.holdLease(r, peer, req.Kinds, wait)
		// The place is given back before Gone is called, so Gone sees
		// only the peer's other held polls (Held): a silo holds one per
		// lane, and all end together when it dies.
		leave()
		if !held {
			if s.Gone != nil {
				s.Gone(peer)
			}
			return
		}
		s.seen(peer)
		now = s.now()
	}
	if s.Read.Leasable(peer, req.Kinds, now) == 0 {
		// Nothing to grant: answer without writing to the replicated log,
		// so idle workers polling cost no consensus round.
		writeJSON(w, http.StatusOK, coordinator.LeaseResponse{Grants: []coordinator.LeaseGrant{}})
		return
	}
	s.apply(w, r, coordinator.Lease{Peer: peer, Now: now, Max: req.Max, Job: req.Job, RequestID: req.RequestID, Kinds: req.Kinds})
}

// heartbeat holds a heartbeat (LeaseRequest.Heartbeat) until wait
// passes (capped as a lease poll is) or the peer goes away, and leases
// nothing. Its place is given back before Gone is called, so Gone sees
// only the peer's other heartbeats (Beating): a child cluster whose
// leader died still beats through its other nodes. (A node between two
// heartbeats, for the moment it takes to send the next, holds none: if
// another node's connection closes just then the child is judged gone
// until that next heartbeat, milliseconds later — a leader death that
// costs a round retry anyway.)
func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request, peer string, wait time.Duration) {
	s.seen(peer)
	if wait > 0 {
		wait = min(wait, maxLeaseWait)
		if s.MaxHold > 0 {
			wait = min(wait, s.MaxHold)
		}
		leave, ok := s.holds.enter(w, "heartbeat", peer, maxHeartbeats)
		if !ok {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-r.Context().Done():
			t.Stop()
			leave()
			if s.Gone != nil {
				s.Gone(peer)
			}
			return
		case <-t.C:
		}
		leave()
		s.seen(peer)
	}
	writeJSON(w, http.StatusOK, coordinator.LeaseResponse{Grants: []coordinator.LeaseGrant{}})
}

func (s *Server) seen(peer string) {
	if s.Seen != nil {
		s.Seen(peer)
	}
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request) {
	var req RenewRequest
	if !decode(w, r, &req) {
		return
	}
	s.apply(w, r, coordinator.RenewLease{Peer: peerOf(r).Name, Job: req.Job, Shard: req.Shard, Now: s.now()})
}

func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	var req ReleaseRequest
	if !decode(w, r, &req) {
		return
	}
	s.apply(w, r, coordinator.ReleaseLeases{Peer: peerOf(r).Name, Now: s.now(), Shards: req.Shards})
}

func (s *Server) report(w http.ResponseWriter, r *http.Request) {
	var req ResultReport
	if !decode(w, r, &req) {
		return
	}
	if ds, status := s.reportRefusal(req, fmt.Sprintf("job %s shard %d", req.Job.Short(), req.Shard), s.now()); ds != nil {
		writeDiags(w, status, ds)
		return
	}
	if s.Durable != nil {
		if err := s.Durable(r.Context(), req.Result); err != nil {
			writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.BlobMissing, req.Result.Short(),
				"the result is not stored durably yet: %v", err).WithHelp("upload the result blob, then report again"))
			return
		}
	}
	// The key is the one the caller authenticated with; the state machine
	// checks the signature with it (and against the replicated membership).
	peer := peerOf(r)
	s.apply(w, r, coordinator.ReportResult{Peer: peer.Name, Job: req.Job, Shard: req.Shard, Result: req.Result, Nonce: req.Nonce,
		Key: peer.PublicKey.String(), Sig: req.Sig, Path: req.Path, Cite: req.Cite, Now: s.now()})
}

// reportRefusal is what refuses a report before any log entry and before
// any wait for its bytes, with its HTTP status: a result that is not a ref
// (400; not mistaken for a blob to wait for), an unknown job (404), a
// reveal before the shard's reveal is open (409, answered from the
// replica: the worker waits and reveals again). Nil: go on.
func (s *Server) reportRefusal(rep ResultReport, subject string, now int64) (diag.List, int) {
	if !content.IsRef(string(rep.Result)) {
		return diag.List{diag.New(diag.PoolBadRequest, subject, "result %.80q is not a ref", rep.Result).
			WithHelp("report the sha256 ref of the result bytes uploaded to the blob endpoint")}, http.StatusBadRequest
	}
	if err := s.knownJob(rep.Job); err != nil {
		if ds, ok := diag.As(err); ok {
			return ds, http.StatusNotFound
		}
	}
	if open, at := s.Read.RevealOpen(rep.Job, rep.Shard, now); !open {
		return diag.List{coordinator.RevealEarly(subject, rep.Shard, at)}, http.StatusConflict
	}
	return nil, 0
}

// knownJob returns nil when the pool holds job id, else why not. A
// Reader that can answer without building the job's status (O(shards),
// once per report) says so with HasJob.
func (s *Server) knownJob(id content.Ref) error {
	if h, ok := s.Read.(interface{ HasJob(content.Ref) error }); ok {
		return h.HasJob(id)
	}
	_, err := s.Read.Job(id)
	return err
}

func (s *Server) commit(w http.ResponseWriter, r *http.Request) {
	var req CommitRequest
	if !decode(w, r, &req) {
		return
	}
	if !content.IsRef(string(req.Commitment)) {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.PoolBadRequest, "commits", "commitment %q is not a ref", req.Commitment).
			WithHelp("send coordinator.Commitment(result, your member name, job, shard, nonce)"))
		return
	}
	s.apply(w, r, coordinator.CommitResult{Peer: peerOf(r).Name, Job: req.Job, Shard: req.Shard, Commitment: req.Commitment, Now: s.now()})
}

func (s *Server) reduced(w http.ResponseWriter, r *http.Request) {
	var req ReducedReport
	if !decode(w, r, &req) {
		return
	}
	s.apply(w, r, coordinator.ReportReduced{Job: req.Job, Peer: peerOf(r).Name, Reduced: req.Reduced, Within: req.Within, Now: s.now()})
}

func (s *Server) receipts(w http.ResponseWriter, r *http.Request) {
	var since uint64
	if v := r.URL.Query().Get("since"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeDiag(w, http.StatusBadRequest, diag.New(diag.PoolBadRequest, "receipts", "since=%q is not a sequence number", v))
			return
		}
		since = n
	}
	writeJSON(w, http.StatusOK, s.Read.Receipts(since))
}

func (s *Server) contributions(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Read.Contributions())
}

func (s *Server) peers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Read.Peers())
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	if s.Status == nil {
		writeJSON(w, http.StatusOK, map[string]any{})
		return
	}
	writeJSON(w, http.StatusOK, s.Status())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(w, "\n")
	}
}

func writeDiag(w http.ResponseWriter, status int, d *diag.Diagnostic) {
	writeDiags(w, status, diag.List{d})
}

func writeDiags(w http.ResponseWriter, status int, ds diag.List) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	diag.RenderJSON(w, ds)
}

func (s *Server) membership(join bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req MemberRequest
		if !decode(w, r, &req) {
			return
		}
		if s.Membership == nil {
			writeDiag(w, http.StatusNotImplemented, diag.New(diag.PoolBadRequest, "cluster", "this node does not change membership"))
			return
		}
		op := s.Membership.Leave
		if join {
			op = s.Membership.Join
		}
		err := op(r.Context(), req.Member)
		var nl *NotLeaderError
		switch {
		case err == nil:
			writeJSON(w, http.StatusOK, map[string]any{"member": req.Member, "joined": join})
		case errors.As(err, &nl) && nl.URL != "":
			toLeader(w, r, nl.Leader, nl.URL)
		default:
			if ds, ok := diag.As(err); ok {
				writeDiags(w, http.StatusBadRequest, ds)
				return
			}
			writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.PoolNoLeader, req.Member, "%v", err).
				WithHelp("the member must be running, listed as an aggregator with a raft_address in every node's federation file"))
		}
	}
}

// toLeader redirects a request to the same path on the leader; clients
// follow it (307 keeps the method and body).
func toLeader(w http.ResponseWriter, r *http.Request, name, url string) {
	w.Header().Set("X-Scellis-Leader", name)
	http.Redirect(w, r, url+r.URL.RequestURI(), http.StatusTemporaryRedirect)
}

// CancelRequest says why a job is cancelled.
type CancelRequest struct {
	Reason string `json:"reason,omitempty"`
}

// readmit lifts a peer's exclusion after failed spot checks; the route
// admits operators only, and the machine checks it again.
func (s *Server) readmit(w http.ResponseWriter, r *http.Request) {
	p := peerOf(r)
	s.apply(w, r, coordinator.Readmit{Peer: r.PathValue("name"), By: p.Name, Operator: p.Role == identity.Operator, Now: s.now()})
}

func (s *Server) cancelJob(w http.ResponseWriter, r *http.Request) {
	id, ok := s.jobID(w, r)
	if !ok {
		return
	}
	var req CancelRequest
	if !decode(w, r, &req) {
		return
	}
	p := peerOf(r)
	s.apply(w, r, coordinator.CancelJob{Job: id, Peer: p.Name, Operator: p.Role == identity.Operator, Reason: req.Reason, Now: s.now()})
}

// Forbidden is the SC7108 refusal of member m calling e.
func Forbidden(m identity.Member, e Endpoint) *diag.Diagnostic {
	roles := make([]string, len(e.Roles))
	for i, r := range e.Roles {
		roles[i] = string(r)
	}
	return diag.New(diag.PoolForbidden, m.Name, "%s is a %s, and a %s may not call %s", m.Name, m.Role, m.Role, e).
		WithHelp("%s is for members with role %s; use such an identity (scellis keygen --role …, listed in the federation file)", e, strings.Join(roles, " or "))
}
