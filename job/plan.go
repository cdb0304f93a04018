package job

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/verify"
)

// Plan is a compiled job: content resolved, inputs loaded, ID fixed, shards
// partitioned and priced. A Plan is read-only after Compile and safe to
// execute shards from concurrently.
type Plan struct {
	Spec        *Spec
	ID          content.Ref
	Program     *catalog.Entry
	Partitioner *catalog.Entry
	Reducer     *catalog.Entry
	// Content is every entry the job references, including libraries
	// loaded by them, sorted by role then name.
	Content []ContentRef
	Inputs  []*LoadedInput
	Shards  []Shard

	catalog *catalog.Catalog
	limits  script.Limits
}

// ContentRef cites one piece of content a job ran.
type ContentRef struct {
	Role string      `json:"role" cbor:"role"`
	Name string      `json:"name" cbor:"name"`
	Kind string      `json:"kind" cbor:"kind"`
	Ref  content.Ref `json:"ref" cbor:"ref"`
}

// LoadedInput is an input file, hashed and parsed.
type LoadedInput struct {
	Name  string
	Path  string
	Ref   content.Ref
	Class trust.Class
	Label string
	Data  *model.Dataset
}

// Shard is one independent unit of work.
type Shard struct {
	Index  int            `json:"index"`
	ID     content.Ref    `json:"id"`
	Params map[string]any `json:"params"`
	// Cost is the planner's price in work units, derived from the shard
	// before execution (the program's cost function, or 1). Nothing a peer
	// reports changes it.
	Cost int64 `json:"cost"`
}

// canonicalFormat versions the canonical job encoding; bump it only with a
// migration note, since it changes every job ID.
const canonicalFormat = "scellis/job/v1"

type canonicalUse struct {
	Ref    content.Ref    `cbor:"ref"`
	Params map[string]any `cbor:"params"`
}

type canonicalInput struct {
	Ref   content.Ref `cbor:"ref"`
	Label string      `cbor:"label"`
	Class string      `cbor:"class"`
}

type canonicalJob struct {
	Format           string                    `cbor:"format"`
	Name             string                    `cbor:"name"`
	Regime           string                    `cbor:"regime"`
	SecurityCritical bool                      `cbor:"security_critical"`
	Program          content.Ref               `cbor:"program"`
	Partitioner      canonicalUse              `cbor:"partitioner"`
	Reducer          canonicalUse              `cbor:"reducer"`
	Libraries        []content.Ref             `cbor:"libraries"`
	Params           map[string]any            `cbor:"params"`
	Inputs           map[string]canonicalInput `cbor:"inputs"`
	Verification     Verification              `cbor:"verification"`
	Limits           Limits                    `cbor:"limits"`
	// Classes is omitted when empty, so jobs without classes keep their IDs.
	Classes map[string]string `cbor:"classes,omitempty"`
}

type canonicalShard struct {
	Job    content.Ref    `cbor:"job"`
	Index  int            `cbor:"index"`
	Params map[string]any `cbor:"params"`
}

// Compile resolves a spec against a catalog, loads and hashes its inputs,
// computes the job ID, partitions it into shards and prices them.
func Compile(ctx context.Context, spec *Spec, cat *catalog.Catalog) (*Plan, error) {
	return compile(ctx, spec, cat, nil, true)
}

// CompileCapped is Compile under an operator's caps: a zero field of caps
// leaves that budget to the job; otherwise the job's limit may only lower
// the cap, never raise it. The caps change no result (a call either fits
// or fails with a diagnostic), so not the job ID.
func CompileCapped(ctx context.Context, spec *Spec, cat *catalog.Catalog, caps script.Limits) (*Plan, error) {
	return compile(ctx, spec, cat, []script.Limits{caps}, true)
}

