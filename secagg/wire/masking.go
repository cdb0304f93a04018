package wire

import (
	"context"
	"net/http"
	"sync"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg"
)

// Prefix is the path the aggregator mounts a Host at for masking rounds
// (and the hierarchical rounds built of them).
const Prefix = "/secagg/"

// pathRounds is where the masking rounds' endpoints are.
const pathRounds = Prefix + "v1/rounds/"

// masking is pairwise masking, or SecAgg+ over a sparse graph, as the
// round's secagg.Params choose: package secagg's Client on each site and
// Server on the host. Its endpoints, under Prefix v1/rounds/{round}/:
//
//	POST advert             secagg.Advert         → 204
//	GET  keyset             → secagg.KeySet       (long poll until advertising ends)
//	POST reveal             secagg.GraphReveal    → 204 (SecAgg+ on a sparse graph)
//	GET  reveals            → secagg.GraphRevealSet (long poll until the reveal phase ends)
//	POST shares             secagg.Shares         → 204
//	GET  deliveries/{site}  → secagg.ShareDelivery (the caller's own only)
//	POST masked             secagg.MaskedInput    → 204
//	GET  survivors          → secagg.UnmaskRequest, unsigned (survivors only)
//	POST signature          secagg.SurvivorSig    → 204
//	GET  unmask             → secagg.UnmaskRequest with signatures (signers only)
//	POST unmasking          secagg.Unmasking      → 204
//	GET  result             → the sum             (members and aggregators)
//
// A message from a site that the round does not expect in its phase (it
// dropped out of an earlier one) is too late (SC6109); a second, different
// message of a stage is malformed (400, SC6006).
var masking = scheme{
	name:      "secure aggregation",
	prefix:    Prefix,
	maxRounds: func(o HostOptions) int { return o.MaxRounds },
	late:      []diag.Code{diag.SecAggUnknownSite},
	stages: []stage{
		{path: "advert", what: "key advert", phase: phaseOf(secagg.PhaseAdvertise),
			limit: func(_, _ int64) int64 { return 2 << 10 },
			parse: parseAdd(secagg.ParseAdvert, func(m *secagg.Advert) string { return m.Client }, (*secagg.Server).AddAdvert)},
		{path: "shares", what: "shares", phase: phaseOf(secagg.PhaseShare),
			limit: func(n, _ int64) int64 { return 2<<10 + n*1536 },
			parse: parseAdd(secagg.ParseShares, func(m *secagg.Shares) string { return m.From }, (*secagg.Server).AddShares)},
		{path: "masked", what: "masked input", phase: phaseOf(secagg.PhaseMask), big: true,
			limit: func(_, units int64) int64 { return 1<<10 + 8*units },
			parse: parseAdd(secagg.ParseMaskedInput, func(m *secagg.MaskedInput) string { return m.From }, (*secagg.Server).AddMaskedInput)},
		{path: "signature", what: "survivor signature", phase: phaseOf(secagg.PhaseConsistency),
			limit: func(_, _ int64) int64 { return 1 << 10 },
			parse: parseAdd(secagg.ParseSurvivorSig, func(m *secagg.SurvivorSig) string { return m.From }, (*secagg.Server).AddSignature)},
		{path: "unmasking", what: "unmasking", phase: phaseOf(secagg.PhaseUnmask), lastWord: true,
			limit: func(n, _ int64) int64 { return 1<<10 + n*192 },
			parse: parseAdd(secagg.ParseUnmasking, func(m *secagg.Unmasking) string { return m.From }, (*secagg.Server).AddUnmasking)},
		{path: "reveal", what: "graph reveal", phase: phaseOf(secagg.PhaseReveal),
			limit: func(_, _ int64) int64 { return 1 << 10 },
			parse: parseAdd(secagg.ParseGraphReveal, func(m *secagg.GraphReveal) string { return m.From }, (*secagg.Server).AddReveal)},
	},
	gets: []get{
		{pattern: "keyset", what: "key set", bound: func(n, _ int64) int64 { return 2<<10 + n<<10 }},
		{pattern: "deliveries/{site}", what: "share delivery", bound: func(n, _ int64) int64 { return 2<<10 + n*1536 }},
		{pattern: "survivors", what: "survivor set", bound: func(n, _ int64) int64 { return 1<<10 + n*192 }},
		{pattern: "unmask", what: "unmask request", bound: func(n, _ int64) int64 { return 1<<10 + n*(192+224) }},
		{pattern: "result", what: "result", aggregators: true, bound: func(n, units int64) int64 { return 4<<10 + 8*units + n*192 }, ready: maskResult},
		{pattern: "reveals", what: "graph reveal set", bound: func(n, _ int64) int64 { return 1<<10 + n*192 }},
	},
}

