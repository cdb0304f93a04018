package aggregator

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/sandboxproc"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/verify"
	"github.com/scellis/scellis/verify/spot"
)

// ContentCaps are the operator's bounds on the submitters' content the
// aggregator runs (partition, cost, reduce). A job's own limits may only
// lower them. Zero fields take the defaults of DefaultContentCaps.
type ContentCaps struct {
	// Steps and MemoryBytes bound each content call inside the sandbox
	// (script.Limits).
	Steps       uint64
	MemoryBytes uint64
	// WallClock bounds one planning or reduction child process; past it
	// the process is killed.
	WallClock time.Duration
	// MaxShardUnits and MaxJobUnits cap the prices cost() may set.
	MaxShardUnits, MaxJobUnits int64
	// Workers is how many plans or reductions run at once on this node;
	// PerMember how many of one member's submissions plan at once.
	Workers, PerMember int
	// CacheSize bounds the compiled plans kept (by bundle ref).
	CacheSize int
}

// DefaultContentCaps are the caps when the aggregator config sets none.
func DefaultContentCaps() ContentCaps {
	return ContentCaps{
		Steps: script.DefaultSteps, MemoryBytes: 512 << 20, WallClock: time.Minute,
		MaxShardUnits: 1 << 30, MaxJobUnits: 1 << 40,
		Workers: 2, PerMember: 1, CacheSize: 256,
	}
}

func (c ContentCaps) withDefaults() ContentCaps {
	d := DefaultContentCaps()
	if c.Steps == 0 {
		c.Steps = d.Steps
	}
	if c.MemoryBytes == 0 {
		c.MemoryBytes = d.MemoryBytes
	}
	if c.WallClock == 0 {
		c.WallClock = d.WallClock
	}
	if c.MaxShardUnits == 0 {
		c.MaxShardUnits = d.MaxShardUnits
	}
	if c.MaxJobUnits == 0 {
		c.MaxJobUnits = d.MaxJobUnits
	}
	if c.Workers <= 0 {
		c.Workers = d.Workers
	}
	if c.PerMember <= 0 {
		c.PerMember = d.PerMember
	}
	if c.CacheSize <= 0 {
		c.CacheSize = d.CacheSize
	}
	return c
}

// childOverhead is the address space a planning child may use beyond the
// content's own memory cap: the engine itself, the job's input tables
// (loaded outside the content's budget) and the Go heap's slack.
const childOverhead = 256 << 20

// processLimits are the OS limits of one child for these caps.
func (c ContentCaps) processLimits() sandboxproc.Limits {
	return sandboxproc.Limits{MemoryBytes: c.MemoryBytes + childOverhead, WallClock: c.WallClock}
}

// planner compiles bundles on the aggregator: the shards and their prices
// are derived here from the content itself, never taken from the
// submitter. The content runs in a child process (internal/sandboxproc)
// under the operator's caps, at most caps.Workers at once and
// caps.PerMember per member, so a hostile partitioner can neither pin this
// process nor exhaust its memory. Compiled plans are cached, bounded, by
// bundle ref.
type planner struct {
	blobs    *blob.Store
	blobDir  string
	builtin  *catalog.Catalog
	cacheDir string
	caps     ContentCaps
	// open: the node's pool is open, so exact quorum jobs get canaries
	// by default (coordinator/standing.go).
	open bool
	// fetchBlob reads a blob from this node, or from another aggregator
	// (and then keeps a copy here).
	fetchBlob func(ctx context.Context, ref content.Ref) ([]byte, error)
	// durable stores a blob on a second aggregator, so a new leader can
	// plan and reduce the job after this node is gone.
	durable func(ctx context.Context, ref content.Ref) error

	slots chan struct{} // the worker pool's free slots
	// warm starts each child ahead of its request (one process per
	// request still, under the same limits: sandboxproc.Warm), so a plan
	// or a reduction does not wait for a process to start.
	warm    *sandboxproc.Warm
	running atomic.Int64 // plans and reductions in a child right now

	mu       sync.Mutex
	perPeer  map[string]int
	cache    map[content.Ref]*list.Element // of *cachedPlan
	lru      *list.List
	inflight map[content.Ref]*planCall
}

