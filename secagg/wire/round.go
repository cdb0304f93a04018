package wire

import (
	"crypto/ed25519"
	"fmt"
	"sync"
	"time"

	"github.com/scellis/scellis/secagg"
)

// stage numbers the five message kinds a site sends, in order.
type stage int

const (
	stageAdvert stage = iota
	stageShares
	stageMasked
	stageSignature
	stageUnmasking
)

var stageNames = [...]string{"key advert", "shares", "masked input", "survivor signature", "unmasking"}

func (s stage) String() string { return stageNames[s] }

// phase is the server phase that takes messages of stage s.
func (s stage) phase() secagg.Phase { return secagg.Phase(s) }

// hostRound is one open round on a Host: its secagg.Server and what the
// phases published for the sites to fetch.
type hostRound struct {
	id     string
	digest []byte
	srv    *secagg.Server
	dl     Deadlines
	keys   map[string]ed25519.PublicKey // members' identity keys
	n, dim int
	kick   chan struct{} // a message was accepted: check Missing again
	done   chan struct{} // closed when the round has an outcome
	taken  chan struct{} // closed when Result takes the outcome
	// aborted is closed by Host.Abort (once, under Host.mu): the round
	// ends at once with abortErr.
	aborted  chan struct{}
	abortErr error

	mu          sync.Mutex
	phase       secagg.Phase  // the last phase published to the sites
	changed     chan struct{} // closed and replaced at every publication
	keyset      []byte
	deliveries  map[string][]byte
	survivorSet []byte          // the unsigned survivor set, for U3 to sign
	unmask      []byte          // the survivor set with the signatures
	survivors   map[string]bool // U3
	signers     map[string]bool // U4
	result      *secagg.Result
	resultCBOR  []byte
	err         error
	isTaken     bool
	accepted    map[acceptKey][32]byte // digest of each accepted message
	// excused are sites known not to take part (they declined the round):
	// a phase does not wait for them until its deadline.
	excused map[string]bool
	// polls counts the GETs each caller (site, or aggregator peer) holds
	// open on the round, bounded by maxPolls.
	polls map[string]int
	// relayed: a sub-cohort of a hierarchical round (Params.Parent); it
	// ends with partial, the masked sum for the parent (hier.go).
	relayed bool
	partial *secagg.PartialSum
}

// waiting reports whether the current phase still waits for a site that
// has not been excused.
func (rd *hostRound) waiting() bool {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for _, s := range rd.srv.Missing() {
		if !rd.excused[s] {
			return true
		}
	}
	return false
}

type acceptKey struct {
	site  string
	stage stage
}

func newHostRound(p secagg.Params, digest []byte, srv *secagg.Server, dl Deadlines, keys map[string]ed25519.PublicKey) *hostRound {
	dim := p.Dim
	if p.Weighted {
		dim++
	}
	return &hostRound{
		id: p.Round, digest: digest, srv: srv, dl: dl, keys: keys, n: len(p.Members), dim: dim,
		kick: make(chan struct{}, 1), done: make(chan struct{}), taken: make(chan struct{}), aborted: make(chan struct{}),
		changed: make(chan struct{}), accepted: map[acceptKey][32]byte{}, polls: map[string]int{},
	}
}

func (rd *hostRound) subject() string { return fmt.Sprintf("secure aggregation round %q", rd.id) }

// limit is the largest body a site may post at stage s: generous for the
// round's size, tiny against memory.
func (rd *hostRound) limit(s stage) int64 {
	n := int64(rd.n)
	switch s {
	case stageAdvert:
		return 2 << 10
	case stageShares:
		return 2<<10 + n*1536
	case stageMasked:
		return 1<<10 + 8*int64(rd.dim)
	case stageSignature:
		return 1 << 10
	default:
		return 1<<10 + n*192
	}
}

// poke tells the round's goroutine that a message arrived.
func (rd *hostRound) poke() {
	select {
	case rd.kick <- struct{}{}:
	default:
	}
}

