package hewire

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg/he"
)

// The endpoints under Prefix; {round} is the round ID in unpadded base64url.
//
//	POST v1/rounds/{round}/advert       he.Advert        → 204
//	GET  v1/rounds/{round}/keyset       → he.KeySet      (long poll)
//	POST v1/rounds/{round}/shares       he.Shares        → 204
//	GET  v1/rounds/{round}/delivery     → he.Delivery    (the caller's own)
//	POST v1/rounds/{round}/ciphertext   he.Ciphertext    → 204
//	GET  v1/rounds/{round}/decrypt?from=N → he.DecryptRequest of attempt ≥ N;
//	                                      410 SC6103 once the sum is open
//	POST v1/rounds/{round}/decshare     he.DecryptShare  → 204
//
// Bodies are canonical CBOR; refusals are JSON diagnostics as in
// secagg/wire (401/403 SC6101, 404 SC6102, 409 phase over, round failed or
// a second, different message (SC6006), 410 SC6103, 413/415 SC6105, 429
// SC6110 for a site holding more than maxPolls GETs, 503 SC6107).
const (
	pathRounds  = Prefix + "v1/rounds/"
	contentCBOR = "application/cbor"
)

func (h *Host) routes() *http.ServeMux {
	mux := http.NewServeMux()
	r := pathRounds + "{round}/"
	for _, s := range stages {
		mux.HandleFunc("POST "+r+s.path, h.post(s))
	}
	mux.HandleFunc("GET "+r+"keyset", h.get(func(c *call, _ *http.Request) reply {
		return c.rd.serve(he.PhaseShare, c.rd.keyset, "key sharing has ended")
	}))
	mux.HandleFunc("GET "+r+"delivery", h.get(func(c *call, _ *http.Request) reply {
		rd := c.rd
		if rd.phase == he.PhaseEncrypt && rd.deliveries != nil && rd.deliveries[c.site] == nil {
			return reply{status: http.StatusConflict, err: tooLate(c, "its shares did not arrive before key sharing ended")}
		}
		return rd.serve(he.PhaseEncrypt, rd.deliveries[c.site], "input collection has ended")
	}))
	mux.HandleFunc("GET "+r+"decrypt", h.get(func(c *call, r *http.Request) reply {
		rd := c.rd
		from, _ := strconv.Atoi(r.URL.Query().Get("from"))
		switch {
		case rd.err != nil:
			return reply{status: http.StatusConflict, err: rd.err}
		case rd.phase == he.PhaseDone:
			return reply{status: http.StatusGone, err: diag.New(diag.SecAggWireRoundOver, c.subject(), "the round is over: it produced its sum").
				WithHelp("nothing more to do for this round")}
		case rd.phase == he.PhaseDecrypt && rd.reqAttempt >= from:
			return reply{status: http.StatusOK, body: rd.req}
		}
		return reply{}
	}))
	mux.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) {
		refuse(w, http.StatusNotFound, diag.New(diag.SecAggWireBadRequest, r.Method+" "+r.URL.Path, "no such threshold-he endpoint"))
	})
	return mux
}

// stage is one kind of message a site posts.
type stage struct {
	path  string
	phase he.Phase
	limit func(p he.Params) int64
	add   func(rd *hround, b []byte) (sender string, add func() error, err error)
}

var stages = []stage{
	{"advert", he.PhaseAdvertise, func(he.Params) int64 { return 2 << 10 }, func(rd *hround, b []byte) (string, func() error, error) {
		m, err := he.ParseAdvert(b)
		if err != nil {
			return "", nil, err
		}
		return m.Site, func() error { return rd.agg.AddAdvert(m) }, nil
	}},
	{"shares", he.PhaseShare, func(p he.Params) int64 { return 4<<10 + int64(len(p.Members)+1)*int64(he.PolyBytes()+1024) }, func(rd *hround, b []byte) (string, func() error, error) {
		m, err := he.ParseShares(b)
		if err != nil {
			return "", nil, err
		}
		return m.From, func() error { return rd.agg.AddShares(m) }, nil
	}},
	{"ciphertext", he.PhaseEncrypt, func(p he.Params) int64 { return 1<<10 + int64(p.Ciphertexts())*int64(2*he.PolyBytes()+64) }, func(rd *hround, b []byte) (string, func() error, error) {
		m, err := he.ParseCiphertext(b)
		if err != nil {
			return "", nil, err
		}
		return m.From, func() error { return rd.agg.AddCiphertext(m) }, nil
	}},
	{"decshare", he.PhaseDecrypt, func(p he.Params) int64 { return 1<<10 + int64(p.Ciphertexts())*int64(he.PolyBytes()+32) }, func(rd *hround, b []byte) (string, func() error, error) {
		m, err := he.ParseDecryptShare(b)
		if err != nil {
			return "", nil, err
		}
		return m.From, func() error { return rd.agg.AddDecryptShare(m) }, nil
	}},
}

