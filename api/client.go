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
	"net"
	"net/http"
	"strings"
	"sync"
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
type Client struct {
	http      *http.Client
	endpoints []string

	mu      sync.Mutex
	current int
}

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
	return &Client{http: &http.Client{Transport: tr}, endpoints: endpoints}
}

// Endpoints returns the aggregator base URLs.
func (c *Client) Endpoints() []string { return c.endpoints }

func (c *Client) endpoint() (string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endpoints[c.current%len(c.endpoints)], c.current
}

func (c *Client) rotate(from int) {
	c.mu.Lock()
	if c.current == from {
		c.current++
	}
	c.mu.Unlock()
}

// remember makes the node that answered (after a redirect) the current one.
func (c *Client) remember(url string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.endpoints {
		if strings.HasPrefix(url, e+"/") {
			c.current = i
			return
		}
	}
}

// retryable reports whether err is worth another try at another node.
func retryable(err error) bool {
	if strings.Contains(err.Error(), "tls: ") || strings.Contains(err.Error(), "certificate") {
		// A refused handshake will be refused again: the key is not a member.
		return false
	}
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &ne) || errors.As(err, &oe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "connection refused")
}

// do sends one request, retrying across nodes and elections.
func (c *Client) do(ctx context.Context, method, path string, body any, out any) error {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return err
		}
	}
	backoff := 50 * time.Millisecond
	var lastErr error
	for attempt := 0; ; attempt++ {
		base, idx := c.endpoint()
		req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(payload))
		if err != nil {
			return err
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := c.http.Do(req)
		if err == nil {
			c.remember(resp.Request.URL.String())
			err = readResponse(resp, out)
			if err == nil {
				return nil
			}
			if ds, ok := diag.As(err); ok && ds[0].Code != diag.PoolNoLeader {
				return err
			}
		}
		if ctx.Err() != nil {
			if lastErr == nil {
				lastErr = err
			}
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
		}
		lastErr = err
		if ds, ok := diag.As(err); !ok && !retryable(err) {
			return err
		} else if ok && ds[0].Code != diag.PoolNoLeader {
			return err
		}
		c.rotate(idx)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

func readResponse(resp *http.Response, out any) error {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
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
	return r, c.do(ctx, "POST", "/v1/lease", req, &r)
}

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
func (c *Client) StatusOf(ctx context.Context, base string) (json.RawMessage, error) {
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
	req := func(base string) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, "PUT", base+"/blobs/"+string(ref), bytes.NewReader(b))
	}
	return ref, c.blobDo(ctx, req, nil)
}

// GetBlob fetches a blob and checks that it hashes to ref.
func (c *Client) GetBlob(ctx context.Context, ref content.Ref) ([]byte, error) {
	var b []byte
	req := func(base string) (*http.Request, error) {
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

// blobDo tries the current node, then every other; blobs are not
// redirected to the leader, any node holding one may serve it.
func (c *Client) blobDo(ctx context.Context, mk func(base string) (*http.Request, error), out *[]byte) error {
	base, idx := c.endpoint()
	order := []string{base}
	for i, e := range c.endpoints {
		if i != idx%len(c.endpoints) {
			order = append(order, e)
		}
	}
	backoff := 50 * time.Millisecond
	for {
		var lastErr error
		transient := false
		for _, b := range order {
			req, err := mk(b)
			if err != nil {
				return err
			}
			resp, err := c.http.Do(req)
			if err != nil {
				lastErr = err
				transient = transient || retryable(err)
				continue
			}
			var raw []byte
			if err := readResponse(resp, &raw); err != nil {
				lastErr = err
				continue
			}
			if out != nil {
				*out = raw
			}
			return nil
		}
		// Retry only when some node could not be reached at all (it may be
		// starting or electing); a node that answered "no" is believed.
		if !transient || ctx.Err() != nil {
			return lastErr
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// Event is one server-sent event of a job's stream.
type Event struct {
	Kind string
	Data json.RawMessage
}

// Watch streams a job's (or a training run's) events to fn until the job
// (run) completes, fn returns an error, or ctx ends. It reconnects (to another node if needed) when
// the stream breaks; after a reconnect the first event is a fresh status.
func (c *Client) Watch(ctx context.Context, id content.Ref, fn func(Event) error) error {
	for {
		done, err := c.watchOnce(ctx, id, fn)
		if done || ctx.Err() != nil {
			return err
		}
		if ds, ok := diag.As(err); ok {
			return ds
		}
		base, idx := c.endpoint()
		_ = base
		c.rotate(idx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Client) watchOnce(ctx context.Context, id content.Ref, fn func(Event) error) (bool, error) {
	base, _ := c.endpoint()
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/jobs/"+string(id)+"/events", nil)
	if err != nil {
		return true, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return true, readResponse(resp, nil)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var ev Event
	for sc.Scan() {
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
					(st.State == string(coordinator.JobDone) || st.State == string(coordinator.RunStopped) || st.State == string(coordinator.JobCancelledState)) {
					return true, nil
				}
			}
			ev = Event{}
		}
	}
	return false, sc.Err()
}

// Transport returns an HTTP transport for mutual TLS with cfg.
func Transport(cfg *tls.Config) *http.Transport {
	return &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 16, ForceAttemptHTTP2: true}
}

// GetBlobFrom fetches a blob from the first of bases that has it.
func (c *Client) GetBlobFrom(ctx context.Context, bases []string, ref content.Ref) ([]byte, error) {
	var lastErr error = errors.New("no node to ask")
	for _, base := range bases {
		req, err := http.NewRequestWithContext(ctx, "GET", base+"/blobs/"+string(ref), nil)
		if err != nil {
			return nil, err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		var b []byte
		if err := readResponse(resp, &b); err != nil {
			lastErr = err
			continue
		}
		if content.Hash(b) != ref {
			lastErr = fmt.Errorf("%s served bytes that do not hash to %s", base, ref.Short())
			continue
		}
		return b, nil
	}
	return nil, lastErr
}

// PutBlobTo stores a blob on one given node.
func (c *Client) PutBlobTo(ctx context.Context, base string, b []byte) error {
	req, err := http.NewRequestWithContext(ctx, "PUT", base+"/blobs/"+string(content.Hash(b)), bytes.NewReader(b))
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	return readResponse(resp, nil)
}

// Join adds an aggregator member to the Raft voters.
func (c *Client) Join(ctx context.Context, member string) error {
	return c.do(ctx, "POST", "/v1/cluster/join", MemberRequest{Member: member}, nil)
}

// Leave removes an aggregator member from the Raft voters.
func (c *Client) Leave(ctx context.Context, member string) error {
	return c.do(ctx, "POST", "/v1/cluster/leave", MemberRequest{Member: member}, nil)
}

// Cancel cancels a job that has not been reduced.
func (c *Client) Cancel(ctx context.Context, id content.Ref, reason string) (coordinator.CancelResponse, error) {
	var r coordinator.CancelResponse
	return r, c.do(ctx, "POST", "/v1/jobs/"+string(id)+"/cancel", CancelRequest{Reason: reason}, &r)
}
