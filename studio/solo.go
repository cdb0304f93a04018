package studio

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// A solo run (scellis run --ui) has no federation, no coordinator and no
// members: its Studio shows the one job as the pool of one executes it,
// to whoever holds the random token printed with the URL. The token is a
// secret compared in constant time; the page is served on the address
// given (loopback unless the user says otherwise).

// Solo is a Source over a job a pool of one runs: Shard reports each
// result as it lands.
type Solo struct {
	plan   *job.Plan
	metric string
	goal   string
	start  int64

	mu      sync.Mutex
	shards  []coordinator.ShardStatus
	results map[content.Ref][]byte
	done    bool
	subs    map[chan coordinator.Event]struct{}
}

var _ Source = (*Solo)(nil)

// NewSolo returns the source of a solo run of plan.
func NewSolo(plan *job.Plan) *Solo {
	s := &Solo{plan: plan, start: time.Now().UnixMilli(), results: map[content.Ref][]byte{}, subs: map[chan coordinator.Event]struct{}{}}
	s.metric, _ = plan.Spec.Reducer.Params["metric"].(string)
	s.goal, _ = plan.Spec.Reducer.Params["goal"].(string)
	for _, sh := range plan.Shards {
		s.shards = append(s.shards, coordinator.ShardStatus{Index: sh.Index, ID: sh.ID, Price: sh.Cost, State: coordinator.StatePending})
	}
	return s
}

// Shard records a shard's result (nil: it failed) and wakes the view.
func (s *Solo) Shard(i int, r *job.Result) {
	s.mu.Lock()
	if i >= 0 && i < len(s.shards) {
		if r == nil {
			s.shards[i].State = coordinator.StateUnverified
		} else {
			s.results[r.Hash] = r.Bytes
			s.shards[i].State, s.shards[i].Result = coordinator.StateVerified, r.Hash
		}
		s.shards[i].DecidedAt = time.Now().UnixMilli()
	}
	s.mu.Unlock()
	s.publish(coordinator.ShardVerified{Job: s.plan.ID, Shard: i})
}

// Done marks the job finished.
func (s *Solo) Done() {
	s.mu.Lock()
	s.done = true
	s.mu.Unlock()
	s.publish(coordinator.JobComplete{Job: s.plan.ID})
}

func (s *Solo) publish(e coordinator.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.subs {
		select {
		case ch <- e:
		default: // the view rebuilds from the state anyway
		}
	}
}

// Subscribe implements Source.
func (s *Solo) Subscribe() (<-chan coordinator.Event, func()) {
	ch := make(chan coordinator.Event, 64)
	s.mu.Lock()
	s.subs[ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(s.subs, ch)
		s.mu.Unlock()
	}
}

// Jobs implements Source: the one job.
func (s *Solo) Jobs() []coordinator.JobStatus {
	js, _ := s.Job(s.plan.ID)
	js.Shards = nil
	return []coordinator.JobStatus{js}
}

// Job implements Source.
func (s *Solo) Job(id content.Ref) (coordinator.JobStatus, error) {
	if id != s.plan.ID {
		return coordinator.JobStatus{}, errors.New("studio: not this run's job")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	js := coordinator.JobStatus{ID: s.plan.ID, Name: s.plan.Spec.Name, Regime: trust.Own, State: coordinator.JobRunning,
		SubmittedAt: s.start, Shards: append([]coordinator.ShardStatus(nil), s.shards...)}
	if s.done {
		js.State = coordinator.JobDone
	}
	js.Counts.Total = len(s.shards)
	for _, sh := range s.shards {
		switch sh.State {
		case coordinator.StateVerified:
			js.Counts.Verified++
		case coordinator.StateUnverified:
			js.Counts.Unverified++
		default:
			js.Counts.Pending++
		}
	}
	return js, nil
}

// Blob implements Source: the results of this run.
func (s *Solo) Blob(_ context.Context, ref content.Ref) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.results[ref]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("studio: no result %s", ref.Short())
}

// Plan implements Source.
func (s *Solo) Plan(context.Context, coordinator.JobStatus) (Plan, error) {
	p := Plan{Metric: s.metric, Goal: s.goal}
	for _, sh := range s.plan.Shards {
		p.Params = append(p.Params, sh.Params)
	}
	return p, nil
}

func (s *Solo) Runs() []coordinator.RunStatus     { return nil }
func (s *Solo) Receipts(uint64) []receipt.Receipt { return nil }
func (s *Solo) Contributions() map[string]int64   { return nil }
func (s *Solo) Cluster() Cluster                  { return Cluster{Node: "solo", State: "pool of one (no coordinator)"} }

// NewSoloServer returns a Studio over a solo run, admitting whoever
// presents secret (in the URL once, then the cookie).
func NewSoloServer(src *Solo, secret string, log *slog.Logger) *Server {
	s := NewServer(src, nil, log)
	s.secret = []byte(secret)
	return s
}

// soloViewer checks a solo run's secret in constant time.
func (s *Server) soloViewer(tok string) (Viewer, error) {
	if tok == "" {
		return Viewer{}, errNoViewer
	}
	if subtle.ConstantTimeCompare([]byte(tok), s.secret) != 1 {
		return Viewer{}, ErrTokenForged
	}
	return Viewer{Member: "you", Role: "owner", Via: "solo token"}, nil
}

// SoloTLSConfig is the TLS of a solo run's Studio: a certificate made at
// start (there is no identity key), and its SHA-256 fingerprint.
func SoloTLSConfig(host string) (*tls.Config, string, error) {
	c, err := browserCert("solo", host)
	if err != nil {
		return nil, "", err
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*c}}, fingerprint(c), nil
}