type call struct {
	round string
	rd    *hround
	site  string
	name  string
}

func (c *call) subject() string { return fmt.Sprintf("threshold-he round %q", c.round) }

// begin authenticates the caller as a site of an open round.
func (h *Host) begin(w http.ResponseWriter, r *http.Request) (*call, bool) {
	peer, ok := h.fed.PeerFromRequest(r)
	if !ok {
		refuse(w, http.StatusUnauthorized, diag.New(diag.SecAggWireForbidden, "threshold-he", "the caller is not a federation member over mutual TLS"))
		return nil, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(r.PathValue("round"))
	if err != nil || len(raw) == 0 {
		refuse(w, http.StatusBadRequest, diag.New(diag.SecAggWireBadRequest, "threshold-he", "the round in the path is not unpadded base64url"))
		return nil, false
	}
	c := &call{round: string(raw), name: peer.Name}
	h.mu.Lock()
	rd, closed := h.rounds[c.round], h.closed
	_, over := h.over[c.round]
	h.mu.Unlock()
	switch {
	case closed:
		refuse(w, http.StatusServiceUnavailable, diag.New(diag.SecAggWireUnavailable, c.subject(), "the aggregator's threshold-he host is closed"))
		return nil, false
	case over:
		refuse(w, http.StatusGone, diag.New(diag.SecAggWireRoundOver, c.subject(), "the round is over"))
		return nil, false
	case rd == nil:
		refuse(w, http.StatusNotFound, diag.New(diag.SecAggWireNoRound, c.subject(), "the round is not open on this host").
			WithHelp("sites retry until the reducer peer opens the round"))
		return nil, false
	}
	if k, ok := rd.keys[peer.Name]; !ok || !peer.PublicKey.Equal([32]byte(k)) {
		refuse(w, http.StatusForbidden, diag.New(diag.SecAggWireForbidden, c.subject(), "%q is not a site of this round", peer.Name))
		return nil, false
	}
	c.rd, c.site = rd, peer.Name
	return c, true
}

func (h *Host) post(s stage) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, ok := h.begin(w, r)
		if !ok {
			return
		}
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != contentCBOR {
			refuse(w, http.StatusUnsupportedMediaType, diag.New(diag.SecAggWireBadRequest, c.subject(), "%s sent as %q", s.path, r.Header.Get("Content-Type")))
			return
		}
		limit := s.limit(c.rd.p)
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				refuse(w, http.StatusRequestEntityTooLarge, diag.New(diag.SecAggWireBadRequest, c.subject(), "%s of more than %d bytes", s.path, limit))
			}
			return
		}
		sender, add, err := s.add(c.rd, body)
		if err != nil {
			refuse(w, http.StatusBadRequest, err)
			return
		}
		if sender != c.site {
			refuse(w, http.StatusForbidden, diag.New(diag.SecAggWireForbidden, c.subject(), "%q posts a %s as %q", c.site, s.path, sender))
			return
		}
		rd, key, sum := c.rd, c.site+"/"+s.path, digestOf(body)
		// One post of a site's stage at a time: a retry that arrives while
		// the first copy is still being added (a ciphertext's decoding
		// takes a while) waits for it, and is then recognised as a retry
		// instead of refused as a second message.
		kl := rd.postLock(key)
		kl.Lock()
		defer kl.Unlock()
		rd.mu.Lock()
		prev, seen := rd.accepted[key]
		rd.mu.Unlock()
		if seen && prev == sum {
			w.WriteHeader(http.StatusNoContent) // a retry of a message that arrived
			return
		}
		if err := add(); err != nil {
			ph, code := rd.agg.Phase(), codeOf(err)
			switch {
			case ph == he.PhaseFailed:
				refuse(w, http.StatusConflict, err)
			case code == diag.SecAggDuplicate:
				refuse(w, http.StatusConflict, err) // another message than the one accepted
			case ph > s.phase:
				refuse(w, http.StatusConflict, tooLate(c, "its %s arrived after the %s phase ended", s.path, s.phase))
			case code == diag.SecAggOutOfOrder:
				refuse(w, http.StatusConflict, err) // before its phase, or for an earlier decryption attempt
			default:
				refuse(w, http.StatusBadRequest, err)
			}
			return
		}
		rd.mu.Lock()
		rd.accepted[key] = sum
		rd.mu.Unlock()
		rd.poke()
		w.WriteHeader(http.StatusNoContent)
	}
}

