package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
)

// Client is the typed control-plane client used by the CLI, workers and
// silos. It knows every aggregator's address, follows redirects to the
// leader, and retries on connection failures and elections until its
// context ends. Every write it retries is idempotent on the server.
//
// A node that stops answering without closing its connections (a
// black-holed link, a frozen process) costs one attempt's deadline, not the
// whole operation: each attempt has its own deadline (AttemptTimeout,
// doubled after every attempt that timed out so a slow but live node is
// still served), and a node that timed out or refused is avoided for a
// while in favour of nodes that answer.
type Client struct {
	http      *http.Client
	endpoints []string

	// AttemptTimeout is the first attempt's deadline (default 4s); it
	// doubles after each attempt that timed out, up to the operation's
	// own deadline.
	AttemptTimeout time.Duration
	// GiveUpAfter, when positive, ends an operation with an SC7103
	// diagnostic once it has run this long without any node answering at
	// all (the CLI; daemons leave it zero and retry until their context
	// ends).
	GiveUpAfter time.Duration

	// Log, when set, receives each failed attempt at Debug level (which
	// node, what it said, what follows): a daemon at log_level debug says
	// why it keeps retrying.
	Log *slog.Logger

	mu      sync.Mutex
	current int
	avoid   map[int]time.Time // endpoint index → avoided until

	discovered sync.Once
}

// avoidFor is how long a node that timed out or refused a connection is
// passed over while another node is not.
const avoidFor = 15 * time.Second

// maxHops bounds the redirects followed back to back, without a pause (a
// leader that moves while the client chases it).
const maxHops = 3

// NewClient returns a client authenticating as id to the aggregators of fed.
func NewClient(id *identity.Identity, fed *identity.Federation) (*Client, error) {
	tlsCfg, err := identity.ClientTLSConfig(id, fed, "", identity.Aggregator)
	if err != nil {
		return nil, err
	}
	var eps []string
	for _, m := range fed.ByRole(identity.Aggregator) {
		eps = append(eps, "https://"+m.Address)
	}
	if len(eps) == 0 {
		return nil, errors.New("api: the federation has no aggregator")
	}
	return NewClientTLS(Transport(tlsCfg), eps), nil
}

// NewClientTLS returns a client over a prepared transport (tests).
func NewClientTLS(tr http.RoundTripper, endpoints []string) *Client {
	return &Client{
		http: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			// Redirects to the leader are followed by do, which gives the
			// leader its own attempt and passes over a leader that does
			// not answer.
			return http.ErrUseLastResponse
		}},
		endpoints: endpoints,
		avoid:     map[int]time.Time{},
	}
}

// Endpoints returns the aggregator base URLs.
func (c *Client) Endpoints() []string { return c.endpoints }

func (c *Client) attemptTimeout() time.Duration {
	if c.AttemptTimeout > 0 {
		return c.AttemptTimeout
	}
	return 4 * time.Second
}

// endpoint returns the node to try next: the current one unless it is
// being avoided and some other node is not.
func (c *Client) endpoint() (string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	n := len(c.endpoints)
	for k := 0; k < n; k++ {
		i := (c.current + k) % n
		if until, ok := c.avoid[i]; !ok || now.After(until) {
			c.current = i
			return c.endpoints[i], i
		}
	}
	i := c.current % n
	return c.endpoints[i], i
}

// rotate moves on from endpoint from (if no other call already did).
func (c *Client) rotate(from int) {
	c.mu.Lock()
	if c.current%len(c.endpoints) == from {
		c.current = from + 1
	}
	c.mu.Unlock()
}

// shun avoids endpoint i for a while and moves on from it.
func (c *Client) shun(i int) {
	c.mu.Lock()
	c.avoid[i] = time.Now().Add(avoidFor)
	c.mu.Unlock()
	c.rotate(i)
}

// answered clears an endpoint's avoidance: it answered.
func (c *Client) answered(i int) {
	c.mu.Lock()
	delete(c.avoid, i)
	c.mu.Unlock()
}

// follow makes the node a redirect names the current one and reports
// whether it did. A node being avoided is followed only when force is set
// (every other node pointed at it too).
func (c *Client) follow(location string, force bool) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.endpoints {
		if location == e || strings.HasPrefix(location, e+"/") {
			if until, ok := c.avoid[i]; ok && time.Now().Before(until) && !force {
				return i, false
			}
			c.current = i
			return i, true
		}
	}
	return -1, false
}

// retryable reports whether err is worth another try at another node.
func retryable(err error) bool {
	if handshakeErr(err) {
		// A refused handshake will be refused again: the key is not a member.
		return false
	}
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &ne) || errors.As(err, &oe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) ||
		strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "connection refused")
}

// retryableDiag reports whether a node's refusal means "ask again, here
// or elsewhere": no leader yet, or a node cut off from the cluster.
func retryableDiag(ds diag.List) bool {
	return ds[0].Code == diag.PoolNoLeader || ds[0].Code == diag.PoolStaleRead
}

