package pool

import (
	"context"
	"sync"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
)

// Lease renewals. A worker renews each lease it holds every third of the
// lease's TTL while work on it runs (Renewing). One loop a worker does it
// for all of its leases — not a goroutine and a ticker per leased shard,
// which an adaptive worker holding hundreds of trivial shards started and
// stopped hundreds of times a second, each start and stop a hand-off
// through the Go scheduler (issue 29's profile: ~30% of a worker's CPU
// in the scheduler) for a renewal that a trivial shard never reaches.
// The loop sleeps until the earliest renewal due, sends the ones due (a
// batching worker's couriers put them in one request), and ends when the
// worker holds no lease; the next Renewing starts it again.

// leaseKeeper is a worker's set of leases being renewed.
type leaseKeeper struct {
	mu      sync.Mutex
	held    map[*keptLease]struct{}
	running bool          // the loop is running
	until   time.Time     // when the sleeping loop wakes (zero: awake)
	wake    chan struct{} // buffered: wakes the loop early
}

// keptLease is one lease being renewed.
type keptLease struct {
	g      coordinator.LeaseGrant
	ctx    context.Context // ends the renewals when done
	cancel context.CancelFunc
	every  time.Duration
	due    time.Time // the next renewal
	busy   bool      // a renewal is in flight
	// inflight counts the renewal in flight (0 or 1); Add only while
	// the lease is in held, under mu, so release can wait for it.
	inflight sync.WaitGroup
}

// Renewing keeps g's lease alive while work on it runs: it returns a
// context that ends when ctx does, when timeout (if > 0) passes or when the
// coordinator says the lease is gone, and a stop function that ends the
// renewals and waits for one in flight. Call stop before reporting.
func (w *Worker) Renewing(ctx context.Context, g coordinator.LeaseGrant, timeout time.Duration) (context.Context, func()) {
	runCtx, cancel := context.WithCancel(ctx)
	if timeout > 0 {
		runCtx, cancel = context.WithTimeout(ctx, timeout)
	}
	ttl := time.Until(time.UnixMilli(g.Expiry))
	k := &keptLease{g: g, ctx: runCtx, cancel: cancel, every: max(ttl/3, 100*time.Millisecond)}
	k.due = time.Now().Add(k.every)
	w.keeper.add(w, k)
	return runCtx, func() {
		cancel()
		w.keeper.release(k)
	}
}

func (kp *leaseKeeper) add(w *Worker, k *keptLease) {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if kp.held == nil {
		kp.held = map[*keptLease]struct{}{}
		kp.wake = make(chan struct{}, 1)
	}
	kp.held[k] = struct{}{}
	switch {
	case !kp.running:
		kp.running = true
		go kp.loop(w)
	case !kp.until.IsZero() && k.due.Before(kp.until):
		kp.nudge()
	}
}

// release stops renewing k and waits for its renewal in flight, if any.
func (kp *leaseKeeper) release(k *keptLease) {
	kp.mu.Lock()
	delete(kp.held, k)
	kp.mu.Unlock()
	k.inflight.Wait()
}

// nudge wakes the sleeping loop (called with mu held).
func (kp *leaseKeeper) nudge() {
	select {
	case kp.wake <- struct{}{}:
	default:
	}
}

// loop renews the held leases as they fall due, until none is held.
func (kp *leaseKeeper) loop(w *Worker) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		kp.mu.Lock()
		if len(kp.held) == 0 {
			kp.running = false
			kp.mu.Unlock()
			return
		}
		now := time.Now()
		next := now.Add(time.Hour)
		var due []*keptLease
		for k := range kp.held {
			switch {
			case k.ctx.Err() != nil:
				delete(kp.held, k) // its work ended; stop will find it gone
			case k.busy:
				// Its renewal in flight wakes the loop when it is done.
			case !k.due.After(now):
				k.busy = true
				k.due = now.Add(k.every)
				k.inflight.Add(1)
				due = append(due, k)
			case k.due.Before(next):
				next = k.due
			}
		}
		kp.until = next
		kp.mu.Unlock()
		for _, k := range due {
			go kp.renew(w, k)
		}
		timer.Reset(time.Until(next))
		select {
		case <-timer.C:
		case <-kp.wake:
		}
		kp.mu.Lock()
		kp.until = time.Time{}
		kp.mu.Unlock()
	}
}

// renew sends one renewal of k; if the coordinator says the lease is
// gone, k's work is cancelled (someone else has the shard) and it is
// renewed no more. A renewal no node answered in time changes nothing.
func (kp *leaseKeeper) renew(w *Worker, k *keptLease) {
	defer k.inflight.Done()
	rctx, cancel := context.WithTimeout(k.ctx, k.every)
	err := w.renewOne(rctx, api.RenewRequest{Job: k.g.Job, Shard: k.g.Shard})
	cancel()
	lost := false
	// Only the coordinator's refusal ends the lease here. A renewal that
	// found no node in time (a loaded machine, an election) is tried
	// again when it next falls due; if the lease has lapsed meanwhile,
	// that renewal is refused and ends it.
	if ds, ok := diag.As(err); ok && !api.Transient(err) {
		w.logf("shard %d of %s: lease lost (%s); stopping it", k.g.Shard, k.g.Job.Short(), ds[0].Message)
		k.cancel()
		lost = true
	}
	kp.mu.Lock()
	defer kp.mu.Unlock()
	k.busy = false
	if _, held := kp.held[k]; !held {
		return
	}
	if lost {
		delete(kp.held, k)
		return
	}
	if !kp.until.IsZero() && k.due.Before(kp.until) {
		kp.nudge()
	}
}