// compile compiles spec; without partition the plan lists no shards
// (ShardRequest.CompileRunner).
func compile(ctx context.Context, spec *Spec, cat *catalog.Catalog, caps []script.Limits, partition bool) (*Plan, error) {
	p := &Plan{Spec: spec, catalog: cat, limits: script.DefaultLimits()}
	if spec.Limits.Steps > 0 {
		p.limits.Steps = spec.Limits.Steps
	}
	if spec.Limits.MemoryMB > 0 {
		// Saturate: MemoryMB<<20 overflows past 2^44 MiB.
		p.limits.MemoryBytes = math.MaxUint64
		if spec.Limits.MemoryMB <= math.MaxUint64>>20 {
			p.limits.MemoryBytes = spec.Limits.MemoryMB << 20
		}
	}
	for _, c := range caps {
		p.CapSteps(c.Steps)
		p.CapMemory(c.MemoryBytes)
	}
	var diags diag.List
	resolve := func(field, ref string, kind catalog.Kind) *catalog.Entry {
		e, err := cat.Resolve(ref, spec.BaseDir())
		if err != nil {
			ds, ok := diag.As(err)
			if !ok {
				ds = diag.List{diag.New(diag.UnknownContent, field, "%v", err)}
			}
			for _, d := range ds {
				if d.Pos == nil {
					spec.at(d, field)
				}
			}
			diags = append(diags, ds...)
			return nil
		}
		if e.Kind != kind {
			diags = append(diags, spec.at(diag.New(diag.ContentKind, field,
				"%q is a %s, but %s needs a %s", ref, e.Kind, field, kind), field).
				WithHelp("scellis catalog ls shows each entry's kind"))
			return nil
		}
		return e
	}
	p.Program = resolve("program", spec.Program, catalog.Program)
	p.Partitioner = resolve("partitioner", spec.Partitioner.Ref, catalog.Partitioner)
	p.Reducer = resolve("reducer", spec.Reducer.Ref, catalog.Reducer)
	if err := diags.Err(); err != nil {
		return nil, err
	}

	if err := p.checkVerification(); err != nil {
		return nil, err
	}
	libs, err := p.collectContent()
	if err != nil {
		return nil, err
	}
	if err := p.loadInputs(); err != nil {
		return nil, err
	}

	canon := canonicalJob{
		Format:           canonicalFormat,
		Name:             spec.Name,
		Regime:           string(spec.Regime),
		SecurityCritical: spec.SecurityCritical,
		Program:          p.Program.Ref,
		Partitioner:      canonicalUse{p.Partitioner.Ref, spec.Partitioner.Params},
		Reducer:          canonicalUse{p.Reducer.Ref, spec.Reducer.Params},
		Libraries:        libs,
		Params:           spec.Params,
		Inputs:           map[string]canonicalInput{},
		Verification:     spec.Verification,
		Limits:           spec.Limits,
		Classes:          classStrings(spec.Classes),
	}
	for _, in := range p.Inputs {
		canon.Inputs[in.Name] = canonicalInput{in.Ref, in.Label, string(in.Class)}
	}
	if p.ID, err = content.HashOf(canon); err != nil {
		return nil, fmt.Errorf("job: encoding canonical spec: %w", err)
	}
	if !partition {
		return p, nil
	}
	if err := p.partition(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// collectContent fills p.Content and returns the refs of loaded libraries.
func (p *Plan) collectContent() ([]content.Ref, error) {
	roles := []struct {
		role string
		e    *catalog.Entry
	}{{"program", p.Program}, {"partitioner", p.Partitioner}, {"reducer", p.Reducer}}
	seen := map[content.Ref]bool{}
	var libs []ContentRef
	for _, r := range roles {
		p.Content = append(p.Content, ContentRef{r.role, r.e.Name, string(r.e.Kind), r.e.Ref})
		seen[r.e.Ref] = true
	}
	for _, r := range roles {
		closure, err := p.catalog.Closure(r.e)
		if err != nil {
			return nil, err
		}
		for _, e := range closure {
			if !seen[e.Ref] {
				seen[e.Ref] = true
				libs = append(libs, ContentRef{"library", e.Name, string(e.Kind), e.Ref})
			}
		}
	}
	sort.Slice(libs, func(i, j int) bool { return libs[i].Ref < libs[j].Ref })
	p.Content = append(p.Content, libs...)
	refs := make([]content.Ref, len(libs))
	for i, l := range libs {
		refs[i] = l.Ref
	}
	return refs, nil
}

func (p *Plan) loadInputs() error {
	names := make([]string, 0, len(p.Spec.Inputs))
	for n := range p.Spec.Inputs {
		names = append(names, n)
	}
	sort.Strings(names)
	var diags diag.List
	for _, name := range names {
		in := p.Spec.Inputs[name]
		path := in.Path
		if !filepath.IsAbs(path) {
			path = filepath.Join(p.Spec.BaseDir(), path)
		}
		ref, err := hashFile(path)
		if err != nil {
			diags = append(diags, p.Spec.at(diag.New(diag.FileUnreadable, "inputs."+name,
				"cannot read input %s: %v", path, unwrapPathErr(err)), "inputs."+name+".path").
				WithHelp("relative paths resolve against the job file's folder"))
			continue
		}
		ds, err := model.LoadCSV(path, in.Label)
		if err != nil {
			l, ok := diag.As(err)
			if !ok {
				return err
			}
			if p.Spec.fetched {
				// The file came from a remote submitter and the error goes
				// back to a remote caller: say which check failed, never
				// what the file holds (column names, cell values).
				for _, d := range l {
					diags = append(diags, diag.New(d.Code, "inputs."+name,
						"input %s is not a table this job can use (%s)", name, d.Code).
						WithHelp("run the job with scellis run on the submitter's machine to see the file's own diagnostics"))
				}
				continue
			}
			diags = append(diags, l...)
			continue
		}
		p.Inputs = append(p.Inputs, &LoadedInput{Name: name, Path: path, Ref: ref, Class: in.Class, Label: in.Label, Data: ds})
	}
	return diags.Err()
}

func hashFile(path string) (content.Ref, error) {
	f, _, err := safefile.Open(path, os.O_RDONLY, safefile.MaxDataset)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return content.Ref(fmt.Sprintf("sha256:%x", h.Sum(nil))), nil
}

func unwrapPathErr(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

func (p *Plan) env(seed []byte) script.Env {
	return script.Env{Catalog: p.catalog, Limits: p.limits, Seed: seed, Convergent: p.Tier() == verify.Convergent}
}

func (p *Plan) partition(ctx context.Context) error {
	out, err := script.Call(ctx, p.env(p.ID.Digest()), p.Partitioner, "partition", p.Spec.Partitioner.Params)
	if err != nil {
		return err
	}
	list, ok := out.([]any)
	if !ok {
		return p.Spec.at(diag.New(diag.ContentShape, "partitioner "+p.Partitioner.Name,
			"partition returned %s, want a list of dicts (one per shard)", script.Describe(out)), "partitioner").
			WithHelp("return a list such as [{\"lr\": 0.1}, {\"lr\": 0.01}]")
	}
	if len(list) == 0 {
		return p.Spec.at(diag.New(diag.NoShards, "partitioner "+p.Partitioner.Name,
			"partition returned no shards for params %v", p.Spec.Partitioner.Params), "partitioner").
			WithHelp("check the partitioner's params: an empty list in a grid gives no shards")
	}
	p.Shards = make([]Shard, len(list))
	hasCost := hasFunc(p.Program, "cost")
	for i, v := range list {
		params, ok := v.(map[string]any)
		if !ok {
			return p.Spec.at(diag.New(diag.ContentShape, "partitioner "+p.Partitioner.Name,
				"shard %d is %s, want a dict of parameters", i, script.Describe(v)), "partitioner")
		}
		id, err := content.HashOf(canonicalShard{p.ID, i, params})
		if err != nil {
			return fmt.Errorf("job: encoding shard %d: %w", i, err)
		}
		sh := Shard{Index: i, ID: id, Params: params, Cost: 1}
		if hasCost {
			c, err := script.Call(ctx, p.env(id.Digest()), p.Program, "cost", p.shardParams(sh))
			if err != nil {
				return err
			}
			n, ok := c.(int64)
			if !ok || n < 0 {
				return diag.New(diag.ContentShape, "program "+p.Program.Name,
					"cost returned %s for shard %d, want a non-negative int of work units", script.Describe(c), i)
			}
			sh.Cost = n
		}
		p.Shards[i] = sh
	}
	return nil
}

func hasFunc(e *catalog.Entry, name string) bool {
	for _, f := range e.Funcs {
		if f == name {
			return true
		}
	}
	return false
}

// shardParams is the job's params with the shard's parameters overlaid.
func (p *Plan) shardParams(sh Shard) map[string]any {
	m := make(map[string]any, len(p.Spec.Params)+len(sh.Params))
	for k, v := range p.Spec.Params {
		m[k] = v
	}
	for k, v := range sh.Params {
		m[k] = v
	}
	return m
}

// AdmissionRequest describes the plan for trust.Admit.
func (p *Plan) AdmissionRequest() trust.Request {
	r := trust.Request{Subject: "job " + p.Spec.Name, Regime: p.Spec.Regime, SecurityCritical: p.Spec.SecurityCritical}
	for _, in := range p.Inputs {
		r.Inputs = append(r.Inputs, trust.Item{Name: in.Name, Class: in.Class})
	}
	for _, k := range ClassKeys {
		if c, ok := p.Spec.Classes[k]; ok {
			r.Models = append(r.Models, trust.Item{Name: "the job's " + k, Class: c})
		}
	}
	return r
}

// classStrings is the canonical form of a job's classes (nil when none).
func classStrings(cs map[string]trust.Class) map[string]string {
	if len(cs) == 0 {
		return nil
	}
	out := make(map[string]string, len(cs))
	for k, c := range cs {
		out[k] = string(c)
	}
	return out
}

// TotalCost is the sum of the shards' planner prices, saturating at
// math.MaxInt64 (CheckPrices refuses such a plan before it runs anywhere).
func (p *Plan) TotalCost() int64 {
	var n int64
	for _, s := range p.Shards {
		n = receipt.SatAddUnits(n, s.Cost)
	}
	return n
}

// CheckPrices refuses a plan whose shard prices exceed maxShard or whose
// total exceeds maxJob work units (0: no cap of that kind; the total is
// always bounded by receipt.MaxJobUnits). Sums are checked, never wrapped.
func (p *Plan) CheckPrices(maxShard, maxJob int64) error {
	if maxJob <= 0 || maxJob > receipt.MaxJobUnits {
		maxJob = receipt.MaxJobUnits
	}
	var total int64
	for _, s := range p.Shards {
		if maxShard > 0 && s.Cost > maxShard {
			return p.Spec.at(diag.New(diag.PoolPriceCap, "program "+p.Program.Name,
				"cost() prices shard %d at %d work units; this pool caps a shard at %d", s.Index, s.Cost, maxShard), "program").
				WithHelp("lower the program's cost(), or ask the pool's operator about max_shard_units")
		}
		sum, ok := receipt.AddUnits(total, s.Cost)
		if !ok || sum > maxJob {
			return p.Spec.at(diag.New(diag.PoolPriceCap, "program "+p.Program.Name,
				"the shards' prices add up to more than %d work units (at shard %d)", maxJob, s.Index), "program").
				WithHelp("lower the program's cost(), split the job, or ask the pool's operator about max_job_units")
		}
		total = sum
	}
	return nil
}

// CapSteps lowers the plan's per-call step budget to at most steps (0:
// no cap).
func (p *Plan) CapSteps(steps uint64) {
	if steps != 0 && (p.limits.Steps == 0 || p.limits.Steps > steps) {
		p.limits.Steps = steps
	}
}

// Limits returns the budgets each content call of the plan runs under.
func (p *Plan) Limits() script.Limits { return p.limits }

// CapMemory lowers the plan's per-call memory budget to at most bytes: a
// worker's own budget applies whatever the job asks for. It changes no
// result (a call either fits or fails with SC2005), so not the job ID.
func (p *Plan) CapMemory(bytes uint64) {
	if bytes == 0 {
		return
	}
	if p.limits.MemoryBytes == 0 || p.limits.MemoryBytes > bytes {
		p.limits.MemoryBytes = bytes
	}
}