type cachedPlan struct {
	bundle content.Ref
	reply  planReply
}

// planCall lets concurrent submissions of one bundle share its plan.
type planCall struct {
	done  chan struct{}
	reply planReply
	err   error
}

func newPlanner(blobs *blob.Store, blobDir string, builtin *catalog.Catalog, cacheDir string, caps ContentCaps) *planner {
	caps = caps.withDefaults()
	return &planner{
		blobs: blobs, blobDir: blobDir, builtin: builtin, cacheDir: cacheDir, caps: caps,
		slots:   make(chan struct{}, caps.Workers),
		warm:    sandboxproc.NewWarm(caps.processLimits()),
		perPeer: map[string]int{}, cache: map[content.Ref]*list.Element{}, lru: list.New(),
		inflight: map[content.Ref]*planCall{},
	}
}

// close kills the spare child.
func (p *planner) close() { p.warm.Close() }

// Running is the number of plans and reductions running now.
func (p *planner) Running() int { return int(p.running.Load()) }

func (p *planner) fetch(ctx context.Context, ref content.Ref) ([]byte, error) {
	b, err := p.fetchBlob(ctx, ref)
	if err != nil {
		return nil, diag.New(diag.BlobMissing, ref.Short(), "blob %s is not on this aggregator", ref).
			WithHelp("upload the bundle's content and inputs before submitting (scellis job submit does this)")
	}
	return b, nil
}

// local makes every blob a bundle names present in this node's store, so
// the child, which reads only the local store, finds them.
func (p *planner) local(ctx context.Context, bundleRef content.Ref) error {
	_, err := p.gather(ctx, bundleRef)
	return err
}

// sendMax bounds the blob bytes a parent hands a child with its request
// (planRequest.Blobs); the child reads the rest from the store.
const sendMax = 16 << 20

// sent is the small blobs a parent hands a child with its request, within
// sendMax in all.
type sent struct {
	blobs map[content.Ref][]byte
	size  int
}

// add keeps b for the child if it is small (a packed blob) and fits.
func (s *sent) add(ref content.Ref, b []byte) {
	if len(b) > blob.PackThreshold || s.size+len(b) > sendMax {
		return
	}
	if _, dup := s.blobs[ref]; !dup {
		s.blobs[ref] = b
		s.size += len(b)
	}
}

// gather does local's work and returns the small blobs it read (the
// bundle, its content, small inputs), for the child's request.
func (p *planner) gather(ctx context.Context, bundleRef content.Ref) (*sent, error) {
	out := &sent{blobs: map[content.Ref][]byte{}}
	raw, err := p.fetch(ctx, bundleRef)
	if err != nil {
		return nil, err
	}
	out.add(bundleRef, raw)
	var b job.Bundle
	if err := content.Decode(raw, &b); err != nil {
		return nil, diag.New(diag.PoolBadJob, bundleRef.Short(), "not a job bundle: %v", err)
	}
	for _, ref := range b.Content {
		if _, builtin := p.builtin.Lookup(string(ref)); builtin {
			continue
		}
		src, err := p.fetch(ctx, ref)
		if err != nil {
			return nil, err
		}
		out.add(ref, src)
	}
	for _, in := range b.Inputs {
		data, err := p.fetch(ctx, in.Ref)
		if err != nil {
			return nil, err
		}
		out.add(in.Ref, data)
	}
	return out, nil
}

