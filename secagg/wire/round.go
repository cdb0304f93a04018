package wire

import (
	"crypto/ed25519"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// hostRound is one open round on a Host, of any scheme: its state (the
// scheme's roundState), what its phases published for the sites to fetch,
// and the bookkeeping every scheme shares.
type hostRound struct {
	id     string
	sch    *scheme
	state  roundState
	digest []byte
	dl     Deadlines
	keys   map[string]ed25519.PublicKey // members' identity keys
	kick   chan struct{}                // a message was accepted: check missing again
	done   chan struct{}                // closed when the round has an outcome
	taken  chan struct{}                // closed when the outcome is taken
	// aborted is closed by Host.Abort (once, under Host.mu): the round
	// ends at once with abortErr.
	aborted  chan struct{}
	abortErr error

	mu      sync.Mutex
	changed chan struct{}   // closed and replaced at every publication
	docs    map[string]*doc // what the phases published, by get pattern
	ended   bool            // the round has an outcome (err says which)
	err     error
	isTaken bool
	// accepted holds the digest of each accepted message; posting, a
	// lock per site and stage, held while a post of it is added.
	accepted map[acceptKey][32]byte
	posting  map[acceptKey]*sync.Mutex
	// excused are sites known not to take part (they declined the round,
	// or their lease lapsed): a phase does not wait for them until its
	// deadline.
	excused map[string]bool
	// polls counts the GETs each caller (site, or aggregator peer) holds
	// open on the round, bounded by maxPolls.
	polls map[string]int
}

type acceptKey struct {
	site  string
	stage string // the stage's path
}

func newHostRound(sch *scheme, id string, digest []byte, dl Deadlines, keys map[string]ed25519.PublicKey) *hostRound {
	return &hostRound{
		id: id, sch: sch, digest: digest, dl: dl, keys: keys,
		kick: make(chan struct{}, 1), done: make(chan struct{}), taken: make(chan struct{}), aborted: make(chan struct{}),
		changed: make(chan struct{}), docs: map[string]*doc{}, accepted: map[acceptKey][32]byte{},
		posting: map[acceptKey]*sync.Mutex{}, excused: map[string]bool{}, polls: map[string]int{},
	}
}

func (rd *hostRound) subject() string { return fmt.Sprintf("%s round %q", rd.sch.name, rd.id) }

// waiting reports whether the current phase still waits for a site that
// has not been excused.
func (rd *hostRound) waiting() bool {
	missing := rd.state.missing()
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for _, s := range missing {
		if !rd.excused[s] {
			return true
		}
	}
	return false
}

// poke tells the round's goroutine that a message arrived.
func (rd *hostRound) poke() {
	select {
	case rd.kick <- struct{}{}:
	default:
	}
}

// A doc is what a phase publishes under one get's pattern: one body for
// every site it is for, or each site's own.
type doc struct {
	pattern string
	body    []byte
	own     map[string][]byte // each site's own body (body unused)
	to      map[string]bool   // the sites it is for; nil: all the round's sites
	// missed says why a site it is not for is too late; over, why it is
	// served no more once the next phase's publication replaced it.
	missed, over string
	live         bool
}

// publish makes a phase's end visible to the long polls: what the last
// phase published is withdrawn, docs are served from now on, and set (if
// any) runs under the round's lock.
func (rd *hostRound) publish(set func(), docs ...*doc) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.withdrawLocked()
	for _, d := range docs {
		d.live = true
		rd.docs[d.pattern] = d
	}
	if set != nil {
		set()
	}
	rd.changedLocked()
}

// A marshaler is a message in its canonical bytes.
type marshaler interface{ Marshal() ([]byte, error) }

// publishMsg publishes d with m as its body: what a phase's end made (or
// the error it failed with).
func publishMsg[M marshaler](rd *hostRound, d doc, m M, err error) error {
	if err != nil {
		return err
	}
	if d.body, err = m.Marshal(); err != nil {
		return err
	}
	rd.publish(nil, &d)
	return nil
}

