package wire

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

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
//	POST v1/parents/{round}/outer     secagg.OuterKey → 204     (child clusters, aggregators)
//	GET  v1/parents/{round}/outer     → secagg.OuterKeys        (long poll: once every sub-cohort's is in)
//
// The outer keys are how the children of a round of two or more
// sub-cohorts meet (secagg.OuterMask, docs/secagg.md, "The outer mask"):
// the parent's host only relays them — each child checks every other
// child's signature against its own copy of the parent federation — and
// never holds a private half.
const pathParents = Prefix + "v1/parents/"

// hostParent is a hierarchical round this host is the parent of.
type hostParent struct {
	id      string
	p       *secagg.Parent
	maxBody int64
	done    chan struct{} // closed once the total (or a failure) is out

	mu       sync.Mutex
	accepted map[string][32]byte // digest of each sub-cohort's accepted partial sum
	res      *secagg.Result
	err      error
	// outer holds each sub-cohort's outer key (canonical bytes) as its
	// child posted it; outerIn is closed once every sub-cohort has one.
	outer   map[string][]byte
	outerIn chan struct{}
}

// errRelayed refuses Result and Wait on a relayed round.
func errRelayed(rd *hostRound) error {
	return diag.New(diag.SecAggRelayed, rd.subject(), "the round is a sub-cohort of a hierarchical round: it ends with a masked sum for the parent, not a sum").
		WithHelp("take it with WaitPartial and Forward it to the parent's host")
}

// relay ends a relayed round: the masked sum waits for WaitPartial.
func (m *maskRound) relay() error {
	ps, err := m.srv.Relay()
	if err != nil {
		return err
	}
	m.rd.publish(func() { m.partial = ps })
	return nil
}

// WaitPartial waits until the relayed round (a sub-cohort whose Params
// name a parent) ends, or ctx does, and takes its partial sum — the
// survivors' masked sum, with their unmasking shares sealed to the parent
// — and forgets the round. The host cannot open it. A round that failed
// returns its diagnostic; a round with no parent, SC6019 (use Wait).
func (h *Host) WaitPartial(ctx context.Context, round string) (*secagg.PartialSum, error) {
	rd, err := h.ended(ctx, round, &masking)
	if err != nil {
		return nil, err
	}
	return takeOutcome(h, rd, func(m *maskRound) (*secagg.PartialSum, error) {
		if !m.relayed {
			return nil, diag.New(diag.SecAggRelayed, rd.subject(), "the round names no parent; its sum is opened on this host").
				WithHelp("take its outcome with Wait or Result")
		}
		ps := m.partial
		m.partial = nil
		return ps, nil
	})
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
	return sendParent(ctx, hc, base, parentRound, "partial sum", "partial", ps)
}

// parentSession is a child's conversation with the hierarchical round
// parentRound on the parent's Host at base.
func parentSession(hc *http.Client, base, parentRound string) *transport.Session {
	return &transport.Session{T: transport.HTTPS{Client: hc, Base: base}, Round: ParentPath(parentRound),
		Subject: fmt.Sprintf("hierarchical secure aggregation round %q", parentRound)}
}

