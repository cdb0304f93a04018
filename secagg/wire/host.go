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

// HostOptions tune a Host; the zero value is production.
type HostOptions struct {
	// LongPoll is how long a GET waits for its phase before answering
	// 204 No Content, after which the site polls again (default 20 s).
	LongPoll time.Duration
	// ResultTTL is how long a finished round waits for its outcome to be
	// taken before it is forgotten anyway (default 10 min); a threshold-he
	// round stays that long in any case, for its late sites.
	ResultTTL time.Duration
	// Remember is how long the ID of a round that is over stays known:
	// Open refuses to run it again, and late sites learn that it is over
	// (default 24 h).
	Remember time.Duration
	// MaxRounds bounds the masking rounds open at once (default 64): each
	// holds one secagg.Server, i.e. one vector of Dim+1 ring elements.
	MaxRounds int
	// MaxHERounds bounds the threshold-he rounds open at once (default 16:
	// each holds ⌈Dim/8192⌉ ciphertexts of 256 KiB).
	MaxHERounds int
	// MaxInputsInFlight bounds the masked inputs and ciphertexts being
	// read and added at once, across rounds (default 4): with the open
	// rounds' accumulators, it bounds the host's memory.
	MaxInputsInFlight int
	// MaxInputBytesInFlight bounds their bytes too (default 16 MiB), so
	// that at model size the bodies held at once cost a constant, not
	// several models: one body is always let in, however large.
	MaxInputBytesInFlight int64
	// OnFinish, when set, is called once per round when it ends: err is
	// nil when the sum is ready to be taken, else why the round failed (a
	// diagnostic). It is called from the round's goroutine, after the
	// outcome is published, and must not block for long.
	OnFinish func(round string, err error)
	// OnPhase, when set, is called as each phase of a round ends
	// (masking: advertise, share, mask, consistency, unmask; threshold-he:
	// he-advertise, he-share, he-encrypt, he-decrypt for each attempt)
	// with how long it took: the aggregator's metrics. It must not block.
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
	if o.MaxHERounds <= 0 {
		o.MaxHERounds = 16
	}
	if o.MaxInputsInFlight <= 0 {
		o.MaxInputsInFlight = 4
	}
	if o.MaxInputBytesInFlight <= 0 {
		o.MaxInputBytesInFlight = 16 << 20
	}
	return o
}

// Host serves secure aggregation rounds of every scheme over HTTPS: an
// http.Handler for the paths under Prefix (masking) and HEPrefix
// (threshold-he), to be served with a TLS config that requires client
// certificates pinned to the federation (identity.ServerTLSConfig). Each
// open round holds its scheme's state machine; a goroutine per round ends
// each phase when every expected site has answered or the phase's deadline
// passes. A round is forgotten once its outcome is taken (Result, Wait,
// WaitHE; a threshold-he round lingers, see scheme.linger) or after
// HostOptions.ResultTTL. A Host is safe for concurrent use.
//
// Lock order: Host.mu, then a round's mu, then its state machine's own.
type Host struct {
	fed    *identity.Federation
	opt    HostOptions
	mux    *http.ServeMux
	inputs *inflight     // the masked input and ciphertext bodies in memory
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

// NewHost returns a host that authenticates callers against fed (by the
// key of their TLS certificate) and accepts rounds whose members are
// silos of fed.
func NewHost(fed *identity.Federation, opt HostOptions) *Host {
	opt = opt.withDefaults()
	h := &Host{
		fed: fed, opt: opt, inputs: newInflight(opt.MaxInputsInFlight, opt.MaxInputBytesInFlight), quit: make(chan struct{}),
		rounds: map[string]*hostRound{}, over: map[string]*tombstone{},
	}
	h.mux = h.routes()
	return h
}

// ServeHTTP serves the endpoints under Prefix and HEPrefix (see
// docs/secagg.md).
func (h *Host) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// opening is a round about to open: its scheme, the scheme's state for it,
// and what the host checks of it.
type opening struct {
	sch     *scheme
	id      string
	digest  func() ([]byte, error) // the params' digest: equal params, equal digests
	members []secagg.Member
	// state builds the scheme's state machine for the round, refusing
	// invalid params.
	state func() (roundState, error)
}

// open starts a round of any scheme with the given phase deadlines.
// Opening a round that is open with equal params again does nothing (the
// first deadlines hold); other params under the same round ID are refused
// (SC6104), as is an ID whose round is over (SC6103): every run needs a
// fresh round ID. Every member must be a silo of the federation, under its
// member name and with its federation key (SC6106).
func (h *Host) open(o opening, dl Deadlines) error {
	state, err := o.state()
	if err != nil {
		return err
	}
	digest, err := o.digest()
	if err != nil {
		return err
	}
	if dl, err = dl.withDefaults(); err != nil {
		return err
	}
	keys, err := h.siloKeys(o)
	if err != nil {
		return err
	}
	subject := fmt.Sprintf("%s round %q", o.sch.name, o.id)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return diag.New(diag.SecAggWireUnavailable, subject, "the secure aggregation host is closed").
			WithHelp("open rounds on a running aggregator")
	}
	h.pruneLocked(time.Now())
	if rd, ok := h.rounds[o.id]; ok {
		if string(rd.digest) == string(digest) {
			return nil
		}
		return diag.New(diag.SecAggWireConflict, subject, "the round is open with other parameters").
			WithHelp("every open of a round carries the same parameters; use a fresh round ID for a new round")
	}
	if _, ok := h.over[o.id]; ok {
		return diag.New(diag.SecAggWireRoundOver, subject, "the round ran already").
			WithHelp("a round ID runs once (two sums over different sites would reveal their difference); open a new round ID")
	}
	if n, limit := h.openLocked(o.sch), o.sch.maxRounds(h.opt); n >= limit {
		return diag.New(diag.SecAggWireUnavailable, subject, "%d rounds are open, the host's limit", n).
			WithHelp("take the results of finished rounds, or raise HostOptions.MaxRounds (MaxHERounds for threshold-he)")
	}
	rd := newHostRound(o.sch, o.id, digest, dl, keys)
	rd.state = state
	h.rounds[o.id] = rd
	h.wg.Add(1)
	go h.drive(rd)
	return nil
}

