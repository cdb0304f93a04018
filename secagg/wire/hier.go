package wire

import (
	"context"
	"crypto/ecdh"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"sync"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/transport"
)

// Hierarchical secure aggregation over the network (docs/secagg.md,
// "Hierarchical secure aggregation"). A child's Host runs a sub-cohort's
// round like any other (Open, with Params.Parent set; sites use
// Participate unchanged), but the round ends with the masked sum for the
// parent instead of a sum: WaitPartial takes it and Forward posts it, over
// mutual TLS, to the parent's Host, where OpenParent opened the
// hierarchical round and WaitParent returns the total once every
// sub-cohort's partial sum is in.
//
//	POST v1/parents/{round}/partial   secagg.PartialSum → 204   (aggregators only)
const pathParents = Prefix + "v1/parents/"

// hostParent is a hierarchical round this host is the parent of.
type hostParent struct {
	p       *secagg.Parent
	maxBody int64
	done    chan struct{} // closed once the total (or a failure) is out

	mu       sync.Mutex
	accepted map[string][32]byte // digest of each sub-cohort's accepted partial sum
	res      *secagg.Result
	err      error
}

// errRelayed refuses Result and Wait on a relayed round.
func errRelayed(rd *hostRound) error {
	return diag.New(diag.SecAggRelayed, rd.subject(), "the round is a sub-cohort of a hierarchical round: it ends with a masked sum for the parent, not a sum").
		WithHelp("take it with WaitPartial and Forward it to the parent's host")
}

// relay ends a relayed round: the masked sum waits for WaitPartial.
func (rd *hostRound) relay() error {
	ps, err := rd.srv.Relay()
	if err != nil {
		return rd.fail(err)
	}
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.clearLocked()
	rd.partial = ps
	rd.publishLocked(secagg.PhaseDone)
	close(rd.done)
	return nil
}

// WaitPartial waits until the relayed round (a sub-cohort whose Params
// name a parent) ends, or ctx does, and takes its partial sum — the
// survivors' masked sum, with their unmasking shares sealed to the parent
// — and forgets the round. The host cannot open it. A round that failed
// returns its diagnostic; a round with no parent, SC6019 (use Wait).
func (h *Host) WaitPartial(ctx context.Context, round string) (*secagg.PartialSum, error) {
	rd, err := h.untaken(round)
	if err != nil {
		return nil, err
	}
	select {
	case <-rd.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	rd.mu.Lock()
	if rd.isTaken {
		rd.mu.Unlock()
		return nil, ErrOver
	}
	if !rd.relayed {
		rd.mu.Unlock()
		return nil, diag.New(diag.SecAggRelayed, rd.subject(), "the round names no parent; its sum is opened on this host").
			WithHelp("take its outcome with Wait or Result")
	}
	rd.isTaken = true
	close(rd.taken)
	ps, err := rd.partial, rd.err
	rd.partial = nil
	rd.mu.Unlock()
	h.forget(rd)
	return ps, err
}

// ParentPath is the path of a hierarchical round's endpoints on the
// parent's Host, ending in "/".
func ParentPath(round string) string {
	return pathParents + base64.RawURLEncoding.EncodeToString([]byte(round)) + "/"
}

// Forward posts a sub-cohort's partial sum to the hierarchical round
// parentRound on the parent's Host at base, retrying transient failures
// (and the round not being open there yet) until ctx ends. hc must
// authenticate the child's aggregator with mutual TLS and pin the parent
// (identity.ClientTLSConfig). The partial sum carries no share in the
// clear: the child forwards what it cannot read.
func Forward(ctx context.Context, hc *http.Client, base, parentRound string, ps *secagg.PartialSum) error {
	if hc == nil || ps == nil {
		return errors.New("wire: Forward needs an *http.Client with mutual TLS and a partial sum")
	}
	b, err := ps.Marshal()
	if err != nil {
		return err
	}
	s := transport.Session{T: transport.HTTPS{Client: hc, Base: base}, Round: ParentPath(parentRound),
		Subject: fmt.Sprintf("hierarchical secure aggregation round %q", parentRound)}
	return s.Send(ctx, "partial sum", "partial", b)
}

// OpenParent opens the hierarchical round id on this host, as its parent:
// it holds key (its public half is in every sub-cohort's Params.Parent)
// and takes one partial sum per sub-cohort of cohorts from the children
// (aggregators of the federation). secagg.NewParent checks the
// sub-cohorts (three sites and a threshold each, one grid, no site twice).
// Opening an open ID again is refused (SC6104).
func (h *Host) OpenParent(id string, key *ecdh.PrivateKey, cohorts []secagg.Params) error {
	p, err := secagg.NewParent(id, key, cohorts)
	if err != nil {
		return err
	}
	var limit int64
	for _, c := range cohorts {
		n := int64(len(c.Members))
		limit = max(limit, 4<<10+8*int64(c.Dim+1)+n*(2<<10+128*n))
	}
	subject := fmt.Sprintf("hierarchical secure aggregation round %q", id)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return diag.New(diag.SecAggWireUnavailable, subject, "the secure aggregation host is closed").WithHelp("open rounds on a running aggregator")
	case h.parents[id] != nil:
		return diag.New(diag.SecAggWireConflict, subject, "the hierarchical round is already open").WithHelp("use a fresh round ID for a new round")
	case len(h.parents) >= h.opt.MaxRounds:
		return diag.New(diag.SecAggWireUnavailable, subject, "%d hierarchical rounds are open, the host's limit", len(h.parents)).
			WithHelp("take the totals of finished rounds, or raise HostOptions.MaxRounds")
	}
	if h.parents == nil {
		h.parents = map[string]*hostParent{}
	}
	h.parents[id] = &hostParent{p: p, maxBody: limit, done: make(chan struct{}), accepted: map[string][32]byte{}}
	return nil
}

