package wire

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
)

// Errors Result and Wait return besides a round's own diagnostic.
var (
	// ErrRunning: the round has not finished yet.
	ErrRunning = errors.New("wire: the secure aggregation round is still running")
	// ErrUnknownRound: no round of that ID was opened on this host (or it
	// was forgotten long ago).
	ErrUnknownRound = errors.New("wire: no secure aggregation round of that ID on this host")
	// ErrOver: the round is over and its outcome was already taken, or
	// expired untaken after HostOptions.ResultTTL.
	ErrOver = errors.New("wire: the secure aggregation round is over and its outcome is gone")
)

// Deadlines bound each phase of a round, counted from the moment the phase
// begins (Advertise from Open). A phase ends early once every site it
// waits for has answered; at its deadline it ends with the sites it has,
// and the others count as dropped out. A zero field takes the default of
// DefaultDeadlines.
type Deadlines struct {
	// Advertise must cover the sites' local training: a site that calls
	// Participate with its finished, charged update advertises only after
	// training (but see TrainInMask).
	Advertise time.Duration
	Share     time.Duration
	// Mask must cover uploading a masked vector of 8·(Dim+1) bytes.
	Mask time.Duration
	// Consistency is the consistency round: every survivor signs the
	// survivor set. Zero takes the Unmask deadline (one more exchange of
	// the same small size), so callers that set only Unmask bound both.
	Consistency time.Duration
	Unmask      time.Duration
	// TrainInMask says the sites advertise before they train
	// (ParticipateBeforeInput, as silos do: the key exchange runs while
	// they train and charge), so their training falls in the mask phase:
	// that phase then also has what the advertise phase left of
	// Advertise. The round's worst case is unchanged.
	TrainInMask bool
}

// DefaultDeadlines are the deadlines of a zero Deadlines field.
func DefaultDeadlines() Deadlines {
	return Deadlines{Advertise: 10 * time.Minute, Share: time.Minute, Mask: 2 * time.Minute, Consistency: time.Minute, Unmask: time.Minute}
}

// Total is the longest a round under d can take: the sum of its phases'
// deadlines, each zero one at its default (every default for invalid d).
func (d Deadlines) Total() time.Duration {
	d, err := d.withDefaults()
	if err != nil {
		d = DefaultDeadlines()
	}
	return d.Advertise + d.Share + d.Mask + d.Consistency + d.Unmask
}

