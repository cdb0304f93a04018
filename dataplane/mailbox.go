package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// Mailbox holds signalling messages for the members that poll this
// aggregator node. It is node-local memory — not replicated, not in the
// Raft log — bounded per peer pair and per recipient, and every message
// expires after TTL: a peer that never reads its mail costs a few
// kilobytes for a minute.
type Mailbox struct {
	// TTL: how long an unread message is kept (default 30 s).
	TTL time.Duration
	// PerPair bounds the unread messages from one member to another
	// (default 8); PerRecipient all unread messages to one member
	// (default 128); PerSender all unread messages from one member, to
	// anyone (default 64: a member cannot hold more than 64 × 32 KiB of
	// the node's memory however many members it writes to). A post beyond
	// any is refused (SC7202).
	PerPair, PerRecipient, PerSender int

	mu      sync.Mutex
	boxes   map[string][]mail
	wake    map[string]chan struct{}
	waiting map[string]int // member → its polls waiting in Take
}

// MaxWaiting bounds the polls one member holds waiting in Take at once:
// a peer polls one at a time; a poll beyond the bound returns at once,
// without waiting, so a member cannot pile up waiting requests.
const MaxWaiting = 4

// MaxSignalBytes bounds one signalling message (an SDP with its
// candidates is a few kilobytes).
const MaxSignalBytes = 32 << 10

type mail struct {
	s  Signal
	at time.Time
}

func (m *Mailbox) ttl() time.Duration { return cmpOr(m.TTL, 30*time.Second) }

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Post leaves s for s.To; from is the authenticated sender, which s must
// name.
func (m *Mailbox) Post(from string, s Signal) error {
	if s.From != from {
		return diag.New(diag.P2PSignalRefused, from, "%s posted a signal claiming to be from %q", from, s.From)
	}
	if s.Kind != KindOffer && s.Kind != KindAnswer {
		return diag.New(diag.P2PSignalRefused, from, "a signal of kind %.40q: only offers and answers are relayed", s.Kind)
	}
	if size := s.size(); size > MaxSignalBytes {
		return diag.New(diag.P2PMailboxFull, from, "signal of %d bytes exceeds %d", size, MaxSignalBytes)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	box := m.expire(s.To)
	pair := 0
	for _, e := range box {
		if e.s.From == from {
			pair++
		}
	}
	if pair >= cmpOr(m.PerPair, 8) || len(box) >= cmpOr(m.PerRecipient, 128) {
		return diag.New(diag.P2PMailboxFull, s.To, "%s's signalling mailbox is full", s.To).
			WithHelp("the peer is not reading its mail (down, or not running the data plane); transfers fall back to HTTPS")
	}
	sent := 0
	for to := range m.boxes {
		for _, e := range m.expire(to) {
			if e.s.From == from {
				sent++
			}
		}
	}
	if sent >= cmpOr(m.PerSender, 64) {
		return diag.New(diag.P2PMailboxFull, from, "%s has %d unread signals waiting on this node", from, sent).
			WithHelp("the peers it signals are not reading their mail; transfers fall back to HTTPS")
	}
	m.boxes[s.To] = append(m.boxes[s.To], mail{s: s, at: time.Now()})
	if w, ok := m.wake[s.To]; ok {
		close(w)
		delete(m.wake, s.To)
	}
	return nil
}

// size is what a signal costs the mailbox.
func (s *Signal) size() int {
	return len(s.SDP) + len(s.Session) + len(s.Fingerprint) + len(s.Sig) + len(s.To) + len(s.Kind)
}

func (m *Mailbox) init() {
	if m.boxes == nil {
		m.boxes, m.wake, m.waiting = map[string][]mail{}, map[string]chan struct{}{}, map[string]int{}
	}
}

// expire drops to's expired mail and returns the rest; m.mu is held.
func (m *Mailbox) expire(to string) []mail {
	box := m.boxes[to]
	cut := time.Now().Add(-m.ttl())
	i := 0
	for i < len(box) && box[i].at.Before(cut) {
		i++
	}
	box = box[i:]
	if len(box) == 0 {
		delete(m.boxes, to)
		return nil
	}
	m.boxes[to] = box
	return box
}

// Take returns to's unread mail, waiting up to wait for some to arrive.
func (m *Mailbox) Take(ctx context.Context, to string, wait time.Duration) []Signal {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	m.mu.Lock()
	m.init()
	if m.waiting[to] >= MaxWaiting {
		wait = 0 // enough of its polls wait already: answer this one at once
	} else {
		m.waiting[to]++
		defer func() {
			m.mu.Lock()
			if m.waiting[to]--; m.waiting[to] <= 0 {
				delete(m.waiting, to)
			}
			m.mu.Unlock()
		}()
	}
	m.mu.Unlock()
	for {
		m.mu.Lock()
		if box := m.expire(to); len(box) > 0 {
			delete(m.boxes, to)
			m.mu.Unlock()
			out := make([]Signal, len(box))
			for i, e := range box {
				out[i] = e.s
			}
			return out
		}
		if wait <= 0 {
			m.mu.Unlock()
			return nil
		}
		w, ok := m.wake[to]
		if !ok {
			w = make(chan struct{})
			m.wake[to] = w
		}
		m.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return nil
		case <-deadline.C:
			return nil
		}
	}
}

