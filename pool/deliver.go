package pool

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
)

// Deliver hands a result to the pool by commit–reveal (law 13): it commits
// to the result's hash under a fresh random nonce, uploads the bytes, and
// reveals the hash and nonce once the shard's reveal is open (the other
// replicas have committed, or the window of one lease TTL has passed),
// keeping the lease alive meanwhile. Early reveals are answered by the
// aggregator without a log entry; Deliver retries them every Poll. With
// NoCommit, or for a job of one replica, it reports the hash outright.
func (w *Worker) Deliver(ctx context.Context, g coordinator.LeaseGrant, data []byte, hash content.Ref) (coordinator.ReportResponse, error) {
	return w.DeliverWhen(ctx, g, data, hash, nil)
}

// DeliverWhen is Deliver with ready, when set, called once the bytes are
// uploaded and before the hash is reported; an error from it ends the
// delivery unreported. A caller that must make something durable before
// its report (a silo's outbox holds the signed record it reports) writes
// it while the bytes travel, instead of before sending them.
func (w *Worker) DeliverWhen(ctx context.Context, g coordinator.LeaseGrant, data []byte, hash content.Ref, ready func() error) (coordinator.ReportResponse, error) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := api.ResultReport{Job: g.Job, Shard: g.Shard, Result: hash}
	pol, known := w.policyOf(rctx, g.Job)
	var st *receipt.Statement
	if w.Identity != nil {
		// The signature binds the result to this peer, the shard and the
		// job's tier; the receipt keeps it (coordinator/signed.go). A
		// policy the pool could not tell is signed as replayable, the
		// tier of every job but a convergent one, which then refuses the
		// report (SC7305) and the shard is leased again. A batching
		// worker's courier signs the reports of each request together
		// (sendReports); any other signs each report here.
		s := coordinator.StatementOf(g.Job, g.Shard, hash, pol, w.Name)
		if w.batching() {
			st = &s
		} else {
			req.Sig = identity.Sign(w.Identity, identity.PurposeResult, s.Bytes())
		}
	}
	rep := outgoing{req: req, st: st}
	// A shard of a one-replica job is decided by its first report: there
	// is no second result to copy, and the pool takes the report outright.
	direct := w.NoCommit || (known && pol.Replicas == 1)
	if !direct {
		var nonce [coordinator.NonceBytes]byte
		if _, err := rand.Read(nonce[:]); err != nil {
			return coordinator.ReportResponse{}, err
		}
		if w.Name == "" {
			return coordinator.ReportResponse{}, fmt.Errorf("pool: a worker needs its member name to commit to results")
		}
		commit := coordinator.Commitment(hash, w.Name, g.Job, g.Shard, nonce[:])
		if _, err := w.commitOne(rctx, api.CommitRequest{Job: g.Job, Shard: g.Shard, Commitment: commit}); err != nil {
			return coordinator.ReportResponse{}, fmt.Errorf("committing: %w", err)
		}
		rep.req.Nonce = fmt.Sprintf("%x", nonce)
	}
	// https: the result went over HTTPS (too), so its report need not
	// race a second upload (report).
	_, https, err := w.putResult(rctx, data)
	if err != nil {
		return coordinator.ReportResponse{}, fmt.Errorf("uploading result: %w", err)
	}
	if ready != nil {
		if err := ready(); err != nil {
			return coordinator.ReportResponse{}, err
		}
	}
	if direct {
		return w.report(rctx, rep, data, &https)
	}
	// Wait for the reveal with the lease renewed, so the shard is not
	// leased to a third peer while the second is still computing.
	wctx, stop := w.Renewing(ctx, g, 0)
	defer stop()
	poll := w.Poll
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	// The other replicas usually commit within milliseconds (workers
	// lease the replicas of a shard at about the same time): the first
	// retries come soon and back off to poll, so a shard does not wait a
	// whole poll for a commitment that came just after its reveal. An
	// early reveal costs the pool no log entry.
	wait := min(earlyRevealRetry, poll)
	for {
		out, err := w.report(ctx, rep, data, &https)
		if ds, ok := diag.As(err); !ok || ds[0].Code != diag.PoolRevealEarly {
			return out, err
		}
		select {
		case <-ctx.Done():
			return coordinator.ReportResponse{}, ctx.Err()
		case <-wctx.Done():
			// The lease is gone (revoked by a decision, or capped): the
			// reveal is open now, or will be at the window's end.
		case <-time.After(wait):
		}
		wait = min(2*wait, poll)
	}
}

// earlyRevealRetry is the first pause before a reveal refused as early is
// sent again (doubling up to Worker.Poll).
const earlyRevealRetry = 20 * time.Millisecond

