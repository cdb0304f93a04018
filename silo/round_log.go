package silo

import (
	"sync"
	"time"
)

// RoundKey identifies one round of one training run.
type RoundKey struct {
	Run   string
	Round int
}

// RoundRecord is a round the silo accepted, and when.
type RoundRecord struct {
	RoundKey
	At time.Time
}

// RoundLog is the silo's record of the rounds it accepted, which the
// policy's max_rounds_per_day counts. AcceptedSince returns every round
// accepted at or after since, in any order, each key once; it may be called
// concurrently with the silo recording rounds. An error makes CheckRound
// refuse (diag.SiloStateUnavailable): a limit that cannot be counted is not
// waived.
type RoundLog interface {
	AcceptedSince(since time.Time) ([]RoundRecord, error)
}

// MemoryRoundLog is a RoundLog kept in memory; the zero value is empty and
// ready. It forgets everything when the process ends, so a silo that must
// keep its daily limit across restarts rebuilds it (from its ledger's
// charge times, for example) with Record. It is safe for concurrent use.
type MemoryRoundLog struct {
	mu   sync.Mutex
	recs []RoundRecord
}

var _ RoundLog = (*MemoryRoundLog)(nil)

// Record notes that the silo accepted round k at time at. Recording a round
// again keeps the first time.
func (l *MemoryRoundLog) Record(k RoundKey, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.RoundKey == k {
			return
		}
	}
	l.recs = append(l.recs, RoundRecord{RoundKey: k, At: at})
}

// AcceptedSince implements RoundLog.
func (l *MemoryRoundLog) AcceptedSince(since time.Time) ([]RoundRecord, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []RoundRecord
	for _, r := range l.recs {
		if !r.At.Before(since) {
			out = append(out, r)
		}
	}
	return out, nil
}

// Forget drops the rounds accepted before t (older than any window the
// policy counts), so a long-running silo's log stays small.
func (l *MemoryRoundLog) Forget(before time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := l.recs[:0]
	for _, r := range l.recs {
		if !r.At.Before(before) {
			kept = append(kept, r)
		}
	}
	clear(l.recs[len(kept):])
	l.recs = kept
}
