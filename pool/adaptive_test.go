package pool

import (
	"testing"
	"time"
)

// TestAdaptiveDepth: an adaptive worker leases ahead only as far as its
// shards are short against a lease round trip — none before it has
// measured both, none for long shards, the maximum for trivial ones —
// and follows a change of job within a few shards.
func TestAdaptiveDepth(t *testing.T) {
	var p pace
	if d := p.depth(2); d != 2 {
		t.Fatalf("unmeasured: depth %d; want Parallel (2)", d)
	}
	p.leased(5 * time.Millisecond)
	for range 20 {
		p.shard(10 * time.Second) // long shards
	}
	if d := p.depth(2); d != 2 {
		t.Fatalf("10 s shards leased in 5 ms: depth %d; want Parallel (2)", d)
	}
	for range 40 {
		p.shard(100 * time.Microsecond) // trivial shards
	}
	if d := p.depth(1); d != maxAdaptiveDepth {
		t.Fatalf("0.1 ms shards leased in 5 ms: depth %d; want %d", d, maxAdaptiveDepth)
	}
	for range 40 {
		p.shard(2 * time.Millisecond)
	}
	if d := p.depth(1); d < 5 || d > 6 {
		t.Fatalf("2 ms shards leased in 5 ms: depth %d; want 1 + 2×5/2", d)
	}
}
