package pool

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Adaptive batching (Worker.Batch 0, the default). A worker's couriers
// already send what is ready: a lone result goes at once, results that
// finish while a request is in flight go together. What a fixed batch
// adds is leasing ahead, so that short shards do not each wait for a
// lease round trip and finish close enough together to share requests.
// Leasing ahead is only worth it while a shard's run is short against
// that round trip; a worker that leased long shards ahead would sit on
// them while other workers idle. So an adaptive worker keeps a queue of
// leased shards not yet run (running ones included) of
//
//	depth = Parallel + ⌊2 × Parallel × lease round trip / run⌋, at most maxAdaptiveDepth
//
// — enough to keep Parallel runs busy across two lease round trips, from
// its moving averages — and leases again when half of it is free. Shards
// being delivered (uploaded, committed, revealed) do not count: they wait
// on the pool, not on this worker, and counting them would feed the
// pool's latency back into the depth. At most maxAdaptiveHeld shards are
// held in all. Shards of seconds leased in milliseconds give depth =
// Parallel (as Batch 1); trivial shards give the maximum. Before the
// first shard is measured the depth is Parallel.

// maxAdaptiveDepth bounds an adaptive worker's queue of shards not yet run.
const maxAdaptiveDepth = 64

// maxAdaptiveHeld bounds the shards an adaptive worker holds at once:
// queued, running and being delivered.
const maxAdaptiveHeld = 4 * maxAdaptiveDepth

// pace keeps moving averages of a worker's shard runs and lease round
// trips, and its queue of leased shards not yet run. The averages are of
// logarithms (geometric), so a worker moving from long shards to trivial
// ones (or back) adapts within a few shards instead of dragging seconds
// through hundreds of samples.
type pace struct {
	queued atomic.Int32  // leased, not yet run (or running)
	ran1   chan struct{} // a queued shard has run (made by Run, buffered)

	mu         sync.Mutex
	run, lease float64 // log seconds, exponentially weighted
	ran, rtt   bool    // measured at least once
}

const paceWeight = 0.25 // of each new sample

func ewma(avg, x float64) float64 { return avg + paceWeight*(x-avg) }

func logSeconds(d time.Duration) float64 { return math.Log(max(d.Seconds(), 1e-6)) }

// dequeued takes a shard out of the queue: it has run, or will not.
func (p *pace) dequeued() {
	p.queued.Add(-1)
	select {
	case p.ran1 <- struct{}{}:
	default:
	}
}

// shard records one shard's run.
func (p *pace) shard(run time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ran {
		p.run, p.ran = logSeconds(run), true
		return
	}
	p.run = ewma(p.run, logSeconds(run))
}

// leased records one lease request's round trip that brought shards.
func (p *pace) leased(rtt time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.rtt {
		p.lease, p.rtt = logSeconds(rtt), true
		return
	}
	p.lease = ewma(p.lease, logSeconds(rtt))
}

// depth is how many shards not yet run a worker running parallel at once
// should keep leased.
func (p *pace) depth(parallel int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ran || !p.rtt {
		return parallel
	}
	extra := 2 * float64(parallel) * math.Exp(p.lease-p.run)
	return max(min(parallel+int(min(extra, maxAdaptiveDepth)), maxAdaptiveDepth), parallel)
}