// masking's own stages and gets, after those every scheme begins with.
const (
	stageSignature = stageContribution + 1 + iota
	stageUnmasking
	stageReveal
)

const (
	getSurvivors = getDelivery + 1 + iota
	getUnmask
	getResult
	getReveals
)

// maskUnits is a masked input's ring elements: Dim, and the weight.
func maskUnits(p secagg.Params) int {
	if p.Weighted {
		return p.Dim + 1
	}
	return p.Dim
}

// maskRound is masking's side of one round on the host.
type maskRound struct {
	rd       *hostRound // its round, from run on
	srv      *secagg.Server
	n, units int64
	keySet   []byte // the key set's encoding, published again with the reveals
	// relayed: a sub-cohort of a hierarchical round (Params.Parent); it
	// ends with partial, the masked sum for the parent (hier.go).
	relayed bool
	// rec keeps the round's transcript (OpenRecorded); nil: not recorded.
	rec *recorder

	// Under rd.mu: the outcome, until it is taken; resultCBOR is the
	// sum's encoding, made on the first GET result only (the reducer on
	// this host takes the sum in process, and holding a second copy of a
	// model-sized vector until then would raise the aggregator's peak).
	result     *secagg.Result
	resultCBOR []byte
	partial    *secagg.PartialSum
}

func (m *maskRound) machine() any           { return m.srv }
func (m *maskRound) size() (n, units int64) { return m.n, m.units }
func (m *maskRound) missing() []string      { return m.srv.Missing() }
func (m *maskRound) endLocked()             {}
func (m *maskRound) phase() (ph int, fail bool) {
	p := m.srv.Phase()
	return int(p), p == secagg.PhaseFailed
}

// run is the round's phases: the sites advertise keys, share them, send
// their inputs masked, sign the survivor set (the consistency round) and
// unmask.
func (m *maskRound) run(r *runner) error {
	m.rd = r.rd
	if err := r.phase("advertise", slotAdvertise, m.endAdvertise); err != nil {
		return err
	}
	// SecAgg+ on a sparse graph: the sites reveal the randomness their
	// adverts committed to, and the graph is drawn from all of it
	// (secagg/graphseed.go). Under the share deadline: one small message.
	if m.srv.Phase() == secagg.PhaseReveal {
		if err := r.phase("reveal", slotShare, m.endReveal); err != nil {
			return err
		}
	}
	if err := r.phase("share", slotShare, m.endShare); err != nil {
		return err
	}
	if err := r.phase("mask", slotMask, m.endMask); err != nil {
		return err
	}
	if err := r.phase("consistency", slotConsistency, m.endConsistency); err != nil {
		return err
	}
	return r.phase("unmask", slotUnmask, m.finish)
}

// keySetDoc is the key set's publication.
var keySetDoc = doc{pattern: "keyset", over: "the key set is no longer served: key sharing has ended"}

func (m *maskRound) endAdvertise() error {
	ks, err := m.srv.EndAdvertise()
	if err != nil {
		return err
	}
	if m.keySet, err = ks.Marshal(); err != nil {
		return err
	}
	d := keySetDoc
	d.body = m.keySet
	m.rd.publish(nil, &d)
	return nil
}

// endReveal publishes the reveal set beside the key set, which the sites
// fetch again to share their keys.
func (m *maskRound) endReveal() error {
	rs, err := m.srv.EndReveal()
	if err != nil {
		return err
	}
	b, err := rs.Marshal()
	if err != nil {
		return err
	}
	ks := keySetDoc
	ks.body = m.keySet
	m.rd.publish(nil, &ks, &doc{pattern: "reveals", body: b, over: "the graph reveal set is no longer served: key sharing has ended"})
	return nil
}

