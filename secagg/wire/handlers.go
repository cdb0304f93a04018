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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// The endpoints of a scheme's rounds are under its prefix (Prefix,
// HEPrefix), at v1/rounds/{round}/, where {round} is the round ID in
// unpadded base64url (RFC 4648 §5), so any round ID is one path segment:
// a POST per stage (a site's message → 204) and a GET per get (a long poll
// for what a phase published). masking.go and thresholdhe.go list them.
//
// Bodies are the messages' canonical CBOR (application/cbor); a masking
// round's result is CBOR too, or JSON when the request accepts
// application/json. A GET whose phase has not come yet waits up to
// HostOptions.LongPoll and then answers 204 No Content: poll again.
// Refusals are JSON diagnostics ({"diagnostics": [...]}) with 400
// (malformed or refused by the protocol), 401/403 (not this site), 404
// (round not open here: SC6102), 409 (phase over: SC6109, the round
// failed: its diagnostic, or a message that conflicts with the round's),
// 410 (round over: SC6103), 413/415 (SC6105), 429 (the caller already
// holds maxPolls GETs on the round: SC6110) or 503 (host closed: SC6107).
const (
	contentCBOR  = "application/cbor"
	contentJSON  = "application/json"
	maxOverUnmsk = 64 << 10 // body bound for a last word retried after its round is over
)

// schemes are the schemes a Host serves.
var schemes = []*scheme{&masking, &thresholdHE}

func (h *Host) routes() *http.ServeMux {
	mux := http.NewServeMux()
	for _, sch := range schemes {
		r := sch.prefix + "v1/rounds/{round}/"
		for i := range sch.stages {
			mux.HandleFunc("POST "+r+sch.stages[i].path, h.post(sch, &sch.stages[i]))
		}
		for i := range sch.gets {
			mux.HandleFunc("GET "+r+sch.gets[i].pattern, h.get(sch, &sch.gets[i]))
		}
		mux.HandleFunc(sch.prefix, func(w http.ResponseWriter, r *http.Request) {
			refuse(w, http.StatusNotFound, diag.New(diag.SecAggWireBadRequest, r.Method+" "+r.URL.Path, "no such %s endpoint", sch.name).
				WithHelp("see docs/secagg.md, \"Over the network\""))
		})
	}
	mux.HandleFunc("POST "+pathParents+"{round}/partial", h.postPartial)
	mux.HandleFunc("POST "+pathParents+"{round}/outer", h.postOuter)
	mux.HandleFunc("GET "+pathParents+"{round}/outer", h.getOuter)
	return mux
}

// call is an authenticated request for one round.
type call struct {
	sch   *scheme
	peer  identity.Member
	round string
	rd    *hostRound // nil when the round is over
	ts    *tombstone // set when the round is over
	site  string     // the caller's site in the round; "" if it is not a member
}

