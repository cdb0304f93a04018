package pool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/job"
)

func plan(t *testing.T, shards int) *job.Plan {
	t.Helper()
	dir := t.TempDir()
	spec := `name: t
program: montecarlo-pi
partitioner: {use: range, params: {count: 2000, chunks: ` + strconv.Itoa(shards) + `}}
reducer: {use: mean, params: {weight: samples}}
`
	os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(spec), 0o644)
	s, err := job.LoadSpec(filepath.Join(dir, "job.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, err := job.Compile(context.Background(), s, cat)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLocalRunsEveryShardAndReportsProgress(t *testing.T) {
	p := plan(t, 12)
	var events atomic.Int32
	l := &Local{Workers: 3, Progress: func(e Event) {
		events.Add(1)
		if e.Total != 12 {
			t.Errorf("total %d", e.Total)
		}
	}}
	out, err := l.Run(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Results) != 12 || events.Load() != 12 {
		t.Fatalf("results %d events %d", len(out.Results), events.Load())
	}
	for i, r := range out.Results {
		if r == nil || r.Index != i {
			t.Fatalf("result %d missing or misplaced", i)
		}
	}
	pi := out.Reduced.(map[string]any)["pi"].(float64)
	if pi < 2.9 || pi > 3.4 {
		t.Fatalf("pi = %v", pi)
	}
}

// --verify catches an executor whose results differ between executions.
func TestVerifyFlagsNonDeterminism(t *testing.T) {
	p := plan(t, 4)
	var calls atomic.Int32
	l := &Local{Verify: true, execute: func(p *job.Plan, ctx context.Context, sh job.Shard) (*job.Result, error) {
		n := calls.Add(1)
		return job.NewResult(sh, map[string]any{"call": int64(n)})
	}}
	_, err := l.Run(context.Background(), p)
	ds, ok := diag.As(err)
	if !ok || ds[0].Code != diag.NonDeterministic || len(ds) != 4 {
		t.Fatalf("want 4 SC2011 diagnostics, got %v", err)
	}
}

func TestFirstShardErrorStopsTheRun(t *testing.T) {
	p := plan(t, 8)
	boom := errors.New("boom")
	l := &Local{Workers: 2, execute: func(p *job.Plan, ctx context.Context, sh job.Shard) (*job.Result, error) {
		if sh.Index == 3 {
			return nil, boom
		}
		return p.Execute(ctx, sh)
	}}
	if _, err := l.Run(context.Background(), p); !errors.Is(err, boom) {
		t.Fatalf("want boom, got %v", err)
	}
}

func TestCancelledContext(t *testing.T) {
	p := plan(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := (&Local{}).Run(ctx, p); err == nil {
		t.Fatal("cancelled run succeeded")
	}
}