// Transient reports whether err says nothing about the request itself:
// no node answered within its time, no leader yet, a node cut off from
// the cluster, or one too busy. The same request may succeed later; a
// refusal by the replicated state (a lease not live, an unknown job) is
// not transient.
func Transient(err error) bool {
	ds, ok := diag.As(err)
	if !ok {
		return err != nil
	}
	return retryableDiag(ds) || ds[0].Code == diag.PoolBusy
}

// unreachable is the diagnostic for an operation during which no node
// answered at all.
func (c *Client) unreachable(errs map[int]error) error {
	var parts []string
	for i, e := range c.endpoints {
		if err, ok := errs[i]; ok {
			parts = append(parts, fmt.Sprintf("%s: %v", strings.TrimPrefix(e, "https://"), err))
		} else {
			parts = append(parts, strings.TrimPrefix(e, "https://")+": not tried")
		}
	}
	if refused(errs) {
		return diag.New(diag.MemberRefused, "cluster", "the aggregators refused this member's key at the TLS handshake (%s)", strings.Join(parts, "; ")).
			WithHelp("this key is not (or no longer) a member: it was revoked, rotated to a new key, or never added; an operator can add it (scellis federation add)")
	}
	return diag.New(diag.PoolNoLeader, "cluster", "no aggregator answered (%s)", strings.Join(parts, "; ")).
		WithHelp("check that the aggregators are running and reachable from here (scellis aggregator status), and that the federation file lists their current addresses")
}

// handshakeErr reports a TLS handshake that failed: a key refused by the
// node (bad_certificate) or the node's key not pinned here.
func handshakeErr(err error) bool {
	return strings.Contains(err.Error(), "tls: ") || strings.Contains(err.Error(), "certificate") || errors.Is(err, identity.ErrUnknownPeer)
}

func all(errs map[int]error, f func(error) bool) bool {
	for _, err := range errs {
		if !f(err) {
			return false
		}
	}
	return true
}

// refused reports whether every node that was tried refused this client's
// certificate (a bad_certificate alert): the key is not a member.
func refused(errs map[int]error) bool {
	for _, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "tls: bad certificate") {
			return false
		}
	}
	return len(errs) > 0
}

// do sends one request, retrying across nodes and elections.
func (c *Client) do(ctx context.Context, method, path string, body any, out any) error {
	return c.exchange(ctx, method, path, body, out, nil)
}

// exchange is do, also recording in info (if not nil) where a read was
// answered and how fresh it was.
func (c *Client) exchange(ctx context.Context, method, path string, body any, out any, info *ReadInfo) error {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return err
		}
	}
	c.discover(ctx)
	at := c.newAttempts()
	if hold, ok := ctx.Value(holdKey{}).(time.Duration); ok {
		at.timeout += hold // the server may hold the request this long on purpose
	}
	next := -1 // the node a redirect named, tried next even if avoided
	for {
		base, idx := c.endpoint()
		if next >= 0 {
			base, idx, next = c.endpoints[next], next, -1
		}
		var resp *http.Response
		err := at.try(ctx, func(actx context.Context, _ func()) error {
			req, err := http.NewRequestWithContext(actx, method, base+path, bytes.NewReader(payload))
			if err != nil {
				return err
			}
			if body != nil {
				req.Header.Set("Content-Type", "application/json")
			}
			if resp, err = c.http.Do(req); err != nil {
				return err
			}
			if resp.StatusCode == http.StatusTemporaryRedirect {
				resp.Body.Close()
				return nil
			}
			if info != nil {
				*info = readInfoOf(resp.Header)
			}
			return readResponse(resp, out)
		})
		if resp != nil && resp.StatusCode == http.StatusTemporaryRedirect && err == nil {
			at.answered(idx)
			at.leaderless = false
			// The node knows the leader: go there at once. A leader that
			// did not answer lately is followed only once every node
			// points at it; until then ask the others who leads.
			if at.hops < maxHops {
				if i, ok := c.follow(resp.Header.Get("Location"), at.pointedAtAvoided >= len(c.endpoints)); ok {
					at.hops++
					next = i
					continue
				}
			}
			at.pointedAtAvoided++
			err = diag.New(diag.PoolNoLeader, "cluster", "%s redirects to the leader %s, which does not answer",
				strings.TrimPrefix(base, "https://"), resp.Header.Get("X-Scellis-Leader"))
		}
		if err == nil {
			return nil
		}
		if done, ferr := at.failed(ctx, idx, resp != nil, err); done {
			return ferr
		}
	}
}

