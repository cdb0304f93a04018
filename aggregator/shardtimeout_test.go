package aggregator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/trust"
)

// A shard whose native never ends on its own (the issue's
// model.train(epochs=10**12)) is stopped by the worker's shard_timeout: the
// worker hands the lease back, its only slot is free again and it leases
// again; stopping the worker (SIGINT) returns at once too.
func TestShardTimeoutStopsAnEndlessNative(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, trust.Own, 1, Options{})
	released := make(chan string, 16)
	p.shardTimeout = time.Second
	p.workerLog = func(format string, args ...any) {
		if msg := fmt.Sprintf(format, args...); strings.Contains(msg, "handing the lease back") {
			select {
			case released <- msg:
			default:
			}
		}
	}
	path := p.writeJob(map[string]string{
		"data.csv": "x1,x2,y\n1,2,0\n2,1,1\n3,3,0\n0,1,1\n",
		"p.star": `
def run(params, inputs):
    if params["endless"]:
        model.train(data = inputs["data"], epochs = 1000000000000)
    return {"v": params["endless"]}
`,
		"job.yaml": `name: endless
program: ./p.star
partitioner: {use: items, params: {items: [{endless: 1}]}}
reducer: concat
inputs:
  data: {path: data.csv, label: y, class: confidential}
limits: {steps: 1000000000000000}
`,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // hang detector only
	defer cancel()
	plan, err := p.compile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	stop := p.startWorkers(1, 20*time.Millisecond)
	if _, err := submit(ctx, p.client("alice"), p.fed, plan); err != nil {
		t.Fatal(err)
	}
	// Two hand-backs: the first run timed out, the slot was freed, and the
	// worker leased (and ran) the shard again.
	for i := range 2 {
		select {
		case msg := <-released:
			if !strings.Contains(msg, "cancelled") {
				t.Fatalf("hand-back %d: %s", i+1, msg)
			}
		case <-ctx.Done():
			t.Fatalf("the worker handed the endless shard back %d times, want 2\n%s", i, p.log.String())
		}
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("stopping the worker waited on the endless native")
	}
}