// Pending counts unread, unexpired messages (status).
func (m *Mailbox) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for to := range m.boxes {
		n += len(m.expire(to))
	}
	return n
}

// Prefix is where Handler serves, beside the control plane's /v1/ and
// the blob endpoint.
const Prefix = "/p2p/"

// MaxWait bounds a mailbox long poll.
const MaxWait = 25 * time.Second

// Handler serves the mailbox and the ICE configuration on an
// aggregator's mutual-TLS listener:
//
//	POST /p2p/signal        leave a Signal (JSON) for its recipient
//	GET  /p2p/signal?wait_ms=  the caller's mail, long-polled up to wait_ms
//	GET  /p2p/ice           ICE servers for the caller (short-lived TURN credentials)
//
// ice may be nil (no STUN/TURN on this node).
func Handler(fed *identity.Federation, box *Mailbox, ice func(member string) []ICEServer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /p2p/signal", func(w http.ResponseWriter, r *http.Request) {
		peer, ok := fed.PeerFromRequest(r)
		if !ok {
			refuse(w, http.StatusUnauthorized, diag.New(diag.PoolUnknownPeer, "p2p", "not a federation member"))
			return
		}
		var s Signal
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 2*MaxSignalBytes))
		dec.DisallowUnknownFields()
		err := dec.Decode(&s)
		if _, terr := dec.Token(); err == nil && terr != io.EOF {
			err = errors.New("trailing data after the signal")
		}
		if err != nil {
			status, code := http.StatusBadRequest, diag.P2PSignalRefused
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				status, code = http.StatusRequestEntityTooLarge, diag.P2PMailboxFull
			}
			refuse(w, status, diag.New(code, peer.Name, "unreadable signal: %v", err).
				WithHelp("a signal is one JSON object with the fields of dataplane.Signal"))
			return
		}
		if _, ok := fed.Member(s.To); !ok {
			refuse(w, http.StatusBadRequest, diag.New(diag.P2PSignalRefused, s.To, "%q is not a member of the federation", s.To))
			return
		}
		if err := box.Post(peer.Name, s); err != nil {
			status := http.StatusTooManyRequests
			if ds, ok := diag.As(err); ok && ds[0].Code == diag.P2PSignalRefused {
				status = http.StatusForbidden
			} else if s.size() > MaxSignalBytes {
				status = http.StatusRequestEntityTooLarge
			}
			refuse(w, status, err)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("GET /p2p/signal", func(w http.ResponseWriter, r *http.Request) {
		peer, ok := fed.PeerFromRequest(r)
		if !ok {
			refuse(w, http.StatusUnauthorized, diag.New(diag.PoolUnknownPeer, "p2p", "not a federation member"))
			return
		}
		wait, _ := strconv.Atoi(r.URL.Query().Get("wait_ms"))
		out := box.Take(r.Context(), peer.Name, min(time.Duration(max(wait, 0))*time.Millisecond, MaxWait))
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(cmpNil(out))
	})
	mux.HandleFunc("GET /p2p/ice", func(w http.ResponseWriter, r *http.Request) {
		peer, ok := fed.PeerFromRequest(r)
		if !ok {
			refuse(w, http.StatusUnauthorized, diag.New(diag.PoolUnknownPeer, "p2p", "not a federation member"))
			return
		}
		var out []ICEServer
		if ice != nil {
			out = ice(peer.Name)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(cmpNil(out))
	})
	return mux
}

func cmpNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func refuse(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	ds, ok := diag.As(err)
	if !ok {
		ds = diag.List{diag.New(diag.P2PSignalRefused, "p2p", "%v", err)}
	}
	diag.RenderJSON(w, ds)
}