// DurableWithin bounds how long a report of a result moved over the data
// plane may go unanswered before the worker also uploads it over HTTPS
// and reports again (the first good answer wins). The node answering a
// report checks that the bytes are on a majority before it proposes the
// hash; when they sit only on a data-plane aggregator that is silent or
// cut off, that check waits on the silent node — and the worker with it —
// for the clients' attempt timeouts, several seconds each.
const DurableWithin = time.Second

// report reports req. When the bytes went over a data channel to the
// member's data-plane aggregator and that aggregator is cut off from the
// others (or died after the upload), the node answering cannot find them
// on a majority: it says so (SC BlobMissing), or it is still waiting on
// the cut-off node after DurableWithin. Then the result is uploaded again
// over HTTPS to the nodes that answer — the last fallback — and reported
// once more, racing the first report. Durability is unchanged: every
// report is accepted only once its bytes are on a majority. *https records
// that the bytes went over HTTPS, so the reveal polls of Deliver do not
// upload them again.
func (w *Worker) report(ctx context.Context, rep outgoing, data []byte, https *bool) (coordinator.ReportResponse, error) {
	if w.Blobs == nil || *https {
		return w.reportOne(ctx, rep)
	}
	req := rep.req
	type answer struct {
		out coordinator.ReportResponse
		err error
	}
	missing := func(err error) bool {
		ds, ok := diag.As(err)
		return ok && ds[0].Code == diag.BlobMissing
	}
	notDurable := func() {
		if nd, ok := w.Blobs.(interface{ NotDurable() }); ok {
			nd.NotDurable() // later blobs skip the cut-off path for a while
		}
	}
	// The first report runs to its end even when the HTTPS one wins (and
	// Deliver has returned): its verdict says whether the data-plane
	// aggregator is cut off (the bytes are missing) or was only slow to
	// answer. Reporting one result twice is harmless: the pool answers the
	// second from the first.
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	first := make(chan answer, 1)
	go func() {
		defer fcancel()
		out, err := w.reportOne(fctx, rep)
		first <- answer{out, err}
	}()
	bound := time.NewTimer(DurableWithin)
	defer bound.Stop()
	var why string
	select {
	case a := <-first:
		if !missing(a.err) {
			w.outraced.Store(0)
			return a.out, a.err
		}
		notDurable()
		first = nil // answered: only the HTTPS report is left
		why = "is not durable yet"
	case <-bound.C:
		why = fmt.Sprintf("is not reported durable within %v", DurableWithin)
	}
	w.logf("shard %d of %s: the result uploaded over the data plane %s; uploading it over https", req.Shard, req.Job.Short(), why)
	*https = true
	sctx, scancel := context.WithCancel(ctx)
	defer scancel() // the HTTPS report stops when the first one wins
	second := make(chan answer, 1)
	go func() {
		if _, err := w.Client.PutBlob(sctx, data); err != nil {
			second <- answer{err: fmt.Errorf("uploading result over https: %w", err)}
			return
		}
		out, err := w.reportOne(sctx, rep)
		second <- answer{out, err}
	}()
	var last answer
	for first != nil || second != nil {
		select {
		case a := <-first:
			first = nil
			if !missing(a.err) {
				w.outraced.Store(0)
				return a.out, a.err // durable after all (or a verdict on the report itself)
			}
			notDurable()
			last = a
		case a := <-second:
			second = nil
			if a.err == nil || first == nil {
				if first != nil {
					// The pool's verdict on the data-plane copy can take
					// the clients' attempt timeouts to come back; two
					// reports in a row won over HTTPS while it had not are
					// taken as the same sign.
					if a.err == nil && w.outraced.Add(1) >= 2 {
						w.outraced.Store(0)
						notDurable()
					}
					go func(first chan answer) {
						if a := <-first; missing(a.err) {
							notDurable()
						}
					}(first)
				}
				return a.out, a.err
			}
			last = a
		}
	}
	return last.out, last.err
}

// KnowPolicy tells the worker a job's verification policy, read by the
// caller with the job's status: Deliver then does not ask the pool for it
// again (a silo reads a round job's status when it leases its shard).
func (w *Worker) KnowPolicy(job content.Ref, p coordinator.Policy) { w.setPolicy(job, p) }

// setPolicy remembers a job's verification policy.
func (w *Worker) setPolicy(job content.Ref, p coordinator.Policy) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.policies == nil {
		w.policies = map[content.Ref]coordinator.Policy{}
	}
	w.policies[job] = p
}

// policyOf returns job's verification policy (how many agreeing peers its
// shards need, its tier), asking the pool once per job; false when it
// cannot tell (then Deliver commits, and cannot sign).
func (w *Worker) policyOf(ctx context.Context, job content.Ref) (coordinator.Policy, bool) {
	w.mu.Lock()
	p, ok := w.policies[job]
	w.mu.Unlock()
	if ok {
		return p, true
	}
	st, err := w.Client.Job(ctx, job)
	if err != nil {
		return coordinator.Policy{}, false
	}
	w.setPolicy(job, st.Policy)
	return st.Policy, true
}
