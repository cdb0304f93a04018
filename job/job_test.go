package job

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
)

func builtin(t *testing.T) *catalog.Catalog {
	t.Helper()
	c, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// compileFiles writes files into a fresh folder and compiles job.yaml.
func compileFiles(t *testing.T, files map[string]string) *Plan {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec, err := LoadSpec(filepath.Join(dir, "job.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(context.Background(), spec, builtin(t))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const prog = `def run(params, inputs):
    return {"y": params["x"] * 2 + helper()}

load("lib", "helper")
`

const lib = `def helper():
    return 1
`

const data = "a,y\n1,0\n2,1\n3,0\n4,1\n"

const jobA = `name: ids
program: ./prog.star
partitioner:
  use: items
  params: {items: [{x: 1}, {x: 2}, {x: 3}]}
reducer: {use: sum}
params: {scale: 1.5, tags: [a, b]}
inputs:
  d: {path: d.csv, label: y, class: public}
`

// The same job written with keys reordered, flow style and other
// whitespace: the same canonical spec, so the same ID.
const jobB = `
reducer:
    use:    sum
inputs:   {d: {class: public, label: y, path: d.csv}}
params:
  tags:
    - a
    - b
  scale: 1.5
partitioner: {params: {items: [{x: 1}, {x: 2}, {x: 3}]}, use: items}
program: "./prog.star"
name: ids
`

func TestJobIDStableUnderFormatting(t *testing.T) {
	// load() resolves by catalog name: add the library to the catalog first.
	a := compileWithLib(t, jobA, prog, lib, data)
	b := compileWithLib(t, jobB, prog, lib, data)
	if a.ID != b.ID {
		t.Fatalf("reformatting changed the job ID: %s vs %s", a.ID, b.ID)
	}
	for i := range a.Shards {
		if a.Shards[i].ID != b.Shards[i].ID {
			t.Fatalf("shard %d ID changed", i)
		}
	}
}

func TestJobIDSensitiveToContent(t *testing.T) {
	base := compileWithLib(t, jobA, prog, lib, data)
	cases := map[string]*Plan{
		"one character of the program": compileWithLib(t, jobA, strings.Replace(prog, "* 2", "* 3", 1), lib, data),
		"one character of a library":   compileWithLib(t, jobA, prog, "def helper():\n    return 2\n", data),
		"one byte of the input data":   compileWithLib(t, jobA, prog, lib, data[:len(data)-2]+"0\n"),
		"a parameter":                  compileWithLib(t, jobA+"limits: {steps: 5000}\n", prog, lib, data),
	}
	for what, p := range cases {
		if p.ID == base.ID {
			t.Errorf("changing %s did not change the job ID", what)
		}
	}
}

func compileWithLib(t *testing.T, jobYAML, progSrc, libSrc, csv string) *Plan {
	t.Helper()
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("job.yaml", jobYAML)
	write("prog.star", progSrc)
	write("d.csv", csv)
	cat := builtin(t)
	e, err := catalog.Parse("lib.star", []byte(libSrc))
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.Add(e); err != nil {
		t.Fatal(err)
	}
	spec, err := LoadSpec(filepath.Join(dir, "job.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(context.Background(), spec, cat)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestShardIDsDistinctAndPriced(t *testing.T) {
	p := compileWithLib(t, jobA, prog, lib, data)
	seen := map[content.Ref]bool{}
	for _, s := range p.Shards {
		if seen[s.ID] {
			t.Fatalf("duplicate shard ID %s", s.ID)
		}
		seen[s.ID] = true
		if s.Cost != 1 {
			t.Fatalf("flat price expected without cost(): %d", s.Cost)
		}
	}
	if p.TotalCost() != 3 {
		t.Fatalf("total cost %d", p.TotalCost())
	}
}

// Law 9: the reduction is in shard-index order whatever the arrival order.
func TestReduceOrderIsCanonical(t *testing.T) {
	p := compileFiles(t, map[string]string{
		"job.yaml": `name: order
program: ./p.star
partitioner: {use: items, params: {items: [{x: 1}, {x: 2}, {x: 3}, {x: 4}, {x: 5}]}}
reducer: concat
`,
		"p.star": "def run(params, inputs):\n    return [params[\"x\"]]\n",
	})
	ctx := context.Background()
	var results []*Result
	for _, sh := range p.Shards {
		r, err := p.Execute(ctx, sh)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
	}
	want, err := p.Reduce(ctx, results)
	if err != nil {
		t.Fatal(err)
	}
	wb, _ := content.Encode(want)
	for i := 0; i < 20; i++ {
		shuffled := append([]*Result(nil), results...)
		rand.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		got, err := p.Reduce(ctx, shuffled)
		if err != nil {
			t.Fatal(err)
		}
		gb, _ := content.Encode(got)
		if string(gb) != string(wb) {
			t.Fatalf("arrival order changed the reduction: %v vs %v", got, want)
		}
	}
}

// A bundle compiles to the same job on a peer that has none of the
// submitter's files.
func TestBundleRoundTripKeepsJobID(t *testing.T) {
	p := compileWithLib(t, jobA, prog, lib, data)
	b := p.Bundle()
	enc, err := content.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	var back Bundle
	if err := content.Decode(enc, &back); err != nil {
		t.Fatal(err)
	}
	sources, inputs := p.Blobs()
	fetch := func(_ context.Context, ref content.Ref) ([]byte, error) {
		if s, ok := sources[ref]; ok {
			return s, nil
		}
		if path, ok := inputs[ref]; ok {
			return os.ReadFile(path)
		}
		return nil, os.ErrNotExist
	}
	q, err := CompileBundle(context.Background(), &back, catalog.New(), fetch, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if q.ID != p.ID || len(q.Shards) != len(p.Shards) || q.Shards[2].ID != p.Shards[2].ID {
		t.Fatalf("bundle compiled to another job: %s vs %s", q.ID, p.ID)
	}
}

// A cached input file is re-hashed before use: one whose bytes no longer
// match its ref is fetched again, and fetched bytes that do not match the
// ref are refused. CSV errors about a fetched input never quote it.
func TestCompileBundleRehashesCachedInputs(t *testing.T) {
	p := compileWithLib(t, jobA, prog, lib, data)
	b := p.Bundle()
	sources, inputs := p.Blobs()
	fetches := 0
	var tamper func([]byte) []byte
	fetch := func(_ context.Context, ref content.Ref) ([]byte, error) {
		if s, ok := sources[ref]; ok {
			return s, nil
		}
		if path, ok := inputs[ref]; ok {
			fetches++
			d, err := os.ReadFile(path)
			if tamper != nil {
				d = tamper(d)
			}
			return d, err
		}
		return nil, os.ErrNotExist
	}
	dir := t.TempDir()
	if _, err := CompileBundle(context.Background(), b, catalog.New(), fetch, dir); err != nil {
		t.Fatal(err)
	}
	var in BundleInput
	for _, v := range b.Inputs {
		in = v
	}
	cached := filepath.Join(dir, in.Ref.Hex()+".csv")
	if err := os.WriteFile(cached, []byte("x,label\nsecret-cell,1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := fetches
	q, err := CompileBundle(context.Background(), b, catalog.New(), fetch, dir)
	if err != nil || q.ID != p.ID || fetches != before+1 {
		t.Fatalf("tampered cache: err %v, fetches %d→%d", err, before, fetches)
	}
	// Fetched bytes that do not hash to the ref are refused.
	os.Remove(cached)
	tamper = func(d []byte) []byte { return append(d, '\n') }
	if _, err := CompileBundle(context.Background(), b, catalog.New(), fetch, dir); err == nil || !strings.Contains(err.Error(), "hash to") {
		t.Fatalf("mismatched fetch: %v", err)
	}
	// A fetched input that is not a usable table: the diagnostic names the
	// check, not the cells.
	bad := []byte("label,feature\n1,secret-cell-value\n")
	badRef := content.Hash(bad)
	b2 := *b
	b2.Inputs = map[string]BundleInput{"data": {Ref: badRef, Label: "label", Class: in.Class}}
	fetchBad := func(ctx context.Context, ref content.Ref) ([]byte, error) {
		if ref == badRef {
			return bad, nil
		}
		return fetch(ctx, ref)
	}
	_, err = CompileBundle(context.Background(), &b2, catalog.New(), fetchBad, t.TempDir())
	if err == nil || strings.Contains(err.Error(), "secret-cell") || strings.Contains(err.Error(), "feature") {
		t.Fatalf("bad fetched table: %v", err)
	}
}