func (m *maskRound) endShare() error {
	dels, err := m.srv.EndShare()
	return publishEach(m.rd, deliveryDoc("deliveries/{site}"), dels, func(d *secagg.ShareDelivery) string { return d.To }, err)
}

func (m *maskRound) endMask() error {
	req, err := m.srv.EndMask()
	if err != nil {
		return err
	}
	return publishMsg(m.rd, doc{pattern: "survivors", to: setOf(req.Survivors),
		missed: "its masked input did not arrive before input collection ended", over: "the consistency round has ended"}, req, nil)
}

func (m *maskRound) endConsistency() error {
	req, err := m.srv.EndConsistency()
	if err != nil {
		return err
	}
	signers := make(map[string]bool, len(req.Signatures))
	for _, s := range req.Signatures {
		signers[s.Of] = true
	}
	return publishMsg(m.rd, doc{pattern: "unmask", to: signers,
		missed: "its survivor signature did not arrive before the consistency round ended", over: "unmasking has ended"}, req, nil)
}

// finish opens the sum, or relays the masked sum of a sub-cohort.
func (m *maskRound) finish() error {
	if m.relayed {
		return m.relay()
	}
	res, err := m.srv.Finish()
	if err != nil {
		return err
	}
	m.rd.publish(func() { m.result = res })
	return nil
}

func setOf(ids []string) map[string]bool {
	s := make(map[string]bool, len(ids))
	for _, id := range ids {
		s[id] = true
	}
	return s
}

// maskResult answers GET result: the sum, until the reducer takes it.
func maskResult(c *call, _ *http.Request) reply {
	rd := c.rd
	m := rd.state.(*maskRound)
	switch {
	case rd.err != nil:
		return reply{status: http.StatusConflict, err: rd.err}
	case m.result != nil:
		if m.resultCBOR == nil {
			b, err := encodeResult(m.result)
			if err != nil {
				return reply{status: http.StatusInternalServerError, err: err}
			}
			m.resultCBOR = b
		}
		return reply{status: http.StatusOK, body: m.resultCBOR, asJSON: resultJSONOf(m.result)}
	case rd.isTaken:
		return reply{status: http.StatusGone, err: diag.New(diag.SecAggWireRoundOver, c.subject(), "the round is over and its sum was handed to the reducer").
			WithHelp("fetch the next model from the reducer peer")}
	}
	return reply{}
}

// Open starts the masking round p with the given phase deadlines.
// Opening a round that is open with equal params again does nothing (the
// first deadlines hold); other params under the same round ID are refused
// (SC6104), as is an ID whose round is over (SC6103): every run needs a
// fresh round ID. Every member must be a silo of the federation, under its
// member name and with its federation key (SC6106). Invalid params are
// refused with secagg's diagnostic (with fewer than three members: SC6002).
func (h *Host) Open(p secagg.Params, dl Deadlines) error {
	return h.open(opening{sch: &masking, id: p.Round, digest: p.Digest, members: p.Members, state: func() (roundState, error) {
		srv, err := secagg.NewServer(p)
		return &maskRound{srv: srv, n: int64(len(p.Members)), units: int64(maskUnits(p)), relayed: p.Parent != nil}, err
	}}, dl)
}

// Result returns the outcome of a finished masking round and forgets the
// round: the sum, or the diagnostic the round failed with. While the round
// runs it returns ErrRunning; once the outcome was taken (or expired),
// ErrOver; for a round never opened here, ErrUnknownRound.
func (h *Host) Result(round string) (*secagg.Result, error) {
	rd, err := h.untaken(round, &masking)
	if err != nil {
		return nil, err
	}
	return h.takeSum(rd)
}

// Wait waits until the masking round finishes (or ctx ends) and then takes
// its outcome as Result does.
func (h *Host) Wait(ctx context.Context, round string) (*secagg.Result, error) {
	rd, err := h.ended(ctx, round, &masking)
	if err != nil {
		return nil, err
	}
	return h.takeSum(rd)
}

