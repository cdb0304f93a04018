package aggregator

import (
	"context"
	"crypto/ecdh"
	"errors"
	"fmt"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/wire"
)

// runRound plans, hosts and reduces the next round of a run, as a
// sequence of phases over one roundRun (one file each):
//
//	plan → open → collect → unmask → reduce → record
//
// and driveRun goes on to the next round. Each phase says how the attempt
// ends by the error it returns (finish): the run stopped, the round
// retried, nothing to do until the next pass, or a plain error.
func (n *Node) runRound(ctx context.Context, st coordinator.RunStatus) error {
	rr := &roundRun{n: n, st: st, r: len(st.Models)}
	defer rr.close(ctx)
	return rr.finish(ctx, rr.run(ctx))
}

func (rr *roundRun) run(ctx context.Context) error {
	for _, phase := range []func(context.Context) error{rr.plan, rr.open, rr.collect, rr.unmask, rr.reduce, rr.record} {
		if err := phase(ctx); err != nil {
			return err
		}
	}
	return nil
}

// roundRun is one attempt at a run's round on the leader: what each phase
// learns and the phases after it use.
type roundRun struct {
	n  *Node
	st coordinator.RunStatus
	r  int // the round's number

	// plan
	rc          *runCtx
	spec        fl.RunSpec
	env         script.Env
	step        string
	trainRound  int
	strat       *fl.Strategy
	global      fl.Global
	gb          []byte              // the global model, encoded
	gref        content.Ref         // its hash
	prevModel   content.Ref         // the model the previous round stored
	std         *fl.Standardization // the run's standardisation so far
	dims        int                 // the update's length
	metricNames []string            // the metrics summed with it
	grid        int                 // the grid's fractional bits (0: none)
	clip        float64             // the range of each summed value
	members     []secagg.Member
	absentNames []string
	bundle      fl.RoundBundle
	parentKey   *ecdh.PrivateKey // a hierarchical round's (hier.go)

	// open
	bref, job content.Ref // the bundle's hash and the round job's ID
	opened    time.Time   // when the secure sum opened; zero before

	// collect, unmask, reduce
	recorded   bool              // the secure sum keeps its transcript (crosscheck.go)
	transcript *wire.Transcript  // and this is it
	check      <-chan crossCheck // a peer's recomputation of the round, once asked
	unmasked   time.Time         // when it was asked
	unchecked  string            // why a round of a cluster is not recorded
	checker    string            // the peer its masked inputs go to (crosscheck_forward.go)
	sum        *secagg.Result
	update     []float64
	metrics    map[string]float64
	next       fl.Global
}

// How a round attempt ends, told by the error its phase returns; any
// other error is returned as it is (the next pass, or leader, retries).
type (
	// roundStop stops the run: progress is impossible.
	roundStop struct{ reason string }
	// roundRetry retries the round (a failed attempt that may heal by
	// itself, retryRound); job is the attempt's round job, if submitted.
	roundRetry struct {
		job    content.Ref
		reason string
	}
	// roundFault retries the round after a failure the same inputs
	// repeat (retryFault).
	roundFault struct {
		job    content.Ref
		reason string
	}
	// roundHalt pauses the run at once, for a person to act (fl resume
	// once the cause is fixed): two nodes computed different outcomes of
	// the round (crosscheck.go), which retrying on the same nodes cannot
	// settle.
	roundHalt struct {
		job    content.Ref
		reason string
	}
)

func (e roundStop) Error() string  { return "stop the run: " + e.reason }
func (e roundRetry) Error() string { return "retry the round: " + e.reason }
func (e roundFault) Error() string { return "retry the round (fault): " + e.reason }
func (e roundHalt) Error() string  { return "pause the run: " + e.reason }

// errNextPass ends an attempt with nothing to do now: the next pass of
// the leader's duties looks at the run again.
var errNextPass = errors.New("nothing to do until the next pass")

func (rr *roundRun) stop(format string, args ...any) error {
	return roundStop{fmt.Sprintf(format, args...)}
}

func (rr *roundRun) retry(format string, args ...any) error {
	return roundRetry{rr.job, fmt.Sprintf(format, args...)}
}

// finish carries out how the attempt ended.
func (rr *roundRun) finish(ctx context.Context, err error) error {
	n := rr.n
	switch e := err.(type) {
	case roundStop:
		return n.stopRun(ctx, rr.st.ID, e.reason)
	case roundRetry:
		return n.retryRound(ctx, rr.st, e.job, true, e.reason)
	case roundFault:
		return n.retryFault(ctx, rr.st, e.job, e.reason)
	case roundHalt:
		return n.haltRound(ctx, rr.st, e.job, e.reason)
	}
	if err == errNextPass {
		return nil
	}
	return err
}

// close aborts the round's secure sum when leadership was lost (ctx
// ended): the round is restarted by the next leader; its sites learn at
// once that this one is lost.
func (rr *roundRun) close(ctx context.Context) {
	if !rr.opened.IsZero() && ctx.Err() != nil {
		rr.n.abortSum(&rr.bundle, "its host is no longer the leader")
	}
}
