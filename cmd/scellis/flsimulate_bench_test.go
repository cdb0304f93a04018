package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/datagen"
	"github.com/scellis/scellis/fl"
)

// BenchmarkFLSimulate measures fl simulate on datagen hospitals (50 rows a
// site, FedAvg, one epoch, DP off): "round" is one training round over
// every site (ns/op; rounds/s reported), "stats" the feature-statistics
// step over the same sites, so the statistics' cost reads as a ratio of a
// round measured in the same run.
//
//	go test ./cmd/scellis -run '^$' -bench FLSimulate -benchtime 3x
//
// Under -short (CI runs every benchmark once that way) only sites=10 runs.
func BenchmarkFLSimulate(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		dir := b.TempDir()
		written := false
		load := func(b *testing.B, standardize string) *flSim {
			if testing.Short() && n > 10 {
				b.Skipf("-short: sites=%d skipped (sites=10 runs the same steps)", n)
			}
			if !written {
				sites, err := datagen.Hospitals(n, 50, 1)
				if err != nil {
					b.Fatal(err)
				}
				for _, s := range sites {
					writeCSV(b, filepath.Join(dir, s.Name+".csv"), s.Data)
				}
				written = true
			}
			cat, err := catalog.Builtin()
			if err != nil {
				b.Fatal(err)
			}
			spec := &fl.RunSpec{Name: "bench", Strategy: "fedavg", Params: map[string]any{"lr": 0.5, "epochs": int64(1)},
				Model: fl.ModelSpec{Kind: "logistic", Inputs: 9, Label: datagen.HospitalLabel}, Dataset: "patients",
				Rounds: 1, MinCohort: 3, Seed: 1, Standardize: standardize}
			s := &flSim{unit: fl.UnitRecord, out: io.Discard}
			if err := s.load(spec, cat, filepath.Join(dir, "run.yaml"), dir, "", ""); err != nil {
				b.Fatal(err)
			}
			return s
		}
		b.Run(fmt.Sprintf("sites=%d/round", n), func(b *testing.B) {
			s := load(b, fl.StandardizeLocal)
			b.ResetTimer()
			for b.Loop() {
				s.rows = nil
				if err := s.run(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rounds/s")
		})
		b.Run(fmt.Sprintf("sites=%d/stats", n), func(b *testing.B) {
			s := load(b, fl.StandardizeFederated)
			b.ResetTimer()
			for b.Loop() {
				if err := s.statsStep(context.Background(), func(fl.RoundSummary) {}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