// WaitParent waits until every sub-cohort's partial sum of the
// hierarchical round id is in (or ctx ends, or the host closes: SC6107)
// and returns the total, once; the round is then forgotten. A child that
// never forwards its partial sum leaves the round waiting: ctx bounds it.
func (h *Host) WaitParent(ctx context.Context, id string) (*secagg.Result, error) {
	h.mu.Lock()
	hp := h.parents[id]
	h.mu.Unlock()
	if hp == nil {
		return nil, ErrUnknownRound
	}
	select {
	case <-hp.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-h.quit:
		return nil, diag.New(diag.SecAggWireUnavailable, fmt.Sprintf("hierarchical secure aggregation round %q", id), "the aggregator's secure aggregation host closed during the round").
			WithHelp("the round ends without a result; run it again under a new round ID")
	}
	h.mu.Lock()
	delete(h.parents, id)
	h.mu.Unlock()
	hp.mu.Lock()
	defer hp.mu.Unlock()
	return hp.res, hp.err
}

// HasPartial reports whether the open hierarchical round id holds the
// partial sum of sub-cohort sub: the child that forwarded it is no longer
// needed for the total (its death then costs the round nothing).
func (h *Host) HasPartial(id, sub string) bool {
	h.mu.Lock()
	hp := h.parents[id]
	h.mu.Unlock()
	if hp == nil {
		return false
	}
	hp.mu.Lock()
	defer hp.mu.Unlock()
	_, ok := hp.accepted[sub]
	return ok
}

// AbortParent ends the hierarchical round id on this host, if it is open:
// a WaitParent waiting on it returns SC6107 with reason, and a partial sum
// posted later finds no round (SC6102). The parent's aggregator aborts a
// round it gives up on (a child lost its sub-cohort, its leadership ended).
func (h *Host) AbortParent(id, reason string) {
	h.mu.Lock()
	hp := h.parents[id]
	delete(h.parents, id)
	h.mu.Unlock()
	if hp == nil {
		return
	}
	hp.mu.Lock()
	defer hp.mu.Unlock()
	if hp.res == nil && hp.err == nil {
		hp.err = diag.New(diag.SecAggWireUnavailable, fmt.Sprintf("hierarchical secure aggregation round %q", id), "the round was aborted: %s", reason).
			WithHelp("the round ends without a result; the aggregator plans it again under a new round ID")
		close(hp.done)
	}
}