// siloKeys checks that every member of a round is a silo of the
// federation with its federation key, and returns their keys.
func (h *Host) siloKeys(o opening) (map[string]ed25519.PublicKey, error) {
	subject := fmt.Sprintf("%s round %q", o.sch.name, o.id)
	var problems diag.List
	keys := make(map[string]ed25519.PublicKey, len(o.members))
	for _, m := range o.members {
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
		return nil, problems
	}
	return keys, nil
}

// openLocked counts the open rounds of scheme sch.
func (h *Host) openLocked(sch *scheme) int {
	n := 0
	for _, rd := range h.rounds {
		if rd.sch == sch {
			n++
		}
	}
	return n
}

// untaken returns the round of scheme sch whose outcome may still be
// taken: ErrOver once it was taken (or expired), ErrUnknownRound for a
// round never opened here.
func (h *Host) untaken(round string, sch *scheme) (*hostRound, error) {
	rd, ts, _ := h.lookup(round, sch)
	switch {
	case ts != nil:
		return nil, ErrOver
	case rd == nil:
		return nil, ErrUnknownRound
	}
	return rd, nil
}

// take hands a finished round's outcome over (out, as hostRound.take) and
// forgets the round, unless its scheme lets it linger.
func (h *Host) take(rd *hostRound, out func() error) error {
	err := rd.take(out)
	if !errors.Is(err, ErrRunning) && !errors.Is(err, ErrOver) && codeOf(err) != diag.SecAggRelayed && !rd.sch.linger {
		h.forget(rd) // a relayed round's partial sum waits for WaitPartial
	}
	return err
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

// Excuse tells the host that site will not take part in round (it
// declined it): the current and later phases stop waiting for it, so the
// round goes on without waiting for the deadline. The site is then treated
// as any dropout. Excusing an unknown round or site is a no-op.
func (h *Host) Excuse(round, site string) {
	rd, _, _ := h.lookup(round, nil)
	if rd == nil {
		return
	}
	rd.mu.Lock()
	rd.excused[site] = true
	rd.mu.Unlock()
	rd.poke()
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

// lookup finds the round a request names, of scheme sch (nil: any): open
// (rd), over (ts), or neither.
func (h *Host) lookup(round string, sch *scheme) (rd *hostRound, ts *tombstone, closed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rd, ts = h.rounds[round], h.over[round]
	if sch != nil && rd != nil && rd.sch != sch {
		rd = nil
	}
	if sch != nil && ts != nil && ts.sch != sch {
		ts = nil
	}
	return rd, ts, h.closed
}

// inflight bounds the bodies held at once, in number and in bytes.
type inflight struct {
	mu              sync.Mutex
	n, maxN         int
	bytes, maxBytes int64
	freed           chan struct{} // closed, and replaced, when a body is let go
}

func newInflight(maxN int, maxBytes int64) *inflight {
	return &inflight{maxN: maxN, maxBytes: maxBytes, freed: make(chan struct{})}
}

// take waits until a body of size bytes fits (one is always let in alone,
// however large) and returns the release, or false when ctx or quit ends
// first.
func (f *inflight) take(ctx context.Context, quit <-chan struct{}, size int64) (release func(), ok bool) {
	size = min(max(size, 0), f.maxBytes)
	for {
		f.mu.Lock()
		if f.n < f.maxN && f.bytes+size <= f.maxBytes {
			f.n++
			f.bytes += size
			f.mu.Unlock()
			return func() {
				f.mu.Lock()
				f.n--
				f.bytes -= size
				close(f.freed)
				f.freed = make(chan struct{})
				f.mu.Unlock()
			}, true
		}
		freed := f.freed
		f.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, false
		case <-quit:
			return nil, false
		}
	}
}
