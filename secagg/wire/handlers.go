package wire

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
)

// Prefix is the path the aggregator mounts a Host at.
const Prefix = "/secagg/"

// The endpoints, under Prefix. {round} is the round ID in unpadded
// base64url (RFC 4648 §5), so any round ID is one path segment.
//
//	POST v1/rounds/{round}/advert             secagg.Advert         → 204
//	GET  v1/rounds/{round}/keyset             → secagg.KeySet       (long poll until advertising ends)
//	POST v1/rounds/{round}/shares             secagg.Shares         → 204
//	GET  v1/rounds/{round}/deliveries/{site}  → secagg.ShareDelivery (the caller's own only)
//	POST v1/rounds/{round}/masked             secagg.MaskedInput    → 204
//	GET  v1/rounds/{round}/survivors          → secagg.UnmaskRequest, unsigned (survivors only)
//	POST v1/rounds/{round}/signature          secagg.SurvivorSig    → 204
//	GET  v1/rounds/{round}/unmask             → secagg.UnmaskRequest with signatures (signers only)
//	POST v1/rounds/{round}/unmasking          secagg.Unmasking      → 204
//	GET  v1/rounds/{round}/result             → the sum             (members and aggregators)
//
// Bodies are the messages' canonical CBOR (application/cbor); the result
// is CBOR too, or JSON when the request accepts application/json. A GET
// whose phase has not come yet waits up to HostOptions.LongPoll and then
// answers 204 No Content: poll again. Refusals are JSON diagnostics
// ({"diagnostics": [...]}) with 400 (malformed or refused by the protocol),
// 401/403 (not this site), 404 (round not open here: SC6102), 409 (phase
// over: SC6109, or the round failed: its diagnostic), 410 (round over:
// SC6103), 413/415 (SC6105), 429 (the caller already holds maxPolls
// GETs on the round: SC6110) or 503 (host closed: SC6107).
const (
	pathRounds   = Prefix + "v1/rounds/"
	contentCBOR  = "application/cbor"
	contentJSON  = "application/json"
	maxOverUnmsk = 64 << 10 // body bound for an unmasking retried after its round is over
)

func (h *Host) routes() *http.ServeMux {
	mux := http.NewServeMux()
	r := pathRounds + "{round}/"
	mux.HandleFunc("POST "+r+"advert", h.post(stageAdvert))
	mux.HandleFunc("POST "+r+"shares", h.post(stageShares))
	mux.HandleFunc("POST "+r+"masked", h.post(stageMasked))
	mux.HandleFunc("POST "+r+"signature", h.post(stageSignature))
	mux.HandleFunc("POST "+r+"unmasking", h.post(stageUnmasking))
	mux.HandleFunc("GET "+r+"keyset", h.get(false, h.keySet))
	mux.HandleFunc("GET "+r+"deliveries/{site}", h.get(false, h.delivery))
	mux.HandleFunc("GET "+r+"survivors", h.get(false, h.survivorSet))
	mux.HandleFunc("GET "+r+"unmask", h.get(false, h.unmaskRequest))
	mux.HandleFunc("GET "+r+"result", h.get(true, h.result))
	mux.HandleFunc("POST "+pathParents+"{round}/partial", h.postPartial)
	mux.HandleFunc("POST "+pathParents+"{round}/outer", h.postOuter)
	mux.HandleFunc("GET "+pathParents+"{round}/outer", h.getOuter)
	mux.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) {
		refuse(w, http.StatusNotFound, diag.New(diag.SecAggWireBadRequest, r.Method+" "+r.URL.Path, "no such secure aggregation endpoint").
			WithHelp("see docs/secagg.md, \"Over the network\""))
	})
	return mux
}

// call is an authenticated request for one round.
type call struct {
	peer  identity.Member
	round string
	rd    *hostRound // nil when the round is over
	ts    *tombstone // set when the round is over
	site  string     // the caller's site in the round; "" if it is not a member
}

