package pool

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"runtime"
	"sync"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/verify"
)

// Local is the pool of one.
type Local struct {
	// Workers is how many shards run at once; 0 means one per CPU.
	Workers int
	// Verify executes every shard twice and compares the result bytes: a
	// replayable-tier check that flags non-deterministic content.
	Verify bool
	// Progress, if set, is called after each shard (from one goroutine at a time).
	Progress func(Event)

	// execute runs one shard; tests replace it to simulate a
	// non-deterministic executor, which sandboxed content cannot be.
	execute func(*job.Plan, context.Context, job.Shard) (*job.Result, error)
}

var _ Executor = (*Local)(nil)

// Run executes every shard, verifies when asked, and reduces. The first
// shard error stops the run; all non-determinism findings are reported
// together.
func (l *Local) Run(ctx context.Context, p *job.Plan) (*Outcome, error) {
	workers := l.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = min(workers, len(p.Shards))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	results := make([]*job.Result, len(p.Shards))
	var (
		mu       sync.Mutex
		firstErr error
		mismatch diag.List
		done     int
	)
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r, err := l.runShard(ctx, p, p.Shards[i])
				mu.Lock()
				switch {
				case err != nil:
					if ds, ok := diag.As(err); ok && ds[0].Code == diag.NonDeterministic {
						mismatch = append(mismatch, ds...)
					} else if firstErr == nil {
						firstErr = err
						cancel()
					}
				default:
					results[i] = r
				}
				done++
				if l.Progress != nil && firstErr == nil {
					l.Progress(Event{Done: done, Total: len(p.Shards), Shard: i, Result: results[i]})
				}
				mu.Unlock()
			}
		}()
	}
feed:
	for i := range p.Shards {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(mismatch) > 0 {
		return nil, mismatch
	}
	reduced, err := p.Reduce(ctx, results)
	if err != nil {
		return nil, err
	}
	method := "single execution (pool of one)"
	switch {
	case p.FreivaldsRounds() > 0:
		method = fmt.Sprintf("single execution, %s", verify.MethodFreivalds(p.FreivaldsRounds()))
	case l.Verify && p.Tier() == verify.Convergent:
		method = fmt.Sprintf("double execution, within tolerance (%s)", p.Tolerance())
	case l.Verify:
		method = "double execution, byte-identical"
	}
	return &Outcome{Results: results, Reduced: reduced, Method: method}, nil
}

func (l *Local) runShard(ctx context.Context, p *job.Plan, sh job.Shard) (*job.Result, error) {
	execute := l.execute
	if execute == nil {
		execute = (*job.Plan).Execute
	}
	r, err := execute(p, ctx, sh)
	if err != nil {
		return nil, err
	}
	if p.FreivaldsRounds() > 0 {
		// The job declared the check: a pool of one runs it too, with
		// randomness the program cannot see (crypto/rand).
		ok, err := p.CheckProduct(ctx, sh, r, rand.Reader)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, diag.New(diag.NonDeterministic, fmt.Sprintf("shard %d", sh.Index),
				"shard %d's result fails its %d-round Freivalds check", sh.Index, p.FreivaldsRounds()).
				WithHelp("the program's run and verify disagree on the product: check that verify rebuilds the same factors as run")
		}
		return r, nil
	}
	if !l.Verify {
		return r, nil
	}
	again, err := execute(p, ctx, sh)
	if err != nil {
		return nil, err
	}
	if p.Tier() == verify.Convergent {
		c, err := p.Compare(ctx, sh, r, again)
		if err != nil {
			return nil, err
		}
		if !c.Within {
			return nil, diag.New(diag.NonDeterministic, fmt.Sprintf("shard %d", sh.Index),
				"two executions of shard %d differ beyond the tolerance (%s) at %s: %s", sh.Index, p.Tolerance(), c.Where, c.Reason).
				WithHelp("widen the job's verification.tolerance, or make the program's fast path agree more closely")
		}
		return r, nil
	}
	if !bytes.Equal(r.Bytes, again.Bytes) {
		return nil, diag.New(diag.NonDeterministic, fmt.Sprintf("shard %d", sh.Index),
			"two executions of shard %d (params %v) gave different results (%s vs %s)",
			sh.Index, sh.Params, r.Hash.Short(), again.Hash.Short()).
			WithHelp("program %q is not deterministic: draw randomness from the rng module, which is seeded from the shard", p.Program.Name)
	}
	return r, nil
}
