package job

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/trust"
)

// Bundle is a job with every piece of content and every input named by
// ref: what a remote peer, or the aggregator's planner, needs to compile
// the same plan — the same job ID, the same shards, the same prices —
// without the submitter's files. It travels as a content-addressed blob;
// the content sources and input files travel as blobs beside it.
type Bundle struct {
	Format           string                 `cbor:"format" json:"format"`
	Name             string                 `cbor:"name" json:"name"`
	Regime           string                 `cbor:"regime" json:"regime"`
	SecurityCritical bool                   `cbor:"security_critical" json:"security_critical"`
	Program          content.Ref            `cbor:"program" json:"program"`
	Partitioner      BundleUse              `cbor:"partitioner" json:"partitioner"`
	Reducer          BundleUse              `cbor:"reducer" json:"reducer"`
	Content          map[string]content.Ref `cbor:"content" json:"content"` // every entry by name, libraries included, so load("name") resolves
	Params           map[string]any         `cbor:"params" json:"params"`
	Inputs           map[string]BundleInput `cbor:"inputs" json:"inputs"`
	Verification     Verification           `cbor:"verification" json:"verification"`
	Limits           Limits                 `cbor:"limits" json:"limits"`
	// Classes are the job's classes (Spec.Classes), omitted when none.
	Classes map[string]string `cbor:"classes,omitempty" json:"classes,omitempty"`
}

// BundleUse is a content ref and its parameters.
type BundleUse struct {
	Ref    content.Ref    `cbor:"ref" json:"ref"`
	Params map[string]any `cbor:"params" json:"params"`
}

// BundleInput is an input by ref.
type BundleInput struct {
	Ref   content.Ref `cbor:"ref" json:"ref"`
	Label string      `cbor:"label" json:"label"`
	Class string      `cbor:"class" json:"class"`
}

const bundleFormat = "scellis/bundle/v1"

// Bundle returns the plan as a bundle.
func (p *Plan) Bundle() *Bundle {
	b := &Bundle{
		Format:           bundleFormat,
		Name:             p.Spec.Name,
		Regime:           string(p.Spec.Regime),
		SecurityCritical: p.Spec.SecurityCritical,
		Program:          p.Program.Ref,
		Partitioner:      BundleUse{p.Partitioner.Ref, p.Spec.Partitioner.Params},
		Reducer:          BundleUse{p.Reducer.Ref, p.Spec.Reducer.Params},
		Content:          map[string]content.Ref{},
		Params:           p.Spec.Params,
		Inputs:           map[string]BundleInput{},
		Verification:     p.Spec.Verification,
		Limits:           p.Spec.Limits,
		Classes:          classStrings(p.Spec.Classes),
	}
	for _, c := range p.Content {
		b.Content[c.Name] = c.Ref
	}
	for _, in := range p.Inputs {
		b.Inputs[in.Name] = BundleInput{in.Ref, in.Label, string(in.Class)}
	}
	return b
}

// Blobs returns what must be uploaded beside the bundle: content sources
// by ref, and input files by ref (as local paths, to stream them).
func (p *Plan) Blobs() (sources map[content.Ref][]byte, inputs map[content.Ref]string) {
	sources = map[content.Ref][]byte{}
	for _, c := range p.Content {
		if e, ok := p.catalog.Lookup(string(c.Ref)); ok {
			sources[c.Ref] = e.Source
		}
	}
	inputs = map[content.Ref]string{}
	for _, in := range p.Inputs {
		inputs[in.Ref] = in.Path
	}
	return sources, inputs
}

// Fetcher returns the bytes of a blob; it must check them against the ref.
type Fetcher func(ctx context.Context, ref content.Ref) ([]byte, error)

// CompileBundle compiles a bundle into a plan. Content is taken from local
// (the peer's own catalog) when it holds the same ref, else fetched; inputs
// are fetched into cacheDir. The caller compares the resulting ID with the
// one it was told: a mismatch means the bundle is not the job it claims.
//
// caps are the operator's bounds on content calls; the job's own limits
// may only lower them (see CompileCapped).
func CompileBundle(ctx context.Context, b *Bundle, local *catalog.Catalog, fetch Fetcher, cacheDir string, caps ...script.Limits) (*Plan, error) {
	return compileBundle(ctx, b, local, fetch, cacheDir, true, caps)
}