// request is the planRequest of a bundle, with the small blobs the child
// will read handed over with it (gather); more may be added to the
// returned sent (its blobs are the request's Blobs) before it is sent.
func (p *planner) request(ctx context.Context, bundleRef content.Ref) (planRequest, *sent, error) {
	s, err := p.gather(ctx, bundleRef)
	if err != nil {
		return planRequest{}, nil, err
	}
	return planRequest{Bundle: bundleRef, BlobDir: p.blobDir, CacheDir: p.cacheDir, Caps: p.wireCaps(), Blobs: s.blobs, Open: p.open}, s, nil
}

// inChild runs a sandboxed handler in a slot of the worker pool.
func (p *planner) inChild(ctx context.Context, handler string, req any) ([]byte, error) {
	b, err := content.Encode(req)
	if err != nil {
		return nil, err
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-p.slots }()
	p.running.Add(1)
	defer p.running.Add(-1)
	out, err := p.warm.Run(ctx, handler, b)
	switch {
	case errors.Is(err, sandboxproc.ErrMemory):
		return nil, diag.New(diag.ContentKilled, "content", "the job's content was killed at this pool's memory cap (%d MiB for content, %d MiB for the process)",
			p.caps.MemoryBytes>>20, p.caps.processLimits().MemoryBytes>>20).
			WithHelp("lower what partition(), cost() or reduce() allocate; scellis run shows the content's own diagnostics")
	case errors.Is(err, sandboxproc.ErrTimeout):
		return nil, diag.New(diag.ContentKilled, "content", "the job's content was killed at this pool's wall-clock cap of %s", p.caps.WallClock).
			WithHelp("partition(), cost() and reduce() must finish quickly; move the work into the program's shards")
	}
	return out, err
}

// planRequest is what a planning child is told: where the blobs are, which
// bundle to compile, and under which caps.
type planRequest struct {
	Bundle   content.Ref `cbor:"bundle"`
	BlobDir  string      `cbor:"blob_dir"`
	CacheDir string      `cbor:"cache_dir"`
	Caps     capsWire    `cbor:"caps"`
	// Blobs are small blobs the parent read already (the bundle, its
	// content and inputs, a reduction's results), handed over so the
	// child need not look them up in the store: finding a packed blob
	// from another process means scanning every pack, a cost that grows
	// with everything the node ever stored. The child re-hashes each.
	Blobs map[content.Ref][]byte `cbor:"blobs,omitempty"`
	// Open: the pool is open, so an exact job gets canaries by default.
	Open bool `cbor:"open,omitempty"`
}

type capsWire struct {
	Steps         uint64 `cbor:"steps"`
	MemoryBytes   uint64 `cbor:"memory_bytes"`
	MaxShardUnits int64  `cbor:"max_shard_units"`
	MaxJobUnits   int64  `cbor:"max_job_units"`
}

func (p *planner) wireCaps() capsWire {
	return capsWire{p.caps.Steps, p.caps.MemoryBytes, p.caps.MaxShardUnits, p.caps.MaxJobUnits}
}

// planReply is the child's answer: the command (without submitter and
// time) and the blobs that must survive this node.
type planReply struct {
	Cmd     coordinator.SubmitJob `cbor:"cmd"`
	Durable []content.Ref         `cbor:"durable"`
}

const (
	planHandler   = "aggregator.plan"
	reduceHandler = "aggregator.reduce"
)

func init() {
	sandboxproc.Register(planHandler, childPlan)
	sandboxproc.Register(reduceHandler, childReduce)
	// A spare child reads and hashes the built-in sources before it is
	// handed a job.
	sandboxproc.Warmup(func() { childBuiltin() })
}

// childBuiltin is the built-in catalog of a child process, loaded once
// (a child serves one request, so nothing of one job's reaches another).
// It is lazy: a plan or a reduction looks up a few built-ins by ref (the
// bundle's, to take their bytes), and parsing all of them was most of a
// small plan's CPU, in every child (`BenchmarkPoolShards`
// child-cpu-ms/job).
var childBuiltin = sync.OnceValues(catalog.BuiltinLazy)