// begin authenticates the caller and finds the round. It writes the
// refusal and returns false when the request cannot go on; a round that is
// over comes back with rd nil and ts set, for the handler to refuse.
func (h *Host) begin(w http.ResponseWriter, r *http.Request) (*call, bool) {
	peer, ok := h.fed.PeerFromRequest(r)
	if !ok {
		refuse(w, http.StatusUnauthorized, diag.New(diag.SecAggWireForbidden, "secure aggregation", "the caller is not a federation member over mutual TLS").
			WithHelp("serve the host with identity.ServerTLSConfig and connect with the site's identity key"))
		return nil, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(r.PathValue("round"))
	if err != nil || len(raw) == 0 {
		refuse(w, http.StatusBadRequest, diag.New(diag.SecAggWireBadRequest, "secure aggregation", "the round in the path is not unpadded base64url").
			WithHelp("encode the round ID with base64.RawURLEncoding"))
		return nil, false
	}
	c := &call{peer: peer, round: string(raw)}
	rd, ts, closed := h.lookup(c.round)
	switch {
	case closed:
		refuse(w, http.StatusServiceUnavailable, diag.New(diag.SecAggWireUnavailable, fmt.Sprintf("secure aggregation round %q", c.round), "the aggregator's secure aggregation host is closed").
			WithHelp("the aggregator is shutting down; the round must run again under a new round ID"))
		return nil, false
	case rd == nil && ts == nil:
		refuse(w, http.StatusNotFound, diag.New(diag.SecAggWireNoRound, fmt.Sprintf("secure aggregation round %q", c.round), "the round is not open on this host").
			WithHelp("sites retry until the reducer peer opens the round; if it never opens, check the round ID and the aggregator's address"))
		return nil, false
	}
	c.rd, c.ts = rd, ts
	if rd != nil {
		if k, ok := rd.keys[peer.Name]; ok && peer.PublicKey.Equal(identity.PublicKey(k)) {
			c.site = peer.Name
		}
	} else {
		c.site = peer.Name // a tombstone keeps no member list; names are bound to keys by the federation
	}
	return c, true
}

func (c *call) subject() string { return fmt.Sprintf("secure aggregation round %q", c.round) }

// gone refuses a request for a round that is over, with its outcome.
func (c *call) gone(w http.ResponseWriter) {
	d := diag.New(diag.SecAggWireRoundOver, c.subject(), "the round is over: it produced its sum").
		WithHelp("a round ID runs once; a site that was not done has dropped out")
	l := diag.List{d}
	if c.ts.err != nil {
		d.Message = "the round is over: it failed"
		if inner, ok := diag.As(c.ts.err); ok {
			l = append(l, inner...)
		}
	}
	refuse(w, http.StatusGone, l)
}

func (c *call) forbidden(w http.ResponseWriter, format string, args ...any) {
	refuse(w, http.StatusForbidden, diag.New(diag.SecAggWireForbidden, c.subject(), "%q: %s", c.peer.Name, fmt.Sprintf(format, args...)).
		WithHelp("a site posts only its own messages and fetches only its own delivery, over TLS with its own identity key"))
}

// post accepts one site's message of stage s.
func (h *Host) post(s stage) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, ok := h.begin(w, r)
		if !ok {
			return
		}
		if c.rd != nil && c.site == "" {
			c.forbidden(w, "not a site of this round")
			return
		}
		if c.rd == nil && s != stageUnmasking {
			c.gone(w)
			return
		}
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != contentCBOR {
			refuse(w, http.StatusUnsupportedMediaType, diag.New(diag.SecAggWireBadRequest, c.subject(), "%s sent as %q", s, r.Header.Get("Content-Type")).
				WithHelp("send the message's canonical CBOR as %s", contentCBOR))
			return
		}
		limit := int64(maxOverUnmsk)
		if c.rd != nil {
			limit = c.rd.limit(s)
		}
		if s == stageMasked {
			// Bound the masked vectors held in memory at once.
			select {
			case h.inputs <- struct{}{}:
				defer func() { <-h.inputs }()
			case <-r.Context().Done():
				return
			case <-h.quit:
				refuse(w, http.StatusServiceUnavailable, diag.New(diag.SecAggWireUnavailable, c.subject(), "the aggregator's secure aggregation host is closed"))
				return
			}
		}
		body, err := readBody(w, r, limit)
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				refuse(w, http.StatusRequestEntityTooLarge, diag.New(diag.SecAggWireBadRequest, c.subject(), "%s of more than %d bytes", s, limit).
					WithHelp("the sender uses other round parameters (dimension, sites) than the aggregator"))
			}
			return // the connection broke; nobody is listening
		}
		sender, add, err := parseStage(s, body)
		if err != nil {
			refuse(w, http.StatusBadRequest, err)
			return
		}
		if sender != c.site {
			c.forbidden(w, "posts a %s as %q", s, sender)
			return
		}
		sum := sha256.Sum256(body)
		if c.rd == nil {
			if prev, ok := c.ts.unmasked[sender]; ok && prev == sum {
				w.WriteHeader(http.StatusNoContent) // a retry of an unmasking that arrived
				return
			}
			c.gone(w)
			return
		}
		rd := c.rd
		key := acceptKey{sender, s}
		rd.mu.Lock()
		if prev, ok := rd.accepted[key]; ok && prev == sum {
			rd.mu.Unlock()
			w.WriteHeader(http.StatusNoContent) // a retry of a message that arrived
			return
		}
		if rd.err != nil {
			err := rd.err
			rd.mu.Unlock()
			refuse(w, http.StatusConflict, err)
			return
		}
		err = add(rd.srv)
		if err == nil {
			rd.accepted[key] = sum
		}
		rd.mu.Unlock()
		if err == nil {
			rd.poke()
			w.WriteHeader(http.StatusNoContent)
			return
		}
		ph := rd.srv.Phase()
		code := codeOf(err)
		switch {
		case ph == secagg.PhaseFailed:
			refuse(w, http.StatusConflict, err)
		case ph > s.phase(), code == diag.SecAggUnknownSite:
			refuse(w, http.StatusConflict, tooLate(c, "its %s arrived after the %s phase ended, or it dropped out of an earlier phase", s, s.phase()))
		case code == diag.SecAggOutOfOrder:
			refuse(w, http.StatusConflict, err)
		default:
			refuse(w, http.StatusBadRequest, err)
		}
	}
}

