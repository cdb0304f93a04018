package wire

import (
	"context"
	"net/http"
	"slices"
	"strconv"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg/he"
)

// HEPrefix is the path the aggregator mounts a Host at for threshold-he
// rounds.
const HEPrefix = "/secagg-he/"

// thresholdHE is threshold homomorphic encryption: package secagg/he's
// Party on each site and Aggregator on the host, which adds ciphertexts as
// they arrive and releases the sum only after t partial decryptions opened
// it. Its endpoints, under HEPrefix v1/rounds/{round}/:
//
//	POST advert       he.Advert        → 204
//	GET  keyset       → he.KeySet      (long poll)
//	POST shares       he.Shares        → 204
//	GET  delivery     → he.Delivery    (the caller's own)
//	POST ciphertext   he.Ciphertext    → 204
//	GET  decrypt?from=N → he.DecryptRequest of attempt ≥ N;
//	                    410 SC6103 once the sum is open
//	POST decshare     he.DecryptShare  → 204
//
// A second, different message of a stage conflicts with the one accepted
// (409, SC6006). A decryptor that does not answer in time is replaced in a
// new attempt, each bounded by Deadlines.Unmask.
var thresholdHE = scheme{
	name:      "threshold-he",
	prefix:    HEPrefix,
	linger:    true,
	maxRounds: func(o HostOptions) int { return o.MaxHERounds },
	conflicts: []diag.Code{diag.SecAggDuplicate},
	stages: []stage{
		{path: "advert", what: "key advert", phase: phaseOf(he.PhaseAdvertise),
			limit: func(_, _ int64) int64 { return 2 << 10 },
			parse: parseAdd(he.ParseAdvert, func(m *he.Advert) string { return m.Site }, (*he.Aggregator).AddAdvert)},
		{path: "shares", what: "key shares", phase: phaseOf(he.PhaseShare),
			limit: func(n, _ int64) int64 { return 4<<10 + (n+1)*(poly()+1024) },
			parse: parseAdd(he.ParseShares, func(m *he.Shares) string { return m.From }, (*he.Aggregator).AddShares)},
		{path: "ciphertext", what: "ciphertext", phase: phaseOf(he.PhaseEncrypt), big: true,
			limit: func(_, cts int64) int64 { return 1<<10 + cts*(poly()+64) }, // one c0 per ciphertext
			parse: parseAdd(he.ParseCiphertext, func(m *he.Ciphertext) string { return m.From }, (*he.Aggregator).AddCiphertext)},
		{path: "decshare", what: "partial decryption", phase: phaseOf(he.PhaseDecrypt),
			limit: func(_, cts int64) int64 { return 1<<10 + cts*(int64(he.ShareBytes())+32) },
			parse: parseAdd(he.ParseDecryptShare, func(m *he.DecryptShare) string { return m.From }, (*he.Aggregator).AddDecryptShare)},
	},
	gets: []get{
		{pattern: "keyset", what: "key set", bound: func(n, _ int64) int64 { return 4<<10 + n<<10 }},
		{pattern: "delivery", what: "delivery", bound: func(n, _ int64) int64 { return 4<<10 + n*(poly()+1024) }},
		{pattern: "decrypt", what: "decrypt request", bound: func(n, _ int64) int64 { return 4<<10 + n*256 }, ready: heDecrypt},
	},
}

// thresholdHE's own stage and get, after those every scheme begins with.
const (
	stageDecShare = stageContribution + 1
	getDecrypt    = getDelivery + 1
)

// poly is the size of one polynomial of the scheme's ring.
func poly() int64 { return int64(he.PolyBytes()) }

// heRound is threshold-he's side of one round on the host.
type heRound struct {
	rd     *hostRound // its round, from run on
	agg    *he.Aggregator
	n, cts int64
	opened bool // the sum is open (run's own)

	// Under rd.mu: the decrypt request of the current attempt, and the
	// sum once open.
	req     []byte
	attempt int
	res     *he.Result
}

func (h *heRound) machine() any               { return h.agg }
func (h *heRound) size() (n, units int64)     { return h.n, h.cts }
func (h *heRound) missing() []string          { return h.agg.Missing() }
func (h *heRound) endLocked()                 { h.req = nil }
func (h *heRound) phase() (ph int, fail bool) { p := h.agg.Phase(); return int(p), p == he.PhaseFailed }

// run is the round's phases: the sites advertise box keys, share their
// key shares, send their ciphertexts, and decryptors answer decrypt
// requests, attempt after attempt, until t of them open the sum. Their
// names (OnPhase) keep them apart from masking's.
func (h *heRound) run(r *runner) error {
	h.rd = r.rd
	if err := r.phase("he-advertise", slotAdvertise, h.endAdvertise); err != nil {
		return err
	}
	if err := r.phase("he-share", slotShare, h.endShare); err != nil {
		return err
	}
	if err := r.phase("he-encrypt", slotMask, func() error { return h.request(h.agg.EndEncrypt()) }); err != nil {
		return err
	}
	for !h.opened {
		if err := r.phase("he-decrypt", slotUnmask, h.endDecrypt); err != nil {
			return err
		}
	}
	return nil
}