// sendParent posts m to path of the hierarchical round parentRound on the
// parent's Host at base, until the host accepts it.
func sendParent(ctx context.Context, hc *http.Client, base, parentRound, what, path string, m marshaler) error {
	b, err := m.Marshal()
	if err != nil {
		return err
	}
	return parentSession(hc, base, parentRound).Send(ctx, what, path, b)
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
	h.parents[id] = &hostParent{id: id, p: p, maxBody: limit, done: make(chan struct{}), accepted: map[string][32]byte{},
		outer: map[string][]byte{}, outerIn: make(chan struct{})}
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

// parentCall authenticates a call on a hierarchical round this host is
// the parent of: a federation member over mutual TLS, an aggregator or a
// child cluster (its delegate key), for an open round. It answers the
// refusal itself when ok is false.
func (h *Host) parentCall(w http.ResponseWriter, r *http.Request, what string) (peer identity.Member, hp *hostParent, subject string, ok bool) {
	peer, ok = h.fed.PeerFromRequest(r)
	if !ok {
		refuse(w, http.StatusUnauthorized, diag.New(diag.SecAggWireForbidden, "hierarchical secure aggregation", "the caller is not a federation member over mutual TLS").
			WithHelp("connect with the child aggregator's identity key"))
		return peer, nil, "", false
	}
	raw, err := base64.RawURLEncoding.DecodeString(r.PathValue("round"))
	if err != nil || len(raw) == 0 {
		refuse(w, http.StatusBadRequest, diag.New(diag.SecAggWireBadRequest, "hierarchical secure aggregation", "the round in the path is not unpadded base64url").
			WithHelp("encode the round ID with base64.RawURLEncoding"))
		return peer, nil, "", false
	}
	subject = fmt.Sprintf("hierarchical secure aggregation round %q", raw)
	if peer.Role != identity.Aggregator && peer.Role != identity.Cluster {
		refuse(w, http.StatusForbidden, diag.New(diag.SecAggWireForbidden, subject, "%q is a %s; only aggregators and child clusters (their delegate key) %s", peer.Name, peer.Role, what).
			WithHelp("sites take part in their sub-cohort's round on their child's host"))
		return peer, nil, subject, false
	}
	h.mu.Lock()
	hp, closed := h.parents[string(raw)], h.closed
	h.mu.Unlock()
	switch {
	case closed:
		refuse(w, http.StatusServiceUnavailable, diag.New(diag.SecAggWireUnavailable, subject, "the aggregator's secure aggregation host is closed"))
		return peer, nil, subject, false
	case hp == nil:
		refuse(w, http.StatusNotFound, diag.New(diag.SecAggWireNoRound, subject, "the hierarchical round is not open on this host").
			WithHelp("the child retries until the parent opens the round"))
		return peer, nil, subject, false
	}
	return peer, hp, subject, true
}

// posted is a message posted to a hierarchical round, with who posted it.
type posted[M any] struct {
	peer    identity.Member
	hp      *hostParent
	subject string
	body    []byte
	msg     M
}

// parentPost authenticates a post to a hierarchical round (parentCall:
// the caller may do action), reads its body, a message of kind what of at
// most limit bytes (0: the round's bound on partial sums), and parses it
// (400 when it does not parse).
func parentPost[M any](h *Host, w http.ResponseWriter, r *http.Request, what, action string, limit int64, parse func([]byte) (M, error)) (*posted[M], bool) {
	p := &posted[M]{}
	var ok bool
	if p.peer, p.hp, p.subject, ok = h.parentCall(w, r, action); !ok || !isCBOR(w, r, p.subject, what) {
		return nil, false
	}
	if limit == 0 {
		limit = p.hp.maxBody
	}
	if p.body, ok = readLimited(w, r, p.subject, what, limit); !ok {
		return nil, false
	}
	var err error
	if p.msg, err = parse(p.body); err != nil {
		refuse(w, http.StatusBadRequest, err)
		return nil, false
	}
	return p, true
}

// postPartial takes a child's partial sum: from an aggregator of the
// federation over mutual TLS, for an open hierarchical round. A
// byte-identical resend is answered 204; a refused partial sum leaves the
// round waiting for a good one.
func (h *Host) postPartial(w http.ResponseWriter, r *http.Request) {
	p, ok := parentPost(h, w, r, "partial sum", "post partial sums", 0, secagg.ParsePartialSum)
	if !ok {
		return
	}
	hp, subject, body, ps := p.hp, p.subject, p.body, p.msg
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
	if subs := hp.p.SubRounds(); len(subs) > 1 && slices.Contains(subs, ps.Round) && hp.outer[ps.Round] == nil {
		// The child cannot have added its outer mask without the other
		// children's keys, which it gets only after posting its own: a
		// child that skipped the outer layer (a misconfigured or older
		// child) is caught here rather than exposing its sub-cohort's sum.
		refuse(w, http.StatusBadRequest, diag.New(diag.SecAggOuterKeys, subject, "a partial sum of sub-cohort %q, whose child posted no outer key", ps.Round).
			WithHelp("with two or more sub-cohorts each child posts its outer key and masks its partial sum before forwarding it"))
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

// maxOuterKey bounds a posted outer key: IDs, a key and a signature.
const maxOuterKey = 2*maxRoundID + secagg.MaxIDLength + 256

// maxRoundID is the longest round ID (secagg's bound).
const maxRoundID = 256

// postOuter takes a child's signed outer key for its sub-cohort. The host
// keeps the first key of each sub-cohort that its cluster's delegate key
// (in this host's federation) signs — so no other member can take a
// child's place — and answers a byte-identical resend 204 and another key
// for a sub-cohort that has one 409. The children check the keys
// themselves, against their own copies of the federation.
func (h *Host) postOuter(w http.ResponseWriter, r *http.Request) {
	p, ok := parentPost(h, w, r, "outer key", "post outer keys", maxOuterKey, secagg.ParseOuterKey)
	if !ok {
		return
	}
	peer, hp, subject, body, k := p.peer, p.hp, p.subject, p.body, p.msg
	bad := func(format string, args ...any) {
		refuse(w, http.StatusBadRequest, diag.New(diag.SecAggOuterKeys, subject, format, args...).
			WithHelp("a child posts the key of its own sub-cohort, signed with its delegate identity"))
	}
	cl, isMember := h.fed.Member(k.Cluster)
	switch {
	case k.Parent != hp.id:
		bad("the key is for round %q", k.Parent)
		return
	case !slices.Contains(hp.p.SubRounds(), k.Round):
		bad("%q is not a sub-cohort of the round", k.Round)
		return
	case peer.Role == identity.Cluster && peer.Name != k.Cluster:
		refuse(w, http.StatusForbidden, diag.New(diag.SecAggWireForbidden, subject, "cluster %q posted a key of cluster %q", peer.Name, k.Cluster).
			WithHelp("a child posts its own key"))
		return
	case !isMember || cl.Role != identity.Cluster || !k.Verify(cl.PublicKey.Ed25519()):
		bad("the key of %q is not signed by the delegate key of a child cluster of this federation", k.Cluster)
		return
	}
	hp.mu.Lock()
	defer hp.mu.Unlock()
	if prev, ok := hp.outer[k.Round]; ok {
		if bytes.Equal(prev, body) {
			w.WriteHeader(http.StatusNoContent) // a retry of a key that arrived
			return
		}
		refuse(w, http.StatusConflict, diag.New(diag.SecAggWireConflict, subject, "sub-cohort %q already has an outer key", k.Round).
			WithHelp("a child draws one key per round; the round runs again under a new ID"))
		return
	}
	hp.outer[k.Round] = body
	if len(hp.outer) == len(hp.p.SubRounds()) {
		close(hp.outerIn)
	}
	w.WriteHeader(http.StatusNoContent)
}

// getOuter answers the children's outer keys once every sub-cohort has
// one (a long poll: 204 after HostOptions.LongPoll; 410 once the round is
// over or aborted).
func (h *Host) getOuter(w http.ResponseWriter, r *http.Request) {
	_, hp, subject, ok := h.parentCall(w, r, "fetch outer keys")
	if !ok {
		return
	}
	timer := time.NewTimer(h.opt.LongPoll)
	defer timer.Stop()
	if !h.held(w, r, timer, subject, hp.outerIn, hp.done) {
		return
	}
	select {
	case <-hp.outerIn:
	default: // over before every key was in
		refuse(w, http.StatusGone, diag.New(diag.SecAggWireRoundOver, subject, "the hierarchical round is over").
			WithHelp("its total was released, or the parent aborted it and runs it again under a new ID"))
		return
	}
	hp.mu.Lock()
	var set secagg.OuterKeys
	for _, round := range slices.Sorted(maps.Keys(hp.outer)) {
		k, err := secagg.ParseOuterKey(hp.outer[round])
		if err != nil {
			hp.mu.Unlock()
			refuse(w, http.StatusInternalServerError, err)
			return
		}
		set.Keys = append(set.Keys, *k)
	}
	hp.mu.Unlock()
	b, err := set.Marshal()
	if err != nil {
		refuse(w, http.StatusInternalServerError, err)
		return
	}
	writeReply(w, r, reply{status: http.StatusOK, body: b})
}

// PostOuterKey posts a child's signed outer key for its sub-cohort to the
// hierarchical round parentRound on the parent's Host at base, retrying
// transient failures (and the round not being open there yet) until ctx
// ends. hc authenticates the child (its delegate key) with mutual TLS.
func PostOuterKey(ctx context.Context, hc *http.Client, base, parentRound string, k *secagg.OuterKey) error {
	if hc == nil || k == nil {
		return errors.New("wire: PostOuterKey needs an *http.Client with mutual TLS and a key")
	}
	return sendParent(ctx, hc, base, parentRound, "outer key", "outer", k)
}

// FetchOuterKeys long-polls the parent's Host at base until every
// sub-cohort of parentRound has its child's outer key, and returns them,
// unchecked: the caller checks each against its own federation
// (secagg.OuterMask.Apply).
func FetchOuterKeys(ctx context.Context, hc *http.Client, base, parentRound string) (*secagg.OuterKeys, error) {
	if hc == nil {
		return nil, errors.New("wire: FetchOuterKeys needs an *http.Client with mutual TLS")
	}
	b, err := parentSession(hc, base, parentRound).Fetch(ctx, "outer keys", "outer", int64(secagg.MaxSitesPlus)*maxOuterKey)
	if err != nil {
		return nil, err
	}
	return secagg.ParseOuterKeys(b)
}