// discover, before a client's first control-plane call, asks every node
// for its status at once and starts with the one that answers as leader,
// or else the first that answers at all, so neither a silent node listed
// first nor a follower's redirect costs the first call anything.
func (c *Client) discover(ctx context.Context) {
	c.discovered.Do(func() {
		if len(c.endpoints) < 2 {
			return
		}
		ctx, cancel := context.WithTimeout(ctx, c.attemptTimeout())
		defer cancel()
		type answer struct {
			i      int
			leader bool
		}
		answers := make(chan answer, len(c.endpoints))
		for i, e := range c.endpoints {
			go func() {
				raw, err := c.StatusOf(ctx, e)
				var st struct {
					Raft struct{ State string } `json:"raft"`
				}
				if err != nil || json.Unmarshal(raw, &st) != nil {
					answers <- answer{i: -1}
					return
				}
				answers <- answer{i, st.Raft.State == "leader"}
			}()
		}
		first := -1
		var grace <-chan time.Time
	wait:
		for pending := len(c.endpoints); pending > 0; {
			select {
			case a := <-answers:
				pending--
				if a.i < 0 {
					continue
				}
				if a.leader {
					first = a.i
					break wait
				}
				if first < 0 {
					first = a.i
					// A follower answered: give the leader a moment to.
					grace = time.After(c.attemptTimeout() / 20)
				}
			case <-grace:
				break wait
			case <-ctx.Done():
				break wait
			}
		}
		if first >= 0 {
			c.mu.Lock()
			c.current = first
			c.mu.Unlock()
		}
	})
}

// attempts is the retry state of one operation.
type attempts struct {
	c         *Client
	start     time.Time
	timeout   time.Duration // the next attempt's deadline
	backoff   time.Duration
	timedOut  map[int]bool // nodes that timed out at the current deadline
	errs      map[int]error
	anyAnswer bool
	// leaderless: the last node that answered knew no leader (SC7103 or
	// SC7107): a majority may be down, which no retry by this client fixes.
	leaderless       bool
	lastErr          error
	timedOutNow      bool
	hops             int
	pointedAtAvoided int
}

func (c *Client) newAttempts() *attempts {
	return &attempts{c: c, start: time.Now(), timeout: c.attemptTimeout(), backoff: 50 * time.Millisecond,
		timedOut: map[int]bool{}, errs: map[int]error{}}
}

// try runs one attempt under its own deadline. The deadline is a
// watchdog: fn may call kick whenever bytes move (a large blob on a slow
// link), which restarts it; a silent node never kicks. fn must finish
// reading the response before it returns.
func (at *attempts) try(ctx context.Context, fn func(actx context.Context, kick func()) error) error {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	d := at.timeout
	var fired atomic.Bool
	t := time.AfterFunc(d, func() { fired.Store(true); cancel() })
	defer t.Stop()
	err := fn(actx, func() { t.Reset(d) })
	at.timedOutNow = err != nil && fired.Load() && ctx.Err() == nil
	return err
}

// progress calls kick whenever bytes pass through it.
type progress struct {
	r    io.Reader
	kick func()
}

func (p progress) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.kick()
	}
	return n, err
}

type progressBody struct {
	progress
	io.Closer
}

// answered records that node i answered (whatever it said).
func (at *attempts) answered(i int) {
	at.anyAnswer = true
	at.c.answered(i)
}

// failed decides what follows a failed attempt at node i (answered: the
// node sent a response). It returns done and the error to return, or waits
// as needed and returns false to try again.
func (at *attempts) failed(ctx context.Context, i int, answered bool, err error) (bool, error) {
	c := at.c
	if answered {
		at.answered(i)
	}
	if c.Log != nil && ctx.Err() == nil {
		c.Log.Debug("attempt failed", "node", strings.TrimPrefix(c.endpoints[i], "https://"), "answered", answered, "err", err)
	}
	if ctx.Err() != nil {
		return true, at.final(ctx, err)
	}
	at.lastErr = err
	switch ds, isDiag := diag.As(err); {
	case isDiag && !retryableDiag(ds):
		return true, err
	case isDiag:
		at.leaderless = true
		c.rotate(i)
	case at.timedOutNow:
		// Silent: no answer within the attempt's deadline. Pass the node
		// over at once; lengthen the deadline once every node has been
		// silent at it, or when the operation comes back to a node that
		// already was (the leader, whom every follower names): it may be
		// merely slow — planning a large job, say — and must get the time.
		at.errs[i] = fmt.Errorf("no answer within %v", at.timeout)
		c.shun(i)
		again := at.timedOut[i]
		at.timedOut[i] = true
		if again || len(at.timedOut) >= len(c.endpoints) {
			at.timeout = min(2*at.timeout, time.Minute)
			clear(at.timedOut)
		}
		if at.giveUp() {
			return true, c.unreachable(at.errs)
		}
		at.hops = 0
		return false, nil
	case handshakeErr(err):
		// One node's handshake failing may be a membership change not
		// yet applied everywhere (an aggregator's rotated key): ask the
		// others. Once every node refused, retrying cannot help.
		at.errs[i] = err
		c.shun(i)
		if len(at.errs) == len(c.endpoints) && all(at.errs, handshakeErr) {
			if refused(at.errs) {
				return true, c.unreachable(at.errs)
			}
			return true, err
		}
	case retryable(err):
		at.errs[i] = err
		c.shun(i)
	default:
		return true, err
	}
	if at.giveUp() {
		if at.anyAnswer {
			return true, at.noLeader()
		}
		return true, c.unreachable(at.errs)
	}
	select {
	case <-ctx.Done():
		return true, at.final(ctx, err)
	case <-time.After(at.backoff):
	}
	at.backoff = min(at.backoff*2, time.Second)
	at.hops = 0
	return false, nil
}