// publishLocked makes a new phase visible to long polls.
func (rd *hostRound) publishLocked(p secagg.Phase) {
	rd.phase = p
	close(rd.changed)
	rd.changed = make(chan struct{})
}

func (rd *hostRound) endAdvertise() error {
	ks, err := rd.srv.EndAdvertise()
	if err != nil {
		return rd.fail(err)
	}
	b, err := ks.Marshal()
	if err != nil {
		return rd.fail(err)
	}
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.keyset = b
	rd.publishLocked(secagg.PhaseShare)
	return nil
}

func (rd *hostRound) endShare() error {
	dels, err := rd.srv.EndShare()
	if err != nil {
		return rd.fail(err)
	}
	out := make(map[string][]byte, len(dels))
	for _, d := range dels {
		b, err := d.Marshal()
		if err != nil {
			return rd.fail(err)
		}
		out[d.To] = b
	}
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.keyset = nil
	rd.deliveries = out
	rd.publishLocked(secagg.PhaseMask)
	return nil
}

func (rd *hostRound) endMask() error {
	req, err := rd.srv.EndMask()
	if err != nil {
		return rd.fail(err)
	}
	b, err := req.Marshal()
	if err != nil {
		return rd.fail(err)
	}
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.deliveries = nil
	rd.survivorSet = b
	rd.survivors = make(map[string]bool, len(req.Survivors))
	for _, s := range req.Survivors {
		rd.survivors[s] = true
	}
	rd.publishLocked(secagg.PhaseConsistency)
	return nil
}

func (rd *hostRound) endConsistency() error {
	req, err := rd.srv.EndConsistency()
	if err != nil {
		return rd.fail(err)
	}
	b, err := req.Marshal()
	if err != nil {
		return rd.fail(err)
	}
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.survivorSet = nil
	rd.unmask = b
	rd.signers = make(map[string]bool, len(req.Signatures))
	for _, s := range req.Signatures {
		rd.signers[s.Of] = true
	}
	rd.publishLocked(secagg.PhaseUnmask)
	return nil
}

func (rd *hostRound) finish() error {
	if rd.relayed {
		return rd.relay()
	}
	res, err := rd.srv.Finish()
	if err != nil {
		return rd.fail(err)
	}
	b, err := encodeResult(res)
	if err != nil {
		return rd.fail(err)
	}
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.clearLocked()
	rd.result, rd.resultCBOR = res, b
	rd.publishLocked(secagg.PhaseDone)
	close(rd.done)
	return nil
}

// fail ends the round with err, which every waiting site receives.
func (rd *hostRound) fail(err error) error {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.clearLocked()
	rd.err = err
	rd.publishLocked(secagg.PhaseFailed)
	close(rd.done)
	return err
}

func (rd *hostRound) clearLocked() {
	rd.keyset, rd.deliveries, rd.survivorSet, rd.unmask = nil, nil, nil, nil
}

// take hands the outcome to the reducer, once.
func (rd *hostRound) take() (*secagg.Result, error) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	select {
	case <-rd.done:
	default:
		return nil, ErrRunning
	}
	if rd.isTaken {
		return nil, ErrOver
	}
	if rd.relayed && rd.err == nil {
		return nil, errRelayed(rd)
	}
	rd.isTaken = true
	close(rd.taken)
	res, err := rd.result, rd.err
	rd.result, rd.resultCBOR = nil, nil
	return res, err
}

// tombstone is what the host keeps of the round once it is over.
func (rd *hostRound) tombstone() *tombstone {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	ts := &tombstone{digest: rd.digest, err: rd.err, at: time.Now(), unmasked: map[string][32]byte{}}
	for k, v := range rd.accepted {
		if k.stage == stageUnmasking {
			ts.unmasked[k.site] = v
		}
	}
	rd.result, rd.resultCBOR, rd.accepted = nil, nil, nil
	return ts
}