// childBlobs is a child's read path: the blobs its parent handed over
// (re-hashed before use, law 14), else the node's store.
type childBlobs struct {
	sent  map[content.Ref][]byte
	store *blob.Store
}

func (c *childBlobs) get(ref content.Ref) ([]byte, error) {
	if b, ok := c.sent[ref]; ok {
		if content.Hash(b) != ref {
			return nil, fmt.Errorf("blob %s handed to the child does not hash to its ref", ref.Short())
		}
		return b, nil
	}
	return c.store.Get(ref)
}

// compileInChild compiles a bundle inside a child: only the blobs handed
// over and the local blob store are read, and every content call runs
// under the caps. It returns the child's read path for the caller's own
// blobs.
func compileInChild(ctx context.Context, req planRequest) (*job.Plan, *catalog.Catalog, *childBlobs, error) {
	store, err := blob.Open(req.BlobDir, 0)
	if err != nil {
		return nil, nil, nil, err
	}
	blobs := &childBlobs{sent: req.Blobs, store: store}
	builtin, err := childBuiltin()
	if err != nil {
		return nil, nil, nil, err
	}
	fetch := func(_ context.Context, ref content.Ref) ([]byte, error) {
		b, err := blobs.get(ref)
		if err != nil {
			return nil, diag.New(diag.BlobMissing, ref.Short(), "blob %s is not on this aggregator", ref).
				WithHelp("upload the bundle's content and inputs before submitting (scellis job submit does this)")
		}
		return b, nil
	}
	raw, err := fetch(ctx, req.Bundle)
	if err != nil {
		return nil, nil, nil, err
	}
	var b job.Bundle
	if err := content.Decode(raw, &b); err != nil {
		return nil, nil, nil, diag.New(diag.PoolBadJob, req.Bundle.Short(), "not a job bundle: %v", err)
	}
	dir := filepath.Join(req.CacheDir, req.Bundle.Hex()[:16])
	caps := req.Caps
	pl, err := job.CompileBundle(ctx, &b, builtin, fetch, dir, script.Limits{Steps: caps.Steps, MemoryBytes: caps.MemoryBytes})
	return pl, builtin, blobs, err
}

// childRequest is the request of a child that works on a compiled plan:
// it names the plan (compiles).
type childRequest interface{ compiles() planRequest }

func (r planRequest) compiles() planRequest    { return r }
func (r reduceRequest) compiles() planRequest  { return r.Plan }
func (r verdictRequest) compiles() planRequest { return r.Plan }

// decodeCompiled decodes a child's request and compiles the plan it
// names: how each child that works on a plan starts.
func decodeCompiled[R childRequest](ctx context.Context, raw []byte) (req R, pl *job.Plan, builtin *catalog.Catalog, blobs *childBlobs, err error) {
	if err = content.Decode(raw, &req); err != nil {
		return req, nil, nil, nil, err
	}
	pl, builtin, blobs, err = compileInChild(ctx, req.compiles())
	return req, pl, builtin, blobs, err
}

func childPlan(ctx context.Context, raw []byte) ([]byte, error) {
	req, pl, builtin, _, err := decodeCompiled[planRequest](ctx, raw)
	if err != nil {
		return nil, err
	}
	if err := pl.CheckPrices(req.Caps.MaxShardUnits, req.Caps.MaxJobUnits); err != nil {
		return nil, err
	}
	cmd, durable := submitCommand(pl, req.Bundle, builtin)
	if cmd.Canaries, err = canaries(ctx, pl, req.Open); err != nil {
		return nil, err
	}
	return content.Encode(planReply{Cmd: cmd, Durable: durable})
}