func tooLate(c *call, format string, args ...any) *diag.Diagnostic {
	return diag.New(diag.SecAggWireTooLate, c.subject(), "site %q: %s", c.site, fmt.Sprintf(format, args...)).
		WithHelp("the aggregator counts the site as dropped out and the round goes on without it")
}

type reply struct {
	status int // 0: not yet
	body   []byte
	err    error
}

// serve answers a GET of what phase want publishes (body): not yet before
// it, the body during it, and too late after it.
func (rd *hround) serve(want he.Phase, body []byte, gone string) reply {
	switch {
	case rd.err != nil:
		return reply{status: http.StatusConflict, err: rd.err}
	case rd.phase < want:
		return reply{}
	case rd.phase == want && body != nil:
		return reply{status: http.StatusOK, body: body}
	}
	return reply{status: http.StatusConflict, err: diag.New(diag.SecAggWireTooLate, rd.subject(), "%s", gone).
		WithHelp("the aggregator counts the site as dropped out and the round goes on without it")}
}

// get serves a long poll for the round's sites.
func (h *Host) get(ready func(*call, *http.Request) reply) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, ok := h.begin(w, r)
		if !ok {
			return
		}
		if !c.rd.enterPoll(c.site) {
			refuse(w, http.StatusTooManyRequests, diag.New(diag.SecAggWireBusy, c.subject(), "site %q already holds %d requests on the round", c.site, maxPolls).
				WithHelp("a site long-polls one phase at a time; close the stale connections"))
			return
		}
		defer c.rd.leavePoll(c.site)
		t := time.NewTimer(h.opt.LongPoll)
		defer t.Stop()
		for {
			c.rd.mu.Lock()
			rp := ready(c, r)
			ch := c.rd.changed
			c.rd.mu.Unlock()
			if rp.status != 0 {
				if rp.err != nil {
					refuse(w, rp.status, rp.err)
					return
				}
				w.Header().Set("Content-Type", contentCBOR)
				w.Header().Set("Content-Length", strconv.Itoa(len(rp.body)))
				w.Write(rp.body)
				return
			}
			select {
			case <-ch:
			case <-t.C:
				w.WriteHeader(http.StatusNoContent)
				return
			case <-r.Context().Done():
				return
			case <-h.quit:
				refuse(w, http.StatusServiceUnavailable, diag.New(diag.SecAggWireUnavailable, c.subject(), "the aggregator's threshold-he host is closed"))
				return
			}
		}
	}
}

// maxPolls bounds the GETs one site holds open on a round: Participate
// holds one; a few more cover connections the site gave up on that the
// host has not seen close yet.
const maxPolls = 4

func (rd *hround) enterPoll(site string) bool {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if rd.polls[site] >= maxPolls {
		return false
	}
	rd.polls[site]++
	return true
}

func (rd *hround) leavePoll(site string) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if rd.polls[site]--; rd.polls[site] <= 0 {
		delete(rd.polls, site)
	}
}

// postLock returns the lock of one site's stage (bounded: sites × stages).
func (rd *hround) postLock(key string) *sync.Mutex {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	m := rd.posting[key]
	if m == nil {
		m = new(sync.Mutex)
		rd.posting[key] = m
	}
	return m
}

func codeOf(err error) diag.Code {
	if l, ok := diag.As(err); ok && len(l) > 0 {
		return l[0].Code
	}
	return ""
}

func refuse(w http.ResponseWriter, status int, err error) {
	l, ok := diag.As(err)
	if !ok {
		l = diag.List{diag.New(diag.SecAggWireBadRequest, "threshold-he", "%v", err)}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	diag.RenderJSON(w, l)
}