// giveUp reports whether, for GiveUpAfter, no node has answered, or the
// nodes that answered knew no leader: a CLI command then says the pool is
// unreachable (SC7103) instead of retrying until its own deadline.
func (at *attempts) giveUp() bool {
	return (!at.anyAnswer || at.leaderless) && at.c.GiveUpAfter > 0 && time.Since(at.start) >= at.c.GiveUpAfter
}

// noLeader is the diagnostic of an operation the answering nodes could not
// serve for want of a leader.
func (at *attempts) noLeader() error {
	last := "no leader known"
	if ds, ok := diag.As(at.lastErr); ok {
		last = ds[0].Message
	}
	return diag.New(diag.PoolNoLeader, "cluster", "no aggregator that answered knows a leader after %v (%s)", at.c.GiveUpAfter.Round(time.Second), last).
		WithHelp("a majority of the aggregators is down or cut off from the rest: nothing can be written or read fresh until it is back (scellis aggregator status on each)")
}

// final is the error of an operation whose context ended.
func (at *attempts) final(ctx context.Context, err error) error {
	if !at.anyAnswer {
		return at.c.unreachable(at.errs)
	}
	if at.lastErr == nil {
		at.lastErr = err
	}
	if ds, ok := diag.As(at.lastErr); ok {
		// The cluster answered but could not serve: say what it said.
		return ds
	}
	return fmt.Errorf("%w (last error: %v)", ctx.Err(), at.lastErr)
}

// maxResponse bounds a response body unless the request's context says
// otherwise (responseLimitKey: a model file, which can outgrow it).
const maxResponse = 64 << 20

type responseLimitKey struct{}

func readResponse(resp *http.Response, out any) error {
	defer resp.Body.Close()
	limit, larger := resp.Request.Context().Value(responseLimitKey{}).(int64)
	if !larger {
		limit = maxResponse
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return err
	}
	if larger && int64(len(b)) > limit {
		return fmt.Errorf("%s %s: the response is larger than %d MiB", resp.Request.Method, resp.Request.URL.Path, limit>>20)
	}
	if !larger && int64(len(b)) > limit {
		b = b[:limit] // as before: a reply cut at the bound fails to decode
	}
	if resp.StatusCode >= 300 {
		var d struct{ Diagnostics diag.List }
		if json.Unmarshal(b, &d) == nil && len(d.Diagnostics) > 0 {
			return d.Diagnostics
		}
		return fmt.Errorf("%s %s: %s: %s", resp.Request.Method, resp.Request.URL.Path, resp.Status, bytes.TrimSpace(b))
	}
	if out == nil {
		return nil
	}
	if raw, ok := out.(*[]byte); ok {
		*raw = b
		return nil
	}
	return json.Unmarshal(b, out)
}

// Submit submits a job bundle (already uploaded with PutBlob).
func (c *Client) Submit(ctx context.Context, bundle content.Ref) (coordinator.SubmitResponse, error) {
	var r coordinator.SubmitResponse
	return r, c.do(ctx, "POST", "/v1/jobs", SubmitRequest{Bundle: bundle}, &r)
}

// Job returns a job's status with per-shard detail.
func (c *Client) Job(ctx context.Context, id content.Ref) (coordinator.JobStatus, error) {
	var r coordinator.JobStatus
	return r, c.do(ctx, "GET", "/v1/jobs/"+string(id), nil, &r)
}

// JobNow returns a job's status through a linearizable read: the leader
// answers once it has confirmed its leadership and applied every write
// committed before the call, so the status is never older than the call.
func (c *Client) JobNow(ctx context.Context, id content.Ref) (coordinator.JobStatus, ReadInfo, error) {
	var r coordinator.JobStatus
	var info ReadInfo
	return r, info, c.exchange(ctx, "GET", "/v1/jobs/"+string(id)+"?consistent=true", nil, &r, &info)
}

// RunNow returns a training run through a linearizable read (see JobNow).
func (c *Client) RunNow(ctx context.Context, id content.Ref) (coordinator.RunStatus, ReadInfo, error) {
	var r coordinator.RunStatus
	var info ReadInfo
	return r, info, c.exchange(ctx, "GET", "/v1/runs/"+string(id)+"?consistent=true", nil, &r, &info)
}

// readInfoOf reads the freshness headers of a read's answer.
func readInfoOf(h http.Header) ReadInfo {
	info := ReadInfo{Node: h.Get("X-Scellis-Node"), LeaderContactMs: -1, Linearizable: h.Get("X-Scellis-Linearizable") == "true"}
	info.AppliedIndex, _ = strconv.ParseUint(h.Get("X-Scellis-Applied-Index"), 10, 64)
	if v, err := strconv.ParseInt(h.Get("X-Scellis-Leader-Contact-Ms"), 10, 64); err == nil {
		info.LeaderContactMs = v
	}
	return info
}