// readBody reads a request body of at most limit bytes, in one
// allocation when the length is announced.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	if r.ContentLength > 0 {
		b := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(body, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return io.ReadAll(body)
}

// parseStage parses a message of stage s and returns its sender and the
// call that adds it to the server.
func parseStage(s stage, b []byte) (string, func(*secagg.Server) error, error) {
	switch s {
	case stageAdvert:
		m, err := secagg.ParseAdvert(b)
		if err != nil {
			return "", nil, err
		}
		return m.Client, func(srv *secagg.Server) error { return srv.AddAdvert(m) }, nil
	case stageShares:
		m, err := secagg.ParseShares(b)
		if err != nil {
			return "", nil, err
		}
		return m.From, func(srv *secagg.Server) error { return srv.AddShares(m) }, nil
	case stageMasked:
		m, err := secagg.ParseMaskedInput(b)
		if err != nil {
			return "", nil, err
		}
		return m.From, func(srv *secagg.Server) error { return srv.AddMaskedInput(m) }, nil
	case stageSignature:
		m, err := secagg.ParseSurvivorSig(b)
		if err != nil {
			return "", nil, err
		}
		return m.From, func(srv *secagg.Server) error { return srv.AddSignature(m) }, nil
	default:
		m, err := secagg.ParseUnmasking(b)
		if err != nil {
			return "", nil, err
		}
		return m.From, func(srv *secagg.Server) error { return srv.AddUnmasking(m) }, nil
	}
}