// postPartial takes a child's partial sum: from an aggregator of the
// federation over mutual TLS, for an open hierarchical round. A
// byte-identical resend is answered 204; a refused partial sum leaves the
// round waiting for a good one.
func (h *Host) postPartial(w http.ResponseWriter, r *http.Request) {
	peer, ok := h.fed.PeerFromRequest(r)
	if !ok {
		refuse(w, http.StatusUnauthorized, diag.New(diag.SecAggWireForbidden, "hierarchical secure aggregation", "the caller is not a federation member over mutual TLS").
			WithHelp("connect with the child aggregator's identity key"))
		return
	}
	raw, err := base64.RawURLEncoding.DecodeString(r.PathValue("round"))
	if err != nil || len(raw) == 0 {
		refuse(w, http.StatusBadRequest, diag.New(diag.SecAggWireBadRequest, "hierarchical secure aggregation", "the round in the path is not unpadded base64url").
			WithHelp("encode the round ID with base64.RawURLEncoding"))
		return
	}
	subject := fmt.Sprintf("hierarchical secure aggregation round %q", raw)
	if peer.Role != identity.Aggregator && peer.Role != identity.Cluster {
		refuse(w, http.StatusForbidden, diag.New(diag.SecAggWireForbidden, subject, "%q is a %s; only aggregators and child clusters (their delegate key) post partial sums", peer.Name, peer.Role).
			WithHelp("sites take part in their sub-cohort's round on their child's host"))
		return
	}
	h.mu.Lock()
	hp, closed := h.parents[string(raw)], h.closed
	h.mu.Unlock()
	switch {
	case closed:
		refuse(w, http.StatusServiceUnavailable, diag.New(diag.SecAggWireUnavailable, subject, "the aggregator's secure aggregation host is closed"))
		return
	case hp == nil:
		refuse(w, http.StatusNotFound, diag.New(diag.SecAggWireNoRound, subject, "the hierarchical round is not open on this host").
			WithHelp("the child retries until the parent opens the round"))
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != contentCBOR {
		refuse(w, http.StatusUnsupportedMediaType, diag.New(diag.SecAggWireBadRequest, subject, "partial sum sent as %q", r.Header.Get("Content-Type")).
			WithHelp("send the partial sum's canonical CBOR as %s", contentCBOR))
		return
	}
	body, err := readBody(w, r, hp.maxBody)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			refuse(w, http.StatusRequestEntityTooLarge, diag.New(diag.SecAggWireBadRequest, subject, "partial sum of more than %d bytes", hp.maxBody))
		}
		return
	}
	ps, err := secagg.ParsePartialSum(body)
	if err != nil {
		refuse(w, http.StatusBadRequest, err)
		return
	}
	sum := sha256.Sum256(body)
	hp.mu.Lock()
	defer hp.mu.Unlock()
	if prev, ok := hp.accepted[ps.Round]; ok && prev == sum {
		w.WriteHeader(http.StatusNoContent) // a retry of a partial sum that arrived
		return
	}
	if hp.res != nil || hp.err != nil {
		refuse(w, http.StatusGone, diag.New(diag.SecAggWireRoundOver, subject, "the total was already released"))
		return
	}
	if err := hp.p.AddPartial(ps); err != nil {
		refuse(w, http.StatusBadRequest, err)
		return
	}
	hp.accepted[ps.Round] = sum
	if len(hp.p.Missing()) == 0 {
		hp.res, hp.err = hp.p.Finish()
		close(hp.done)
	}
	w.WriteHeader(http.StatusNoContent)
}