// canaries computes the known answers of a job's canary shards: a share
// of its own shards (spot.CanaryCount), chosen with crypto/rand and
// executed here, in the planning child under the operator's caps. A
// canary is a real shard, so no peer can tell it from the others. An
// adaptive job has them by default, and so has an exactly matched job on
// an open pool (where they are how volunteers earn standing and how a
// lone liar is caught: coordinator/standing.go); another job only when
// its spec sets verification.canaries.
func canaries(ctx context.Context, pl *job.Plan, open bool) ([]coordinator.Canary, error) {
	v := pl.Spec.Verification
	exact := pl.FreivaldsRounds() == 0 && pl.Tier() != verify.Convergent
	rate := v.Canaries
	if rate == 0 && (v.Mode == coordinator.ModeAdaptive || (open && exact)) {
		rate = spot.DefaultCanaryRate
	}
	if rate == 0 || len(pl.Shards) == 0 {
		return nil, nil
	}
	seed := make([]byte, spot.SeedBytes)
	if _, err := rand.Read(seed); err != nil {
		return nil, err
	}
	var out []coordinator.Canary
	for _, i := range spot.PickCanaries(len(pl.Shards), spot.CanaryCount(len(pl.Shards), rate), seed) {
		res, err := pl.Execute(ctx, pl.Shards[i])
		if err != nil {
			return nil, fmt.Errorf("canary shard %d: %w", i, err)
		}
		out = append(out, coordinator.Canary{Shard: i, Result: res.Hash})
	}
	return out, nil
}

// submitCommand is the SubmitJob a plan stands for, and the blobs (the
// bundle and every non-builtin blob it names) that must outlive this node.
func submitCommand(pl *job.Plan, bundleRef content.Ref, builtin *catalog.Catalog) (coordinator.SubmitJob, []content.Ref) {
	refs := []content.Ref{bundleRef}
	for _, c := range pl.Content {
		if _, isBuiltin := builtin.Lookup(string(c.Ref)); !isBuiltin {
			refs = append(refs, c.Ref)
		}
	}
	for _, in := range pl.Inputs {
		refs = append(refs, in.Ref)
	}
	basis := "flat: 1 work unit per shard"
	if pl.Program.HasFunc("cost") {
		basis = fmt.Sprintf("cost() of program %s (%s)", pl.Program.Name, pl.Program.Ref.Short())
	}
	req := pl.AdmissionRequest()
	cmd := coordinator.SubmitJob{
		Job:              pl.ID,
		Name:             pl.Spec.Name,
		Bundle:           bundleRef,
		Regime:           pl.Spec.Regime,
		SecurityCritical: pl.Spec.SecurityCritical,
		Inputs:           req.Inputs,
		Models:           req.Models,
		Policy: coordinator.Policy{Replicas: pl.Spec.Verification.Replicas, Attempts: pl.Spec.Verification.Attempts, Mode: pl.Spec.Verification.Mode,
			TrustAfter: pl.Spec.Verification.TrustAfter, AuditOneIn: pl.Spec.Verification.AuditOneIn},
	}
	// A check other than exact match is judged by a verifier peer
	// (verifier.go); the coordinator records its verdicts.
	switch {
	case pl.FreivaldsRounds() > 0:
		cmd.Policy.Check, cmd.Policy.Rounds = coordinator.CheckFreivalds, pl.FreivaldsRounds()
	case pl.Tier() == verify.Convergent:
		cmd.Policy.Check, cmd.Policy.Tolerance = coordinator.CheckCompare, pl.Tolerance().String()
	}
	if cmd.Inputs == nil {
		cmd.Inputs = []trust.Item{}
	}
	for _, sh := range pl.Shards {
		cmd.Shards = append(cmd.Shards, coordinator.ShardPlan{Index: sh.Index, ID: sh.ID, Price: sh.Cost, PriceBasis: basis})
	}
	return cmd, refs
}