func tooLate(c *call, format string, args ...any) *diag.Diagnostic {
	return diag.New(diag.SecAggWireTooLate, c.subject(), "site %q: %s", c.site, fmt.Sprintf(format, args...)).
		WithHelp("the aggregator counts the site as dropped out and the round goes on without it; raise the phase deadline if sites are regularly late")
}

// reply is what a GET answers once its phase has come.
type reply struct {
	status int // 0: not yet
	body   []byte
	res    *secagg.Result // the result, for a JSON rendering
	err    error
}

// get serves a long poll: ready is called under the round's lock until it
// has an answer, the long poll times out, or the caller goes away. Only
// the round's sites may ask, and aggregators too when aggregators is set.
func (h *Host) get(aggregators bool, ready func(*call, *http.Request) reply) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, ok := h.begin(w, r)
		if !ok {
			return
		}
		if c.rd == nil {
			c.gone(w)
			return
		}
		if c.site == "" && !(aggregators && c.peer.Role == identity.Aggregator) {
			c.forbidden(w, "not a site of this round")
			return
		}
		rd := c.rd
		holder := c.site
		if holder == "" {
			holder = "aggregator " + c.peer.Name
		}
		if !rd.enterPoll(holder) {
			refuse(w, http.StatusTooManyRequests, diag.New(diag.SecAggWireBusy, c.subject(), "%s already holds %d requests on the round", holder, maxPolls).
				WithHelp("a site long-polls one phase at a time; close the stale connections"))
			return
		}
		defer rd.leavePoll(holder)
		timer := time.NewTimer(h.opt.LongPoll)
		defer timer.Stop()
		for {
			rd.mu.Lock()
			rp := ready(c, r)
			ch := rd.changed
			rd.mu.Unlock()
			if rp.status != 0 {
				writeReply(w, r, rp)
				return
			}
			select {
			case <-ch:
			case <-timer.C:
				w.WriteHeader(http.StatusNoContent)
				return
			case <-r.Context().Done():
				return
			case <-h.quit:
				refuse(w, http.StatusServiceUnavailable, diag.New(diag.SecAggWireUnavailable, c.subject(), "the aggregator's secure aggregation host is closed"))
				return
			}
		}
	}
}

// maxPolls bounds the GETs one caller holds open on a round, so a member
// cannot pin the host's memory and goroutines with held polls: Participate
// holds one; a few more cover connections the site gave up on that the
// host has not seen close yet.
const maxPolls = 4

func (rd *hostRound) enterPoll(holder string) bool {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if rd.polls[holder] >= maxPolls {
		return false
	}
	rd.polls[holder]++
	return true
}

func (rd *hostRound) leavePoll(holder string) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if rd.polls[holder]--; rd.polls[holder] <= 0 {
		delete(rd.polls, holder)
	}
}

func writeReply(w http.ResponseWriter, r *http.Request, rp reply) {
	if rp.err != nil {
		refuse(w, rp.status, rp.err)
		return
	}
	if rp.res != nil && acceptsJSON(r) {
		b, err := json.Marshal(resultJSONOf(rp.res))
		if err != nil {
			refuse(w, http.StatusInternalServerError, err)
			return
		}
		w.Header().Set("Content-Type", contentJSON)
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
		return
	}
	w.Header().Set("Content-Type", contentCBOR)
	w.Header().Set("Content-Length", strconv.Itoa(len(rp.body)))
	w.Write(rp.body)
}

func acceptsJSON(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		if mt, _, _ := mime.ParseMediaType(strings.TrimSpace(part)); mt == contentJSON {
			return true
		}
	}
	return false
}

