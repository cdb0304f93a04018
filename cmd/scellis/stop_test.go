package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// A node whose close hangs still stops: closeWithin gives up after its
// bound, with every goroutine's stack for the bug report; a close that
// returns passes its error through.
func TestCloseWithinBound(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var out bytes.Buffer
	err := closeWithin(func() error { <-release; return nil }, 50*time.Millisecond, &out, "aggregator agg-1")
	if err == nil || !strings.Contains(out.String(), "goroutine ") || !strings.Contains(out.String(), "exiting anyway") {
		t.Fatalf("a hung close: err %v, output:\n%s", err, out.String())
	}
	want := errors.New("raft: closed badly")
	if err := closeWithin(func() error { return want }, time.Minute, &out, "aggregator agg-1"); err != want {
		t.Fatalf("a close that returned: %v", err)
	}
}