// publishEach publishes d with each site's own message of ms, addressed
// by to: what a phase's end made (or the error it failed with).
func publishEach[M marshaler](rd *hostRound, d doc, ms []M, to func(M) string, err error) error {
	if err != nil {
		return err
	}
	d.own = make(map[string][]byte, len(ms))
	for _, m := range ms {
		if d.own[to(m)], err = m.Marshal(); err != nil {
			return err
		}
	}
	rd.publish(nil, &d)
	return nil
}

// deliveryDoc is the doc of the sites' deliveries of the others' key
// shares, each its own.
func deliveryDoc(pattern string) doc {
	return doc{pattern: pattern, missed: "its shares did not arrive before key sharing ended", over: "input collection has ended"}
}

func (rd *hostRound) changedLocked() {
	close(rd.changed)
	rd.changed = make(chan struct{})
}

func (rd *hostRound) withdrawLocked() {
	for _, d := range rd.docs {
		d.live, d.body, d.own = false, nil, nil
	}
}

// serveDoc answers a GET of the document published under pattern: not yet
// before its phase, the caller's body while it is served, too late after.
func (rd *hostRound) serveDoc(c *call, pattern string) reply {
	d := rd.docs[pattern]
	switch {
	case rd.err != nil:
		return reply{status: http.StatusConflict, err: rd.err}
	case d == nil:
		return reply{}
	case !d.live:
		return reply{status: http.StatusConflict, err: tooLate(c, "%s", d.over)}
	case d.own != nil:
		if b, ok := d.own[c.site]; ok {
			return reply{status: http.StatusOK, body: b}
		}
	case d.to == nil || d.to[c.site]:
		return reply{status: http.StatusOK, body: d.body}
	}
	return reply{status: http.StatusConflict, err: tooLate(c, "%s", d.missed)}
}

// end publishes the round's outcome: err, or (nil) the scheme's, which
// its last phase holds ready.
func (rd *hostRound) end(err error) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.withdrawLocked()
	rd.state.endLocked()
	rd.ended, rd.err = true, err
	rd.changedLocked()
	close(rd.done)
}

// take hands the outcome over, once: ErrRunning before the round ends,
// ErrOver once it was taken. out hands the scheme's outcome over (under
// the round's lock); its error refuses the take, which may come again.
func (rd *hostRound) take(out func() error) error {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	select {
	case <-rd.done:
	default:
		return ErrRunning
	}
	if rd.isTaken {
		return ErrOver
	}
	if err := out(); err != nil {
		return err
	}
	rd.isTaken = true
	close(rd.taken)
	return rd.err
}

// maxPolls bounds the GETs one caller holds open on a round, so a member
// cannot pin the host's memory and goroutines with held polls: a
// participant holds one; a few more cover connections the site gave up on
// that the host has not seen close yet.
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

// postLock returns the lock of one site's stage (bounded: sites ×
// stages): a retry that arrives while the first copy is still being added
// waits for it, and is then recognised as a retry instead of refused as a
// second message.
func (rd *hostRound) postLock(key acceptKey) *sync.Mutex {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	m := rd.posting[key]
	if m == nil {
		m = new(sync.Mutex)
		rd.posting[key] = m
	}
	return m
}

// tombstone is what stays of a round that is over.
type tombstone struct {
	sch    *scheme
	digest []byte
	err    error // why it failed; nil if it produced a sum
	at     time.Time
	// lastWords holds the digests of the accepted messages of the
	// scheme's lastWord stage, so that a site retrying one whose answer
	// was lost is told it arrived.
	lastWords map[acceptKey][32]byte
}

// tombstone is what the host keeps of the round once it is over.
func (rd *hostRound) tombstone() *tombstone {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	ts := &tombstone{sch: rd.sch, digest: rd.digest, err: rd.err, at: time.Now(), lastWords: map[acceptKey][32]byte{}}
	for _, st := range rd.sch.stages {
		if !st.lastWord {
			continue
		}
		for k, v := range rd.accepted {
			if k.stage == st.path {
				ts.lastWords[k] = v
			}
		}
	}
	rd.accepted = nil
	return ts
}