// begin authenticates the caller and finds the round, of scheme sch. It
// writes the refusal and returns false when the request cannot go on; a
// round that is over comes back with rd nil and ts set, for the handler to
// refuse.
func (h *Host) begin(w http.ResponseWriter, r *http.Request, sch *scheme) (*call, bool) {
	peer, ok := h.fed.PeerFromRequest(r)
	if !ok {
		refuse(w, http.StatusUnauthorized, diag.New(diag.SecAggWireForbidden, sch.name, "the caller is not a federation member over mutual TLS").
			WithHelp("serve the host with identity.ServerTLSConfig and connect with the site's identity key"))
		return nil, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(r.PathValue("round"))
	if err != nil || len(raw) == 0 {
		refuse(w, http.StatusBadRequest, diag.New(diag.SecAggWireBadRequest, sch.name, "the round in the path is not unpadded base64url").
			WithHelp("encode the round ID with base64.RawURLEncoding"))
		return nil, false
	}
	c := &call{sch: sch, peer: peer, round: string(raw)}
	rd, ts, closed := h.lookup(c.round, sch)
	switch {
	case closed:
		refuse(w, http.StatusServiceUnavailable, diag.New(diag.SecAggWireUnavailable, c.subject(), "the aggregator's secure aggregation host is closed").
			WithHelp("the aggregator is shutting down; the round must run again under a new round ID"))
		return nil, false
	case rd == nil && ts == nil:
		refuse(w, http.StatusNotFound, diag.New(diag.SecAggWireNoRound, c.subject(), "the round is not open on this host").
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

func (c *call) subject() string { return fmt.Sprintf("%s round %q", c.sch.name, c.round) }

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

// post accepts one site's message of stage st.
func (h *Host) post(sch *scheme, st *stage) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, ok := h.begin(w, r, sch)
		if !ok {
			return
		}
		if c.rd != nil && c.site == "" {
			c.forbidden(w, "not a site of this round")
			return
		}
		if c.rd == nil && !st.lastWord {
			c.gone(w)
			return
		}
		body, ok := h.readStage(w, r, c, st)
		if !ok {
			return
		}
		var state roundState
		if c.rd != nil {
			state = c.rd.state
		}
		sender, add, err := st.parse(state, body)
		if err != nil {
			refuse(w, http.StatusBadRequest, err)
			return
		}
		if sender != c.site {
			c.forbidden(w, "posts a %s as %q", st.what, sender)
			return
		}
		sum := sha256.Sum256(body)
		if c.rd == nil {
			if prev, ok := c.ts.lastWords[acceptKey{sender, st.path}]; ok && prev == sum {
				w.WriteHeader(http.StatusNoContent) // a retry of a last word that arrived
				return
			}
			c.gone(w)
			return
		}
		h.accept(w, c, st, body, sum, add)
	}
}

// readStage reads the body of a message of stage st, holding one of the
// host's tokens while a vector's body is in memory.
func (h *Host) readStage(w http.ResponseWriter, r *http.Request, c *call, st *stage) ([]byte, bool) {
	if !isCBOR(w, r, c.subject(), st.what) {
		return nil, false
	}
	limit := int64(maxOverUnmsk)
	if c.rd != nil {
		limit = st.limit(c.rd.state.size())
	}
	if st.big {
		// Bound the vectors held in memory at once, by their announced
		// length (else the stage's bound).
		size := limit
		if r.ContentLength > 0 {
			size = min(r.ContentLength, limit)
		}
		release, ok := h.inputs.take(r.Context(), h.quit, size)
		if !ok {
			if r.Context().Err() == nil {
				refuse(w, http.StatusServiceUnavailable, diag.New(diag.SecAggWireUnavailable, c.subject(), "the aggregator's secure aggregation host is closed"))
			}
			return nil, false
		}
		defer release()
	}
	return readLimited(w, r, c.subject(), st.what, limit)
}

// isCBOR refuses (415) a message of kind what not sent as CBOR.
func isCBOR(w http.ResponseWriter, r *http.Request, subject, what string) bool {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != contentCBOR {
		refuse(w, http.StatusUnsupportedMediaType, diag.New(diag.SecAggWireBadRequest, subject, "%s sent as %q", what, r.Header.Get("Content-Type")).
			WithHelp("send the %s's canonical CBOR as %s", what, contentCBOR))
		return false
	}
	return true
}

// readLimited reads a message of kind what, refusing it (413) beyond limit
// bytes.
func readLimited(w http.ResponseWriter, r *http.Request, subject, what string, limit int64) ([]byte, bool) {
	body, err := readBody(w, r, limit)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			refuse(w, http.StatusRequestEntityTooLarge, diag.New(diag.SecAggWireBadRequest, subject, "%s of more than %d bytes", what, limit).
				WithHelp("the sender uses other round parameters (dimension, sites) than this host"))
		}
		return nil, false // else the connection broke; nobody is listening
	}
	return body, true
}

// accept adds a site's message to the round's state machine, unless it is
// a resend of one accepted (then 204 again). One post of a site's stage is
// added at a time, so a resend that arrives while the first copy is being
// added waits for it.
func (h *Host) accept(w http.ResponseWriter, c *call, st *stage, body []byte, sum [32]byte, add func() error) {
	rd, key := c.rd, acceptKey{c.site, st.path}
	kl := rd.postLock(key)
	kl.Lock()
	defer kl.Unlock()
	rd.mu.Lock()
	prev, seen := rd.accepted[key]
	failed := rd.err
	rd.mu.Unlock()
	switch {
	case seen && prev == sum:
		w.WriteHeader(http.StatusNoContent) // a retry of a message that arrived
		return
	case failed != nil:
		refuse(w, http.StatusConflict, failed)
		return
	}
	undo, done := func() {}, func() {}
	if m, ok := rd.state.(*maskRound); ok && m.rec != nil {
		undo, done = m.rec.record(st.path, c.site, body)
	}
	if err := add(); err != nil {
		undo()
		status, err := refusal(c, st, err)
		refuse(w, status, err)
		return
	}
	done()
	rd.mu.Lock()
	if rd.accepted != nil {
		rd.accepted[key] = sum
	}
	rd.mu.Unlock()
	rd.poke()
	w.WriteHeader(http.StatusNoContent)
}