// ended waits until the round of scheme sch that round names has an
// outcome not yet taken, or ctx ends.
func (h *Host) ended(ctx context.Context, round string, sch *scheme) (*hostRound, error) {
	rd, err := h.untaken(round, sch)
	if err != nil {
		return nil, err
	}
	select {
	case <-rd.done:
		return rd, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// takeSum takes a masking round's sum (a relayed round's is refused:
// WaitPartial takes its partial sum).
func (h *Host) takeSum(rd *hostRound) (*secagg.Result, error) {
	return takeOutcome(h, rd, func(m *maskRound) (*secagg.Result, error) {
		if m.relayed && rd.err == nil {
			return nil, errRelayed(rd)
		}
		res := m.result
		m.result, m.resultCBOR = nil, nil
		return res, nil
	})
}

// takeOutcome takes a finished round's outcome (Host.take): what out
// hands over of its state, once.
func takeOutcome[S roundState, T any](h *Host, rd *hostRound, out func(S) (T, error)) (T, error) {
	var v T
	err := h.take(rd, func() (err error) {
		v, err = out(rd.state.(S))
		return err
	})
	if err != nil {
		var none T
		return none, err
	}
	return v, nil
}

// maskSite is masking's side of one round on a site.
type maskSite struct{ c *secagg.Client }

func (m *maskSite) check(in Input) error {
	if in.Encoded != nil {
		return m.c.CheckEncoded(in.Encoded, in.Weight)
	}
	return m.c.CheckInput(in.Values, in.Weight)
}

func (m *maskSite) advert() ([]byte, error) { return marshal(m.c.Advertise()) }

// reveal runs the reveal phase of a SecAgg+ round on a sparse graph
// (nothing otherwise): the site checks the key set, sends the randomness
// its advert committed to, and draws the graph from every site's.
func (m *maskSite) reveal(ctx context.Context, s *session) error {
	if !m.c.Reveals() {
		return nil
	}
	if err := s.answer(ctx, getKeySet, "", respond(secagg.ParseKeySet, m.c.Reveal), stageReveal); err != nil {
		return err
	}
	b, err := s.fetch(ctx, getReveals, "")
	if err != nil {
		return err
	}
	rs, err := secagg.ParseGraphRevealSet(b)
	if err != nil {
		return err
	}
	return m.c.DrawGraph(rs)
}

func (m *maskSite) share(keySet []byte) ([]byte, error) {
	return respond(secagg.ParseKeySet, m.c.ShareKeys)(keySet)
}

// contribute masks the input into the buffer kept from the last round
// (maskBuf), which is free again once the masked input is marshalled.
func (m *maskSite) contribute(delivery []byte, in Input) ([]byte, error) {
	d, err := secagg.ParseShareDelivery(delivery)
	if err != nil {
		return nil, err
	}
	buf := maskBuf.take()
	var mi *secagg.MaskedInput
	if in.Encoded != nil {
		mi, err = m.c.MaskEncodedTo(buf, d, in.Encoded, in.Weight)
	} else {
		mi, err = m.c.MaskInputTo(buf, d, in.Values, in.Weight)
	}
	if err != nil {
		maskBuf.give(buf)
		return nil, err
	}
	b, err := mi.Marshal()
	maskBuf.give(mi.Masked)
	return b, err
}

// conclude signs the survivor set the host shows (the consistency round)
// and unmasks for the signers.
func (m *maskSite) conclude(ctx context.Context, s *session) error {
	if err := s.answer(ctx, getSurvivors, "", respond(secagg.ParseUnmaskRequest, m.c.SignSurvivors), stageSignature); err != nil {
		return err
	}
	return s.answer(ctx, getUnmask, "", respond(secagg.ParseUnmaskRequest, m.c.Unmask), stageUnmasking)
}

// maskBuf keeps the last masked vector's buffer for the next round
// (secagg.Client.MaskInputTo), so a site masking a d-vector round after
// round neither allocates nor has the allocator zero 8·d bytes each time.
// One buffer is kept, the largest returned; a round running beside
// another takes none and allocates. What it holds was sent in the clear
// (a masked input), so keeping it exposes nothing.
var maskBuf bufSlot

type bufSlot struct {
	mu sync.Mutex
	b  []byte
}

// take returns the kept buffer (nil if none) and keeps none.
func (s *bufSlot) take() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.b
	s.b = nil
	return b
}

// give keeps b if it is larger than the buffer kept.
func (s *bufSlot) give(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cap(b) > cap(s.b) {
		s.b = b
	}
}
