package silo

import (
	"context"
	"sync"

	"github.com/scellis/scellis/content"
)

// runBlobs keeps the blobs that stay the same for every round of a run —
// its canonical spec and its strategy's source — so that a silo fetches
// them once per run rather than once per round (issue 19: every fetch is
// a round trip on the round's critical path). Blobs are named by their
// hash and checked on arrival, so a cached copy is the blob. The cache is
// small and bounded: it holds the runs a silo is taking part in now.
type runBlobs struct {
	mu sync.Mutex
	m  map[content.Ref][]byte
}

// maxRunBlobs bounds the cache: a few concurrent runs' specs and
// strategies (each a few KiB).
const maxRunBlobs = 32

func (c *runBlobs) get(ref content.Ref) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.m[ref]
	return b, ok
}

func (c *runBlobs) put(ref content.Ref, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[content.Ref][]byte{}
	}
	if len(c.m) >= maxRunBlobs {
		for k := range c.m { // drop one: the runs of long ago
			delete(c.m, k)
			break
		}
	}
	c.m[ref] = b
}

// runBlob returns the blob ref of a run (its spec or its strategy) from
// the cache, or fetches and caches it. The bytes are shared: callers
// decode them and never write into them.
func (a *Appliance) runBlob(ctx context.Context, ref content.Ref) ([]byte, error) {
	if b, ok := a.runCache.get(ref); ok {
		return b, nil
	}
	b, err := a.blobs().GetBlob(ctx, ref)
	if err != nil {
		return nil, err
	}
	a.runCache.put(ref, b)
	return b, nil
}

// prefetch starts fetching a run blob (runBlob) in the background and
// returns a function that waits for it: the run spec is fetched while the
// round bundle is, instead of after it.
func (a *Appliance) prefetch(ctx context.Context, ref content.Ref) func() ([]byte, error) {
	if b, ok := a.runCache.get(ref); ok {
		return func() ([]byte, error) { return b, nil }
	}
	type got struct {
		b   []byte
		err error
	}
	ch := make(chan got, 1)
	go func() {
		b, err := a.runBlob(ctx, ref)
		ch <- got{b, err}
	}()
	return func() ([]byte, error) {
		g := <-ch
		return g.b, g.err
	}
}

// fetchAsync starts fetching blob ref (not cached) and returns a function
// that waits for it.
func (a *Appliance) fetchAsync(ctx context.Context, ref content.Ref) func() ([]byte, error) {
	type got struct {
		b   []byte
		err error
	}
	ch := make(chan got, 1)
	go func() {
		b, err := a.blobs().GetBlob(ctx, ref)
		ch <- got{b, err}
	}()
	return func() ([]byte, error) {
		g := <-ch
		return g.b, g.err
	}
}