func compileBundle(ctx context.Context, b *Bundle, local *catalog.Catalog, fetch Fetcher, cacheDir string, partition bool, caps []script.Limits) (*Plan, error) {
	if b.Format != bundleFormat {
		return nil, diag.New(diag.InvalidValue, "bundle", "unknown bundle format %q", b.Format).
			WithHelp("the submitter runs a different Scellis version")
	}
	cat := catalog.New()
	for name, ref := range b.Content {
		var src []byte
		if e, ok := local.Lookup(string(ref)); ok {
			src = e.Source
		} else {
			var err error
			if src, err = fetch(ctx, ref); err != nil {
				return nil, fmt.Errorf("fetching content %s (%s): %w", name, ref.Short(), err)
			}
		}
		e, err := catalog.Parse(name+".star", src)
		if err != nil {
			return nil, err
		}
		if e.Ref != ref {
			return nil, fmt.Errorf("content %s: fetched bytes hash to %s, not %s", name, e.Ref.Short(), ref.Short())
		}
		if err := cat.Add(e); err != nil {
			return nil, err
		}
	}
	regime := trust.Regime(b.Regime)
	var classes map[string]trust.Class
	for k, v := range b.Classes {
		c, err := trust.ParseClass(v)
		if err != nil || !slices.Contains(ClassKeys, k) {
			return nil, diag.New(diag.UnknownInputClass, "bundle", "class %q of %q is not one a job can have", v, k).
				WithHelp("a job classes its content and model as public or confidential; the bundle was not made by scellis job submit")
		}
		if classes == nil {
			classes = map[string]trust.Class{}
		}
		classes[k] = c
	}
	spec := &Spec{
		Name:             b.Name,
		Regime:           regime,
		SecurityCritical: b.SecurityCritical,
		Program:          string(b.Program),
		Partitioner:      Use{string(b.Partitioner.Ref), nonNil(b.Partitioner.Params)},
		Reducer:          Use{string(b.Reducer.Ref), nonNil(b.Reducer.Params)},
		Params:           nonNil(b.Params),
		Inputs:           map[string]Input{},
		Verification:     b.Verification,
		Limits:           b.Limits,
		Classes:          classes,
		File:             filepath.Join(cacheDir, "bundle.yaml"),
	}
	if len(b.Inputs) > 0 {
		if err := os.MkdirAll(cacheDir, 0o700); err != nil {
			return nil, err
		}
	}
	for name, in := range b.Inputs {
		// Decoding validated the ref already (content.Ref refuses anything
		// but sha256:<64 lowercase hex>); a bundle built in memory is checked
		// here, before the ref becomes a file name.
		if !content.IsRef(string(in.Ref)) {
			return nil, diag.New(diag.InvalidValue, "inputs."+name, "input ref is not sha256:<64 lowercase hex digits>").
				WithHelp("the bundle was not made by scellis job submit")
		}
		file := in.Ref.Hex() + ".csv"
		path := filepath.Join(cacheDir, file)
		if err := cacheInput(ctx, path, in.Ref, fetch); err != nil {
			return nil, fmt.Errorf("fetching input %s (%s): %w", name, in.Ref.Short(), err)
		}
		// Relative to the spec's folder, which is cacheDir.
		spec.Inputs[name] = Input{Path: file, Label: in.Label, Class: trust.Class(in.Class)}
	}
	spec.fetched = true
	return compile(ctx, spec, cat, caps, partition)
}

// cacheInput makes path hold the bytes of ref: a cached file is re-hashed
// before use (law 14) and replaced when it does not match; fetched bytes
// are checked against the ref before they are written.
func cacheInput(ctx context.Context, path string, ref content.Ref, fetch Fetcher) error {
	if got, err := hashFile(path); err == nil && got == ref {
		return nil
	}
	data, err := fetch(ctx, ref)
	if err != nil {
		return err
	}
	if got := content.Hash(data); got != ref {
		return fmt.Errorf("fetched bytes hash to %s, not %s", got.Short(), ref.Short())
	}
	return WriteFileAtomic(path, data)
}

func nonNil(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}