// Jobs lists every job.
func (c *Client) Jobs(ctx context.Context) ([]coordinator.JobStatus, error) {
	var r []coordinator.JobStatus
	return r, c.do(ctx, "GET", "/v1/jobs", nil, &r)
}

// StartRun launches a training run whose canonical spec (and strategy
// source, if not built in) is already uploaded with PutBlob.
func (c *Client) StartRun(ctx context.Context, req RunRequest) (coordinator.StartRunResponse, error) {
	var r coordinator.StartRunResponse
	return r, c.do(ctx, "POST", "/v1/runs", req, &r)
}

// Runs lists every training run.
func (c *Client) Runs(ctx context.Context) ([]coordinator.RunStatus, error) {
	var r []coordinator.RunStatus
	return r, c.do(ctx, "GET", "/v1/runs", nil, &r)
}

// Run returns one training run: its rounds' jobs and models.
func (c *Client) Run(ctx context.Context, id content.Ref) (coordinator.RunStatus, error) {
	var r coordinator.RunStatus
	return r, c.do(ctx, "GET", "/v1/runs/"+string(id), nil, &r)
}

// Lease asks for work.
func (c *Client) Lease(ctx context.Context, req LeaseRequest) (coordinator.LeaseResponse, error) {
	var r coordinator.LeaseResponse
	if req.WaitMS > 0 {
		ctx = context.WithValue(ctx, holdKey{}, time.Duration(min(req.WaitMS, int(maxLeaseWait.Milliseconds())))*time.Millisecond)
	}
	return r, c.do(ctx, "POST", "/v1/lease", req, &r)
}

// holdKey carries how long the server may hold a request (a long poll):
// its attempts' deadlines are that much longer.
type holdKey struct{}

// Renew extends a lease.
func (c *Client) Renew(ctx context.Context, req RenewRequest) (coordinator.RenewResponse, error) {
	var r coordinator.RenewResponse
	return r, c.do(ctx, "POST", "/v1/renew", req, &r)
}

// Release hands back leases.
func (c *Client) Release(ctx context.Context, req ReleaseRequest) error {
	return c.do(ctx, "POST", "/v1/release", req, nil)
}

// Report reports a result hash.
func (c *Client) Report(ctx context.Context, req ResultReport) (coordinator.ReportResponse, error) {
	var r coordinator.ReportResponse
	return r, c.do(ctx, "POST", "/v1/results", req, &r)
}

// Peers returns every peer's record: leases, reports, wins, losses and
// timeouts.
func (c *Client) Peers(ctx context.Context) ([]coordinator.PeerRecord, error) {
	var r []coordinator.PeerRecord
	return r, c.do(ctx, "GET", "/v1/peers", nil, &r)
}

// Readmit lifts the exclusion of a peer caught by repeated failed checks
// (operators only).
func (c *Client) Readmit(ctx context.Context, peer string) (coordinator.ReadmitResponse, error) {
	var r coordinator.ReadmitResponse
	return r, c.do(ctx, "POST", "/v1/peers/"+url.PathEscape(peer)+"/readmit", struct{}{}, &r)
}

// Commit commits the caller to a result for one shard (workers and silos).
func (c *Client) Commit(ctx context.Context, req CommitRequest) (coordinator.CommitResponse, error) {
	var r coordinator.CommitResponse
	return r, c.do(ctx, "POST", "/v1/commits", req, &r)
}

// ReportReduced reports a reduced result (reducer peers only).
func (c *Client) ReportReduced(ctx context.Context, req ReducedReport) error {
	return c.do(ctx, "POST", "/v1/reduced", req, nil)
}

// Receipts returns receipts with sequence numbers above since.
func (c *Client) Receipts(ctx context.Context, since uint64) ([]receipt.Receipt, error) {
	var r []receipt.Receipt
	return r, c.do(ctx, "GET", fmt.Sprintf("/v1/receipts?since=%d", since), nil, &r)
}

// Contributions returns verified work units per peer.
func (c *Client) Contributions(ctx context.Context) (map[string]int64, error) {
	var r map[string]int64
	return r, c.do(ctx, "GET", "/v1/contributions", nil, &r)
}

// Status returns the answering node's status as JSON.
func (c *Client) Status(ctx context.Context) (json.RawMessage, error) {
	var r []byte
	err := c.do(ctx, "GET", "/v1/status", nil, &r)
	return r, err
}

// StatusOf returns one node's status, without failing over to another.
// A node that does not answer within one attempt's deadline is reported
// as such rather than holding the caller.
func (c *Client) StatusOf(ctx context.Context, base string) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, c.attemptTimeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/status", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	var r []byte
	return r, readResponse(resp, &r)
}