func (d Deadlines) withDefaults() (Deadlines, error) {
	def := DefaultDeadlines()
	fields := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{{"advertise", &d.Advertise, def.Advertise}, {"share", &d.Share, def.Share}, {"mask", &d.Mask, def.Mask}, {"consistency", &d.Consistency, def.Consistency}, {"unmask", &d.Unmask, def.Unmask}}
	if d.Consistency == 0 && d.Unmask > 0 {
		d.Consistency = d.Unmask
	}
	for _, f := range fields {
		if *f.v < 0 {
			return d, diag.New(diag.SecAggBadParams, "secure aggregation deadlines", "the %s deadline is negative (%v)", f.name, *f.v).
				WithHelp("give each phase a positive duration, or 0 for the default %v", f.def)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	return d, nil
}

// HostOptions tune a Host; the zero value is production.
type HostOptions struct {
	// LongPoll is how long a GET waits for its phase before answering
	// 204 No Content, after which the site polls again (default 20 s).
	LongPoll time.Duration
	// ResultTTL is how long a finished round waits for Result or Wait to
	// take its outcome before it is forgotten anyway (default 10 min).
	ResultTTL time.Duration
	// Remember is how long the ID of a round that is over stays known:
	// Open refuses to run it again, and late sites learn that it is over
	// (default 24 h).
	Remember time.Duration
	// MaxRounds bounds the rounds open at once (default 64): each holds
	// one secagg.Server, i.e. one vector of Dim+1 ring elements.
	MaxRounds int
	// MaxInputsInFlight bounds the masked-input bodies being read and
	// added at once, across rounds (default 4): with the open rounds'
	// accumulators, it bounds the host's memory.
	MaxInputsInFlight int
	// OnFinish, when set, is called once per round when it ends: err is
	// nil when the sum is ready for Result, else why the round failed (a
	// diagnostic). It is called from the round's goroutine, after the
	// outcome is published, and must not block for long.
	OnFinish func(round string, err error)
	// OnPhase, when set, is called as each phase of a round ends (advertise,
	// share, mask, consistency, unmask) with how long it took: the aggregator's metrics.
	// It must not block.
	OnPhase func(round, phase string, d time.Duration)
}

func (o HostOptions) withDefaults() HostOptions {
	if o.LongPoll <= 0 {
		o.LongPoll = 20 * time.Second
	}
	if o.ResultTTL <= 0 {
		o.ResultTTL = 10 * time.Minute
	}
	if o.Remember <= 0 {
		o.Remember = 24 * time.Hour
	}
	if o.MaxRounds <= 0 {
		o.MaxRounds = 64
	}
	if o.MaxInputsInFlight <= 0 {
		o.MaxInputsInFlight = 4
	}
	return o
}

// Host serves secure aggregation rounds over HTTPS: an http.Handler for the
// paths under Prefix, to be served with a TLS config that requires client
// certificates pinned to the federation (identity.ServerTLSConfig). Each
// open round holds one secagg.Server; a goroutine per round ends each phase
// when every expected site has answered or the phase's deadline passes. A
// round is forgotten once its outcome is taken (Result, Wait) or after
// HostOptions.ResultTTL. A Host is safe for concurrent use.
//
// Lock order: Host.mu, then a round's mu, then the secagg.Server's own.
type Host struct {
	fed    *identity.Federation
	opt    HostOptions
	mux    *http.ServeMux
	inputs chan struct{} // a token per masked-input body in memory
	quit   chan struct{} // closed by Close
	wg     sync.WaitGroup

	mu     sync.Mutex
	rounds map[string]*hostRound
	over   map[string]*tombstone
	closed bool
	// parents are the hierarchical rounds this host is the parent of
	// (hier.go), by ID.
	parents map[string]*hostParent
}

// tombstone is what stays of a round that is over.
type tombstone struct {
	digest []byte
	err    error // why it failed; nil if it produced a sum
	at     time.Time
	// unmasked holds the digests of the unmaskings it accepted, so that a
	// site retrying one whose answer was lost is told it arrived.
	unmasked map[string][32]byte
}

// NewHost returns a host that authenticates callers against fed (by the
// key of their TLS certificate) and accepts rounds whose members are
// silos of fed.
func NewHost(fed *identity.Federation, opt HostOptions) *Host {
	opt = opt.withDefaults()
	h := &Host{
		fed: fed, opt: opt, inputs: make(chan struct{}, opt.MaxInputsInFlight), quit: make(chan struct{}),
		rounds: map[string]*hostRound{}, over: map[string]*tombstone{},
	}
	h.mux = h.routes()
	return h
}

// ServeHTTP serves the endpoints under Prefix (see docs/secagg.md).
func (h *Host) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Open starts the round p with the given phase deadlines. Opening a round
// that is open with equal params again does nothing (the first deadlines
// hold); other params under the same round ID are refused (SC6104), as is
// an ID whose round is over (SC6103): every run needs a fresh round ID.
// Every member must be a silo of the federation, under its member name and
// with its federation key (SC6106). Invalid params are refused with
// secagg's diagnostic (with fewer than three members: SC6002).
func (h *Host) Open(p secagg.Params, dl Deadlines) error {
	srv, err := secagg.NewServer(p)
	if err != nil {
		return err
	}
	digest, err := p.Digest()
	if err != nil {
		return err
	}
	if dl, err = dl.withDefaults(); err != nil {
		return err
	}
	subject := fmt.Sprintf("secure aggregation round %q", p.Round)
	var problems diag.List
	keys := make(map[string]ed25519.PublicKey, len(p.Members))
	for _, m := range p.Members {
		fm, ok := h.fed.Member(m.ID)
		var pk identity.PublicKey
		copy(pk[:], m.Key)
		switch {
		case !ok:
			problems = append(problems, diag.New(diag.SecAggWireNotSilo, subject, "member %q is not a member of federation %q", m.ID, h.fed.Name).
				WithHelp("round members are silos of the federation, named by their member name"))
		case fm.Role != identity.Silo:
			problems = append(problems, diag.New(diag.SecAggWireNotSilo, subject, "member %q is a %s, not a silo", m.ID, fm.Role).
				WithHelp("only silos take part in secure aggregation"))
		case !fm.PublicKey.Equal(pk):
			problems = append(problems, diag.New(diag.SecAggWireNotSilo, subject, "member %q is listed with another key than the federation file's", m.ID).
				WithHelp("build the round's members from the federation file"))
		}
		keys[m.ID] = m.Key
	}
	if len(problems) > 0 {
		return problems
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return diag.New(diag.SecAggWireUnavailable, subject, "the secure aggregation host is closed").
			WithHelp("open rounds on a running aggregator")
	}
	h.pruneLocked(time.Now())
	if rd, ok := h.rounds[p.Round]; ok {
		if string(rd.digest) == string(digest) {
			return nil
		}
		return diag.New(diag.SecAggWireConflict, subject, "the round is open with other parameters").
			WithHelp("every open of a round carries the same parameters; use a fresh round ID for a new round")
	}
	if _, ok := h.over[p.Round]; ok {
		return diag.New(diag.SecAggWireRoundOver, subject, "the round ran already").
			WithHelp("a round ID runs once (two sums over different sites would reveal their difference); open a new round ID")
	}
	if len(h.rounds) >= h.opt.MaxRounds {
		return diag.New(diag.SecAggWireUnavailable, subject, "%d rounds are open, the host's limit", len(h.rounds)).
			WithHelp("take the results of finished rounds, or raise HostOptions.MaxRounds")
	}
	rd := newHostRound(p, digest, srv, dl, keys)
	rd.relayed = p.Parent != nil
	h.rounds[p.Round] = rd
	h.wg.Add(1)
	go h.drive(rd)
	return nil
}

// Result returns the outcome of a finished round and forgets the round:
// the sum, or the diagnostic the round failed with. While the round runs
// it returns ErrRunning; once the outcome was taken (or expired), ErrOver;
// for a round never opened here, ErrUnknownRound.
func (h *Host) Result(round string) (*secagg.Result, error) {
	rd, err := h.untaken(round)
	if err != nil {
		return nil, err
	}
	return h.take(rd)
}

// untaken returns the round whose outcome may still be taken: ErrOver once
// it was taken (or expired), ErrUnknownRound for a round never opened here.
func (h *Host) untaken(round string) (*hostRound, error) {
	h.mu.Lock()
	rd, ok := h.rounds[round]
	_, over := h.over[round]
	h.mu.Unlock()
	switch {
	case over:
		return nil, ErrOver
	case !ok:
		return nil, ErrUnknownRound
	}
	return rd, nil
}

// take hands a finished round's outcome over and forgets the round.
func (h *Host) take(rd *hostRound) (*secagg.Result, error) {
	res, err := rd.take()
	if !errors.Is(err, ErrRunning) && !errors.Is(err, ErrOver) && codeOf(err) != diag.SecAggRelayed {
		h.forget(rd) // a relayed round's partial sum waits for WaitPartial
	}
	return res, err
}

// Wait waits until the round finishes (or ctx ends) and then takes its
// outcome as Result does.
func (h *Host) Wait(ctx context.Context, round string) (*secagg.Result, error) {
	h.mu.Lock()
	rd, ok := h.rounds[round]
	h.mu.Unlock()
	if !ok {
		return h.Result(round)
	}
	select {
	case <-rd.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return h.take(rd)
}

// Close ends every open round (each fails with SC6107, which waiting sites
// receive), wakes every long poll and waits for the rounds' goroutines.
// Requests after Close are refused with SC6107. Close does not stop the
// HTTP server the host is mounted on.
func (h *Host) Close() error {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.quit)
	}
	h.mu.Unlock()
	h.wg.Wait()
	return nil
}

// drive runs one round's phases, publishes its outcome, and forgets the
// round once the outcome is taken or expires.
func (h *Host) drive(rd *hostRound) {
	defer h.wg.Done()
	steps := []struct {
		name string
		d    time.Duration
		end  func() error
	}{
		{"advertise", rd.dl.Advertise, rd.endAdvertise},
		{"share", rd.dl.Share, rd.endShare},
		{"mask", rd.dl.Mask, rd.endMask},
		{"consistency", rd.dl.Consistency, rd.endConsistency},
		{"unmask", rd.dl.Unmask, rd.finish},
	}
	var err error
	var advertised time.Duration // how long the advertise phase took
	for _, st := range steps {
		began := time.Now()
		d := st.d
		if st.name == "mask" && rd.dl.TrainInMask {
			// The sites train in this phase: what the advertise phase
			// left of its deadline is theirs (Advertise + Share + Mask
			// still bounds the round up to here).
			d += max(rd.dl.Advertise-advertised, 0)
		}
		if !h.await(rd, d) {
			err = diag.New(diag.SecAggWireUnavailable, rd.subject(), "the aggregator's secure aggregation host closed during the round").
				WithHelp("the round ends without a result; run it again under a new round ID")
			select {
			case <-rd.aborted:
				err = rd.abortErr
			default:
			}
			rd.fail(err)
			break
		}
		if err = st.end(); err != nil {
			break
		}
		if st.name == "advertise" {
			advertised = time.Since(began)
		}
		if h.opt.OnPhase != nil {
			h.opt.OnPhase(rd.id, st.name, time.Since(began))
		}
	}
	if h.opt.OnFinish != nil {
		h.opt.OnFinish(rd.id, err)
	}
	t := time.NewTimer(h.opt.ResultTTL)
	select {
	case <-rd.taken:
	case <-t.C:
	case <-h.quit:
	}
	t.Stop()
	h.forget(rd)
}

// await waits until the current phase has heard from every site it waits
// for, or for d; it returns false when the host closes.
func (h *Host) await(rd *hostRound, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for rd.waiting() {
		select {
		case <-rd.kick:
		case <-t.C:
			return true
		case <-h.quit:
			return false
		case <-rd.aborted:
			return false
		}
	}
	return true
}

// Abort ends an open round at once without a result: its sites learn that
// it is lost (SC6107 with reason) and Wait returns the diagnostic. The
// aggregator aborts a round it can no longer finish — it lost the
// leadership, and the round is planned again elsewhere — so that no site
// waits for a phase deadline. Aborting an unknown or finished round is a
// no-op.
func (h *Host) Abort(round, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rd := h.rounds[round]
	if rd == nil {
		return
	}
	select {
	case <-rd.aborted:
		return
	default:
	}
	rd.abortErr = diag.New(diag.SecAggWireUnavailable, rd.subject(), "the round was aborted: %s", reason).
		WithHelp("the round ends without a result; the aggregator plans it again under a new round ID")
	close(rd.aborted)
}

// forget replaces a round that is over by its tombstone (once).
func (h *Host) forget(rd *hostRound) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rounds[rd.id] != rd {
		return
	}
	ts := rd.tombstone()
	delete(h.rounds, rd.id)
	h.over[rd.id] = ts
	h.pruneLocked(ts.at)
}

// pruneLocked drops tombstones older than Remember.
func (h *Host) pruneLocked(now time.Time) {
	for id, ts := range h.over {
		if now.Sub(ts.at) > h.opt.Remember {
			delete(h.over, id)
		}
	}
}

// lookup finds the round a request names: open (rd), over (ts), or
// neither.
func (h *Host) lookup(round string) (rd *hostRound, ts *tombstone, closed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rounds[round], h.over[round], h.closed
}

// Excuse tells the host that site will not take part in round (it
// declined it): the current and later phases stop waiting for it, so the
// round goes on without waiting for the deadline. The site is then treated
// as any dropout. Excusing an unknown round or site is a no-op.
func (h *Host) Excuse(round, site string) {
	rd, _, _ := h.lookup(round)
	if rd == nil {
		return
	}
	rd.mu.Lock()
	if rd.excused == nil {
		rd.excused = map[string]bool{}
	}
	rd.excused[site] = true
	rd.mu.Unlock()
	select {
	case rd.kick <- struct{}{}:
	default:
	}
}
