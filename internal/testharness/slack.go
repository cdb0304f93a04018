package testharness

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// Slack is the factor by which a test scales what it waits for and the
// deadlines it gives the components it starts. SCELLIS_TEST_SLACK (a
// factor, at least 1) sets it; otherwise it grows with the machine's load
// per core when the test binary starts: 1 up to 4 runnable processes per
// core, then in proportion, at most 4. A step that takes one election
// timeout on an idle machine can take ten when two cores are shared with
// forty busy processes (and -race slows the test's own side further).
var Slack = sync.OnceValue(func() float64 {
	if f, err := strconv.ParseFloat(os.Getenv("SCELLIS_TEST_SLACK"), 64); err == nil && f >= 1 {
		return f
	}
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 1
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 1
	}
	load, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return 1
	}
	return min(max(load/float64(runtime.NumCPU())/4, 1), 4)
})