func (h *Host) keySet(c *call, _ *http.Request) reply {
	rd := c.rd
	switch {
	case rd.err != nil:
		return reply{status: http.StatusConflict, err: rd.err}
	case rd.phase == secagg.PhaseAdvertise:
		return reply{}
	case rd.keyset != nil:
		return reply{status: http.StatusOK, body: rd.keyset}
	}
	return reply{status: http.StatusConflict, err: tooLate(c, "the key set is no longer served: key sharing has ended")}
}

func (h *Host) delivery(c *call, r *http.Request) reply {
	rd := c.rd
	if r.PathValue("site") != c.site {
		return reply{status: http.StatusForbidden, err: diag.New(diag.SecAggWireForbidden, c.subject(), "%q asks for the share delivery of %q", c.site, r.PathValue("site")).
			WithHelp("a site fetches only its own delivery")}
	}
	switch {
	case rd.err != nil:
		return reply{status: http.StatusConflict, err: rd.err}
	case rd.phase < secagg.PhaseMask:
		return reply{}
	case rd.deliveries != nil:
		if b, ok := rd.deliveries[c.site]; ok {
			return reply{status: http.StatusOK, body: b}
		}
		return reply{status: http.StatusConflict, err: tooLate(c, "its shares did not arrive before key sharing ended")}
	}
	return reply{status: http.StatusConflict, err: tooLate(c, "input collection has ended")}
}

func (h *Host) survivorSet(c *call, _ *http.Request) reply {
	rd := c.rd
	switch {
	case rd.err != nil:
		return reply{status: http.StatusConflict, err: rd.err}
	case rd.phase < secagg.PhaseConsistency:
		return reply{}
	case rd.survivorSet != nil:
		if rd.survivors[c.site] {
			return reply{status: http.StatusOK, body: rd.survivorSet}
		}
		return reply{status: http.StatusConflict, err: tooLate(c, "its masked input did not arrive before input collection ended")}
	}
	return reply{status: http.StatusConflict, err: tooLate(c, "the consistency round has ended")}
}

func (h *Host) unmaskRequest(c *call, _ *http.Request) reply {
	rd := c.rd
	switch {
	case rd.err != nil:
		return reply{status: http.StatusConflict, err: rd.err}
	case rd.phase < secagg.PhaseUnmask:
		return reply{}
	case rd.unmask != nil:
		if rd.signers[c.site] {
			return reply{status: http.StatusOK, body: rd.unmask}
		}
		return reply{status: http.StatusConflict, err: tooLate(c, "its survivor signature did not arrive before the consistency round ended")}
	}
	return reply{status: http.StatusConflict, err: tooLate(c, "unmasking has ended")}
}

func (h *Host) result(c *call, _ *http.Request) reply {
	rd := c.rd
	switch {
	case rd.err != nil:
		return reply{status: http.StatusConflict, err: rd.err}
	case rd.resultCBOR != nil:
		return reply{status: http.StatusOK, body: rd.resultCBOR, res: rd.result}
	case rd.isTaken:
		return reply{status: http.StatusGone, err: diag.New(diag.SecAggWireRoundOver, c.subject(), "the round is over and its sum was handed to the reducer").
			WithHelp("fetch the next model from the reducer peer")}
	}
	return reply{}
}

func codeOf(err error) diag.Code {
	if l, ok := diag.As(err); ok {
		return l[0].Code
	}
	return ""
}

// refuse writes err as JSON diagnostics with status.
func refuse(w http.ResponseWriter, status int, errs ...error) {
	var l diag.List
	for _, err := range errs {
		if ds, ok := diag.As(err); ok {
			l = append(l, ds...)
		} else if err != nil {
			l = append(l, diag.New(diag.SecAggWireBadRequest, "secure aggregation", "%v", err))
		}
	}
	w.Header().Set("Content-Type", contentJSON)
	w.WriteHeader(status)
	diag.RenderJSON(w, l)
}
