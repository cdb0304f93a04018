package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/identity"
)

// Hub fans coordinator events out to watchers. Every node applies the same
// log, so every node's hub sees the same events and any node can serve a
// watch stream. A watcher that falls behind is dropped (its channel
// closed); it reconnects and reads the status again.
type Hub struct {
	mu   sync.Mutex
	subs map[*subscription]struct{}
}

type subscription struct {
	job content.Ref // "" for every job
	ch  chan coordinator.Event
}

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{subs: map[*subscription]struct{}{}} }

// Publish delivers events to their watchers without blocking.
func (h *Hub) Publish(events []coordinator.Event) {
	if h == nil || len(events) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		for _, e := range events {
			if s.job != "" && e.JobID() != s.job {
				continue
			}
			select {
			case s.ch <- e:
			default:
				close(s.ch)
				delete(h.subs, s)
				goto next
			}
		}
	next:
	}
}

// Subscribe returns a channel of events for job ("" for all) and a cancel
// function that must be called when done.
func (h *Hub) Subscribe(job content.Ref) (<-chan coordinator.Event, func()) {
	s := &subscription{job: job, ch: make(chan coordinator.Event, 1024)}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s.ch, func() {
		h.mu.Lock()
		if _, ok := h.subs[s]; ok {
			delete(h.subs, s)
			close(s.ch)
		}
		h.mu.Unlock()
	}
}

// jobEvents streams a job's progress as server-sent events: first a
// "status" event with the job's current counts, then each event as it is
// applied, ending after "job-complete". The ID may also name a training
// run (run events carry the run's ID): the status is then the run's, and
// the stream ends after "run-complete".
func (s *Server) jobEvents(w http.ResponseWriter, r *http.Request) {
	id, ok := s.jobID(w, r)
	if !ok {
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	leave, ok := s.holds.enter(w, "event stream", peerOf(r).Name, maxEventStreams)
	if !ok {
		return
	}
	defer leave()
	events, cancel := s.Events.Subscribe(id)
	defer cancel()
	var status any
	var over bool
	if js, err := s.Read.Job(id); err == nil {
		js.Shards = nil
		status, over = js, js.State == coordinator.JobDone || js.State == coordinator.JobCancelledState || js.State == coordinator.JobAbandoned
	} else if rs, err := s.Read.Run(id); err == nil {
		status, over = rs, rs.State != coordinator.RunRunning
	} else {
		s.jobStatus(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	writeEvent(w, "status", status)
	flusher.Flush()
	if over {
		return
	}
	keepAlive := time.NewTicker(KeepAlive)
	defer keepAlive.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-keepAlive.C:
			if s.Fresh != nil && s.Fresh().Stale {
				// Cut off from the cluster, this node would stream
				// nothing: end the stream so the client moves on.
				return
			}
			fmt.Fprint(w, ": keep-alive\n\n")
			flusher.Flush()
		case e, ok := <-events:
			if !ok || writeEvents(w, peerOf(r), e, events) {
				flusher.Flush()
				return
			}
			flusher.Flush()
		}
	}
}

// writeEvents writes e and the events already waiting behind it (up to
// maxEventsPerFlush), for one flush: a log entry of a batch of reports
// applies hundreds of events at once, and a TLS record and a write each
// (and a read each at the watcher) cost more than the event itself. It
// reports whether the stream ends: a job or run ended, or the hub dropped
// this watcher (it reconnects and reads the status again).
func writeEvents(w http.ResponseWriter, viewer identity.Member, e coordinator.Event, events <-chan coordinator.Event) (end bool) {
	for n := 1; ; n++ {
		writeEvent(w, e.Kind(), redactEvent(e, viewer))
		switch e.(type) {
		case coordinator.JobComplete, coordinator.RunComplete, coordinator.JobCancelled:
			return true
		}
		if n == maxEventsPerFlush {
			return false
		}
		var ok bool
		select {
		case e, ok = <-events:
			if !ok {
				return true
			}
		default:
			return false
		}
	}
}

// maxEventsPerFlush bounds the events an event stream writes before it
// flushes them (the rest follow at once).
const maxEventsPerFlush = 256

func writeEvent(w http.ResponseWriter, kind string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", kind, b)
}