// plan returns the plan of a bundle, compiling it in a child once: the
// cache is bounded (least recently used out) and concurrent submissions of
// one bundle share one child.
func (p *planner) plan(ctx context.Context, bundleRef content.Ref, submitter string) (planReply, error) {
	if !content.IsRef(string(bundleRef)) {
		return planReply{}, diag.New(diag.PoolBadRequest, "bundle", "the bundle ref is not sha256:<64 lowercase hex digits>")
	}
	p.mu.Lock()
	if r, ok := p.cachedLocked(bundleRef); ok {
		p.mu.Unlock()
		return r, nil
	}
	if c, ok := p.inflight[bundleRef]; ok {
		p.mu.Unlock()
		select {
		case <-c.done:
			return c.reply, c.err
		case <-ctx.Done():
			return planReply{}, ctx.Err()
		}
	}
	if submitter != "" && p.perPeer[submitter] >= p.caps.PerMember {
		p.mu.Unlock()
		return planReply{}, diag.New(diag.PoolPlanBusy, submitter, "%d of this member's submissions are being planned already (the pool allows %d at once)", p.perPeer[submitter], p.caps.PerMember).
			WithHelp("wait for the submission in flight to be answered, then submit again")
	}
	c := &planCall{done: make(chan struct{})}
	p.inflight[bundleRef] = c
	if submitter != "" {
		p.perPeer[submitter]++
	}
	p.mu.Unlock()

	c.reply, c.err = p.planInChild(ctx, bundleRef)

	p.mu.Lock()
	delete(p.inflight, bundleRef)
	if submitter != "" {
		if p.perPeer[submitter]--; p.perPeer[submitter] <= 0 {
			delete(p.perPeer, submitter)
		}
	}
	if c.err == nil {
		p.rememberLocked(bundleRef, c.reply)
	}
	p.mu.Unlock()
	close(c.done)
	return c.reply, c.err
}

// cachedLocked returns a cached plan, marking it recently used.
func (p *planner) cachedLocked(bundleRef content.Ref) (planReply, bool) {
	el, ok := p.cache[bundleRef]
	if !ok {
		return planReply{}, false
	}
	p.lru.MoveToFront(el)
	return el.Value.(*cachedPlan).reply, true
}

// rememberLocked caches a plan, dropping the least recently used beyond
// caps.CacheSize.
func (p *planner) rememberLocked(bundleRef content.Ref, r planReply) {
	if el, ok := p.cache[bundleRef]; ok {
		p.lru.MoveToFront(el)
		return
	}
	p.cache[bundleRef] = p.lru.PushFront(&cachedPlan{bundleRef, r})
	for p.lru.Len() > p.caps.CacheSize {
		old := p.lru.Remove(p.lru.Back()).(*cachedPlan)
		delete(p.cache, old.bundle)
	}
}

func (p *planner) planInChild(ctx context.Context, bundleRef content.Ref) (planReply, error) {
	req, _, err := p.request(ctx, bundleRef)
	if err != nil {
		return planReply{}, err
	}
	out, err := p.inChild(ctx, planHandler, req)
	if err != nil {
		return planReply{}, err
	}
	var r planReply
	if err := content.Decode(out, &r); err != nil {
		return planReply{}, fmt.Errorf("planning child answered garbage: %w", err)
	}
	return r, nil
}

// Plan implements api.Planner.
func (p *planner) Plan(ctx context.Context, bundleRef content.Ref, submitter string) (coordinator.SubmitJob, error) {
	r, err := p.plan(ctx, bundleRef, submitter)
	if err != nil {
		return coordinator.SubmitJob{}, err
	}
	for _, ref := range r.Durable {
		if err := p.durable(ctx, ref); err != nil {
			return coordinator.SubmitJob{}, err
		}
	}
	cmd := r.Cmd
	cmd.Submitter = submitter
	// The seed of the order volunteers are offered shards in: this
	// node's secret, never shown to peers (coordinator.SubmitJob.Seed).
	var seed [16]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return coordinator.SubmitJob{}, err
	}
	cmd.Seed = hex.EncodeToString(seed[:])
	return cmd, nil
}