func (h *heRound) endAdvertise() error {
	ks, err := h.agg.EndAdvertise()
	return publishMsg(h.rd, doc{pattern: "keyset", over: "key sharing has ended"}, ks, err)
}

func (h *heRound) endShare() error {
	dels, err := h.agg.EndShare()
	return publishEach(h.rd, deliveryDoc("delivery"), dels, func(d *he.Delivery) string { return d.To }, err)
}

// request publishes a decryption attempt's request.
func (h *heRound) request(req *he.DecryptRequest, err error) error {
	if err != nil {
		return err
	}
	b, err := req.Marshal()
	if err != nil {
		return err
	}
	h.rd.publish(func() { h.req, h.attempt = b, req.Attempt })
	return nil
}

// endDecrypt ends a decryption attempt: the sum is open, or the next
// attempt replaces the decryptors that did not answer.
func (h *heRound) endDecrypt() error {
	res, req, err := h.agg.EndDecrypt()
	if err != nil || res == nil {
		return h.request(req, err)
	}
	h.opened = true
	h.rd.publish(func() { h.res = res })
	return nil
}

// heDecrypt answers GET decrypt?from=N: the request of attempt N or later.
func heDecrypt(c *call, r *http.Request) reply {
	rd := c.rd
	h := rd.state.(*heRound)
	from, _ := strconv.Atoi(r.URL.Query().Get("from"))
	switch {
	case rd.err != nil:
		return reply{status: http.StatusConflict, err: rd.err}
	case rd.ended:
		return reply{status: http.StatusGone, err: diag.New(diag.SecAggWireRoundOver, c.subject(), "the round is over: it produced its sum").
			WithHelp("nothing more to do for this round")}
	case h.req != nil && h.attempt >= from:
		return reply{status: http.StatusOK, body: h.req}
	}
	return reply{}
}

// OpenHE starts threshold-he round p, as Open starts a masking round (the
// same refusals; its members must be silos of the federation, SC6106).
func (h *Host) OpenHE(p he.Params, dl Deadlines) error {
	return h.open(opening{sch: &thresholdHE, id: p.Round, digest: p.Digest, members: p.Members, state: func() (roundState, error) {
		agg, err := he.NewAggregator(p)
		return &heRound{agg: agg, n: int64(len(p.Members)), cts: int64(p.Ciphertexts())}, err
	}}, dl)
}

// WaitHE waits for the threshold-he round's outcome and takes it (once):
// the sum, or the diagnostic the round failed with. The round stays on
// the host for its late sites (HostOptions.ResultTTL) all the same.
func (h *Host) WaitHE(ctx context.Context, round string) (*he.Result, error) {
	rd, err := h.ended(ctx, round, &thresholdHE)
	if err != nil {
		return nil, err
	}
	return takeOutcome(h, rd, func(s *heRound) (*he.Result, error) { return s.res, nil })
}

// heSite is threshold-he's side of one round on a site.
type heSite struct {
	c    *he.Party
	site string
}

func (h *heSite) check(in Input) error    { return h.c.CheckInput(in.Encoded) }
func (h *heSite) advert() ([]byte, error) { return marshal(h.c.Advertise()) }

func (h *heSite) share(keySet []byte) ([]byte, error) {
	return respond(he.ParseKeySet, h.c.Share)(keySet)
}

func (h *heSite) contribute(delivery []byte, in Input) ([]byte, error) {
	return respond(he.ParseDelivery, func(d *he.Delivery) (*he.Ciphertext, error) { return h.c.Encrypt(d, in.Encoded) })(delivery)
}

// conclude answers the decrypt requests that name this site until the
// round has opened its sum.
func (h *heSite) conclude(ctx context.Context, s *session) error {
	for from := 0; ; {
		b, err := s.fetch(ctx, getDecrypt, "?from="+strconv.Itoa(from))
		if codeOf(err) == diag.SecAggWireRoundOver {
			return nil // the sum is open
		}
		if err != nil {
			return err
		}
		req, err := he.ParseDecryptRequest(b)
		if err != nil {
			return err
		}
		from = req.Attempt + 1
		if !slices.Contains(req.Decryptors, h.site) {
			continue
		}
		share, err := marshal(h.c.Decrypt(req))
		if err != nil {
			return err
		}
		if err := s.send(ctx, stageDecShare, share); err != nil {
			return err
		}
	}
}
