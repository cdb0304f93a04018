package script

import (
	"context"
	"testing"
	"time"
)

// BenchmarkMultiplyOverhead measures what the memory-checked multiplication
// (repeat.go) costs: the same loop with n += i * 3 against n += i + 3,
// reported as a ratio.
func BenchmarkMultiplyOverhead(b *testing.B) {
	loop := func(op string) time.Duration {
		e := entry(b, "loop.star", "def run(params, inputs):\n    n = 0\n    for i in range(params[\"n\"]):\n        n += i "+op+" 3\n    return n\n")
		start := time.Now()
		if _, err := Call(context.Background(), Env{}, e, "run", map[string]any{"n": 200_000}, nil); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var mul, add time.Duration
	for b.Loop() {
		add += loop("+")
		mul += loop("*")
	}
	b.ReportMetric(float64(mul)/float64(add), "mul/add")
}