// refusal is the answer to a message the state machine refused with err:
// 409 once the round failed, for a conflict with what the round holds, or
// too late (SC6109); else 400.
func refusal(c *call, st *stage, err error) (int, error) {
	ph, failed := c.rd.state.phase()
	code := codeOf(err)
	switch {
	case failed, slices.Contains(c.sch.conflicts, code):
		return http.StatusConflict, err
	case ph > st.phase.ord || slices.Contains(c.sch.late, code):
		return http.StatusConflict, tooLate(c, "its %s arrived after the %s phase ended, or it dropped out of an earlier phase", st.what, st.phase.name)
	case code == diag.SecAggOutOfOrder:
		return http.StatusConflict, err // before its phase
	}
	return http.StatusBadRequest, err
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

func tooLate(c *call, format string, args ...any) *diag.Diagnostic {
	return diag.New(diag.SecAggWireTooLate, c.subject(), "site %q: %s", c.site, fmt.Sprintf(format, args...)).
		WithHelp("the aggregator counts the site as dropped out and the round goes on without it; raise the phase deadline if sites are regularly late")
}

// reply is what a GET answers once its phase has come.
type reply struct {
	status int // 0: not yet
	body   []byte
	asJSON any // what to render for a request that accepts JSON (nil: CBOR only)
	err    error
}

// get serves a long poll of g: its answer is sought under the round's lock
// until it has one, the long poll times out, or the caller goes away. Only
// the round's sites may ask, and aggregators too when g says so.
func (h *Host) get(sch *scheme, g *get) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, ok := h.begin(w, r, sch)
		if !ok {
			return
		}
		if c.rd == nil {
			c.gone(w)
			return
		}
		if c.site == "" && !(g.aggregators && c.peer.Role == identity.Aggregator) {
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
		h.poll(w, r, c, g)
	}
}

// poll answers a GET once its phase has come, or 204 after the long poll.
func (h *Host) poll(w http.ResponseWriter, r *http.Request, c *call, g *get) {
	timer := time.NewTimer(h.opt.LongPoll)
	defer timer.Stop()
	for {
		c.rd.mu.Lock()
		rp := ready(c, r, g)
		ch := c.rd.changed
		c.rd.mu.Unlock()
		if rp.status != 0 {
			writeReply(w, r, rp)
			return
		}
		if !h.held(w, r, timer, c.subject(), ch, nil) {
			return
		}
	}
}

// held waits, in a long poll, for a or b (nil: never): true once either
// fired; false when the poll answered instead — 204 when it timed out,
// 503 when the host closed — or its caller went away.
func (h *Host) held(w http.ResponseWriter, r *http.Request, timer *time.Timer, subject string, a, b <-chan struct{}) bool {
	select {
	case <-a:
	case <-b:
	case <-timer.C:
		w.WriteHeader(http.StatusNoContent)
		return false
	case <-r.Context().Done():
		return false
	case <-h.quit:
		refuse(w, http.StatusServiceUnavailable, diag.New(diag.SecAggWireUnavailable, subject, "the aggregator's secure aggregation host is closed"))
		return false
	}
	return true
}

// ready is g's answer now (under the round's lock): a site fetches only
// its own {site}.
func ready(c *call, r *http.Request, g *get) reply {
	if strings.Contains(g.pattern, "{site}") && r.PathValue("site") != c.site {
		return reply{status: http.StatusForbidden, err: diag.New(diag.SecAggWireForbidden, c.subject(), "%q asks for the %s of %q", c.site, g.what, r.PathValue("site")).
			WithHelp("a site fetches only its own delivery")}
	}
	if g.ready != nil {
		return g.ready(c, r)
	}
	return c.rd.serveDoc(c, g.pattern)
}

func writeReply(w http.ResponseWriter, r *http.Request, rp reply) {
	if rp.err != nil {
		refuse(w, rp.status, rp.err)
		return
	}
	if rp.asJSON != nil && acceptsJSON(r) {
		b, err := json.Marshal(rp.asJSON)
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

func codeOf(err error) diag.Code {
	if l, ok := diag.As(err); ok && len(l) > 0 {
		return l[0].Code
	}
	return ""
}

// refuse writes errs as JSON diagnostics with status.
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
