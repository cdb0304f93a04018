package main

import (
	"context"
	"strings"
	"testing"

	"github.com/scellis/scellis/coordinator"
)

// A run whose replicated state holds no start time (launched before the
// pool kept StartRun's time) is not said to have started in 1970.
func TestStartedLineWithoutStartTime(t *testing.T) {
	if got := startedLine(context.Background(), nil, coordinator.RunStatus{}); strings.Contains(got, "1970") || !strings.Contains(got, "not recorded") {
		t.Fatalf("a run without a start time: %q", got)
	}
	if got := startedLine(context.Background(), nil, coordinator.RunStatus{StartedAt: 1796655089900}); got != "started 2026-12-07T14:51:29Z" {
		t.Fatalf("a run started at 1796655089900 ms: %q", got)
	}
}