// PutBlob uploads bytes to the blob store and returns their ref.
func (c *Client) PutBlob(ctx context.Context, b []byte) (content.Ref, error) {
	ref := content.Hash(b)
	req := func(ctx context.Context, base string, kick func()) (*http.Request, error) {
		r, err := http.NewRequestWithContext(ctx, "PUT", base+"/blobs/"+string(ref), progress{bytes.NewReader(b), kick})
		if err == nil {
			r.ContentLength = int64(len(b))
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		}
		return r, err
	}
	return ref, c.blobDo(ctx, req, nil)
}

// PutBlobs uploads several blobs in one request (POST /blobs/batch) and
// returns their refs, in order; when it returns nil every blob is stored
// durably on the node that answered, as after PutBlob. The answer's refs
// are checked against the bytes' own hashes.
func (c *Client) PutBlobs(ctx context.Context, bs [][]byte) ([]content.Ref, error) {
	body, err := content.Encode(bs)
	if err != nil {
		return nil, err
	}
	req := func(ctx context.Context, base string, kick func()) (*http.Request, error) {
		r, err := http.NewRequestWithContext(ctx, "POST", base+"/blobs/batch", progress{bytes.NewReader(body), kick})
		if err == nil {
			r.ContentLength = int64(len(body))
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		}
		return r, err
	}
	var raw []byte
	if err := c.blobDo(ctx, req, &raw); err != nil {
		return nil, err
	}
	var out struct {
		Refs []content.Ref `json:"refs"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("blob batch answer: %w", err)
	}
	if len(out.Refs) != len(bs) {
		return nil, fmt.Errorf("blob batch: %d blobs sent, %d refs answered", len(bs), len(out.Refs))
	}
	for i, b := range bs {
		if want := content.Hash(b); out.Refs[i] != want {
			return nil, fmt.Errorf("blob batch: blob %d stored as %s, its bytes hash to %s", i, out.Refs[i].Short(), want.Short())
		}
	}
	return out.Refs, nil
}

// GetBlob fetches a blob and checks that it hashes to ref.
func (c *Client) GetBlob(ctx context.Context, ref content.Ref) ([]byte, error) {
	var b []byte
	req := func(ctx context.Context, base string, _ func()) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, "GET", base+"/blobs/"+string(ref), nil)
	}
	if err := c.blobDo(ctx, req, &b); err != nil {
		return nil, err
	}
	if content.Hash(b) != ref {
		return nil, fmt.Errorf("blob %s: received bytes hash to %s", ref.Short(), content.Hash(b).Short())
	}
	return b, nil
}

// blobDo sends a blob request to the current node, then to every other:
// blobs are not redirected to the leader, any node holding one may serve
// it. A node that answers "no" is believed for this call; a node that
// cannot be reached, or falls silent mid-transfer, is retried after the
// others.
func (c *Client) blobDo(ctx context.Context, mk func(ctx context.Context, base string, kick func()) (*http.Request, error), out *[]byte) error {
	at := c.newAttempts()
	saidNo := map[int]bool{}
	for {
		base, idx, ok := c.pick(saidNo)
		if !ok {
			return at.lastErr
		}
		answered := false
		err := at.try(ctx, func(actx context.Context, kick func()) error {
			req, err := mk(actx, base, kick)
			if err != nil {
				return err
			}
			resp, err := c.http.Do(req)
			if err != nil {
				return err
			}
			answered = true
			resp.Body = progressBody{progress{resp.Body, kick}, resp.Body}
			var raw []byte
			if err := readResponse(resp, &raw); err != nil {
				return err
			}
			if out != nil {
				*out = raw
			}
			return nil
		})
		if err == nil {
			c.answered(idx)
			return nil
		}
		if answered && !at.timedOutNow {
			// The node answered "no" (not here, refused): believe it and
			// ask the next.
			at.answered(idx)
			at.lastErr = err
			saidNo[idx] = true
			c.rotate(idx)
			continue
		}
		if !at.timedOutNow && !retryable(err) {
			return err
		}
		if done, ferr := at.failed(ctx, idx, false, err); done {
			return ferr
		}
	}
}

// pick returns the node to try next among those not in skip, preferring
// nodes not being avoided; false when every node is in skip.
func (c *Client) pick(skip map[int]bool) (string, int, bool) {
	base, idx := c.endpoint()
	if !skip[idx] {
		return base, idx, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	n := len(c.endpoints)
	fallback := -1
	for k := 1; k < n; k++ {
		i := (idx + k) % n
		if skip[i] {
			continue
		}
		if until, ok := c.avoid[i]; ok && now.Before(until) {
			if fallback < 0 {
				fallback = i
			}
			continue
		}
		return c.endpoints[i], i, true
	}
	if fallback >= 0 {
		return c.endpoints[fallback], fallback, true
	}
	return "", 0, false
}

// Event is one server-sent event of a job's stream.
type Event struct {
	Kind string
	Data json.RawMessage
}

// watchIdle is how long a job's event stream may stay silent before the
// client takes it for a dead link and reconnects (to another node if
// needed); the server sends a keep-alive every KeepAlive.
const watchIdle = 4 * KeepAlive

// KeepAlive is how often an idle event stream carries a keep-alive.
const KeepAlive = 5 * time.Second

// Watch streams a job's (or a training run's) events to fn until the job
// (run) completes, fn returns an error, or ctx ends. It reconnects (to another node if needed) when
// the stream breaks or falls silent; after a reconnect the first event is a fresh status.
func (c *Client) Watch(ctx context.Context, id content.Ref, fn func(Event) error) error {
	for {
		base, idx := c.endpoint()
		done, err := c.watchOnce(ctx, base, id, fn)
		if done || ctx.Err() != nil {
			return err
		}
		if ds, ok := diag.As(err); ok && !retryableDiag(ds) {
			return ds
		}
		if errors.Is(err, errRedirected) {
			// The node answered: the leader knows the job; go there.
		} else {
			c.shun(idx)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// errRedirected: a follower sent the watcher to the leader.
var errRedirected = errors.New("redirected to the leader")

func (c *Client) watchOnce(ctx context.Context, base string, id content.Ref, fn func(Event) error) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := time.AfterFunc(max(watchIdle, c.attemptTimeout()), cancel)
	defer idle.Stop()
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/jobs/"+string(id)+"/events", nil)
	if err != nil {
		return true, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTemporaryRedirect {
		// A follower that does not know the job yet: the leader does.
		// Un-avoid the leader so the next connection goes there; a silent
		// one is shunned again after watchIdle.
		if i, _ := c.follow(resp.Header.Get("Location"), true); i >= 0 {
			c.answered(i)
		}
		return false, errRedirected
	}
	if resp.StatusCode != http.StatusOK {
		return true, readResponse(resp, nil)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var ev Event
	for sc.Scan() {
		idle.Reset(max(watchIdle, c.attemptTimeout()))
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			ev.Kind = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.Data = json.RawMessage(strings.TrimPrefix(line, "data: "))
		case line == "" && ev.Kind != "":
			if err := fn(ev); err != nil {
				return true, err
			}
			if ev.Kind == "job-complete" || ev.Kind == "run-complete" || ev.Kind == "job-cancelled" {
				return true, nil
			}
			if ev.Kind == "status" {
				// A job's or a run's status: either is over when done; a
				// run also when stopped.
				var st struct {
					State string `json:"state"`
				}
				if json.Unmarshal(ev.Data, &st) == nil &&
					(st.State == string(coordinator.JobDone) || st.State == string(coordinator.RunStopped) || st.State == string(coordinator.JobCancelledState) ||
						st.State == string(coordinator.JobAbandoned) || st.State == string(coordinator.RunPaused)) {
					return true, nil
				}
			}
			ev = Event{}
		}
	}
	return false, sc.Err()
}

// Transport returns an HTTP transport for mutual TLS with cfg. Dials and
// handshakes are bounded, and an HTTP/2 connection that falls silent is
// pinged and dropped, so requests are not queued on a dead link.
func Transport(cfg *tls.Config) *http.Transport {
	return &http.Transport{
		TLSClientConfig:     cfg,
		MaxIdleConnsPerHost: 16,
		ForceAttemptHTTP2:   true,
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		HTTP2:               &http.HTTP2Config{SendPingTimeout: 5 * time.Second, PingTimeout: 3 * time.Second},
	}
}

// hedgeAfter is how long GetBlobFrom waits on one node before it asks the
// next as well.
const hedgeAfter = 500 * time.Millisecond

// GetBlobFrom fetches a blob from the first of bases that has it. Each
// node gets its own attempt; a node that says no (or fails) hands over to
// the next at once, and one that has not answered within hedgeAfter is
// joined by the next: a silent node in front of the one holding the blob
// (a data-plane upload sits on one node until it is reported) costs half
// a second, not one attempt's deadline. The first good copy wins.
func (c *Client) GetBlobFrom(ctx context.Context, bases []string, ref content.Ref) ([]byte, error) {
	if len(bases) == 0 {
		return nil, errors.New("no node to ask")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the slower asks stop once one copy is here
	type got struct {
		b   []byte
		err error
	}
	results := make(chan got, len(bases))
	started := 0
	startNext := func() {
		if started < len(bases) {
			base := bases[started]
			started++
			go func() {
				b, err := c.getBlobAt(ctx, base, ref)
				results <- got{b, err}
			}()
		}
	}
	startNext()
	hedge := time.NewTicker(hedgeAfter)
	defer hedge.Stop()
	var lastErr error
	for done := 0; done < len(bases); {
		select {
		case r := <-results:
			done++
			if r.err == nil {
				return r.b, nil
			}
			if ctx.Err() != nil {
				return nil, r.err
			}
			lastErr = r.err
			startNext()
		case <-hedge.C:
			startNext()
		}
	}
	return nil, lastErr
}

// getBlobAt fetches ref from one node, within one attempt.
func (c *Client) getBlobAt(ctx context.Context, base string, ref content.Ref) ([]byte, error) {
	at := c.newAttempts()
	var b []byte
	err := at.try(ctx, func(actx context.Context, kick func()) error {
		req, err := http.NewRequestWithContext(actx, "GET", base+"/blobs/"+string(ref), nil)
		if err != nil {
			return err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return err
		}
		resp.Body = progressBody{progress{resp.Body, kick}, resp.Body}
		return readResponse(resp, &b)
	})
	if err != nil {
		if at.timedOutNow && ctx.Err() == nil {
			err = fmt.Errorf("%s: no answer within %v", base, at.timeout)
		}
		return nil, err
	}
	if content.Hash(b) != ref {
		return nil, fmt.Errorf("%s served bytes that do not hash to %s", base, ref.Short())
	}
	return b, nil
}

// PutBlobsTo stores several blobs on one given node in one request (POST
// /blobs/batch), checking the refs it answers; nil once all are stored
// durably there. The deadline works as PutBlobTo's.
func (c *Client) PutBlobsTo(ctx context.Context, base string, bs [][]byte) error {
	body, err := content.Encode(bs)
	if err != nil {
		return err
	}
	at := c.newAttempts()
	err = at.try(ctx, func(actx context.Context, kick func()) error {
		req, err := http.NewRequestWithContext(actx, "POST", base+"/blobs/batch", progress{bytes.NewReader(body), kick})
		if err != nil {
			return err
		}
		req.ContentLength = int64(len(body))
		resp, err := c.http.Do(req)
		if err != nil {
			return err
		}
		var raw []byte
		if err := readResponse(resp, &raw); err != nil {
			return err
		}
		var out struct {
			Refs []content.Ref `json:"refs"`
		}
		if err := json.Unmarshal(raw, &out); err != nil || len(out.Refs) != len(bs) {
			return fmt.Errorf("%s: the blob batch's answer names %d of %d blobs (%v)", base, len(out.Refs), len(bs), err)
		}
		for i, b := range bs {
			if out.Refs[i] != content.Hash(b) {
				return fmt.Errorf("%s: blob %d of the batch stored as %s", base, i, out.Refs[i].Short())
			}
		}
		return nil
	})
	if err != nil && at.timedOutNow {
		return fmt.Errorf("%s: no answer within %v", base, at.timeout)
	}
	return err
}

// PutBlobTo stores a blob on one given node. The attempt's deadline is a
// watchdog on the upload's progress: a node that falls silent fails the
// call within AttemptTimeout, however large the blob.
func (c *Client) PutBlobTo(ctx context.Context, base string, b []byte) error {
	at := c.newAttempts()
	err := at.try(ctx, func(actx context.Context, kick func()) error {
		req, err := http.NewRequestWithContext(actx, "PUT", base+"/blobs/"+string(content.Hash(b)), progress{bytes.NewReader(b), kick})
		if err != nil {
			return err
		}
		req.ContentLength = int64(len(b))
		resp, err := c.http.Do(req)
		if err != nil {
			return err
		}
		return readResponse(resp, nil)
	})
	if err != nil && at.timedOutNow {
		return fmt.Errorf("%s: no answer within %v", base, at.timeout)
	}
	return err
}

// PostCBORTo posts body (canonical CBOR) to path on the node at base and
// returns its CBOR answer, in one attempt under ctx: the aggregators'
// calls to one another that are not blobs (a round's cross-check). A
// node's refusal with diagnostics is returned as the diag.List.
func (c *Client) PostCBORTo(ctx context.Context, base, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/cbor")
	req.ContentLength = int64(len(body))
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	var out []byte
	if err := readResponse(resp, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Join adds an aggregator member to the Raft voters.
func (c *Client) Join(ctx context.Context, member string) error {
	return c.do(ctx, "POST", "/v1/cluster/join", MemberRequest{Member: member}, nil)
}

// Leave removes an aggregator member from the Raft voters.
func (c *Client) Leave(ctx context.Context, member string) error {
	return c.do(ctx, "POST", "/v1/cluster/leave", MemberRequest{Member: member}, nil)
}

// ChangeMembership submits an operator's signed membership change.
func (c *Client) ChangeMembership(ctx context.Context, sc identity.SignedChange) (coordinator.MembershipResponse, error) {
	var r coordinator.MembershipResponse
	return r, c.do(ctx, "POST", "/v1/federation/changes", sc, &r)
}

// MembershipChanges returns the signed membership changes after the first
// after ones.
func (c *Client) MembershipChanges(ctx context.Context, after int) (ChangesResponse, error) {
	var r ChangesResponse
	return r, c.do(ctx, "GET", "/v1/federation/changes?after="+strconv.Itoa(after), nil, &r)
}

// Cancel cancels a job that has not been reduced.
func (c *Client) Cancel(ctx context.Context, id content.Ref, reason string) (coordinator.CancelResponse, error) {
	var r coordinator.CancelResponse
	return r, c.do(ctx, "POST", "/v1/jobs/"+string(id)+"/cancel", CancelRequest{Reason: reason}, &r)
}
