package aggregator

import (
	"fmt"
	"testing"

	"github.com/scellis/scellis/content"
)

// The plan cache is bounded: past CacheSize the least recently used plan
// goes, so submitting many bundles cannot grow the aggregator's memory.
func TestPlanCacheIsBounded(t *testing.T) {
	p := newPlanner(nil, "", nil, "", ContentCaps{CacheSize: 3})
	ref := func(i int) content.Ref { return content.Hash([]byte(fmt.Sprint(i))) }
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < 3; i++ {
		p.rememberLocked(ref(i), planReply{})
	}
	if _, ok := p.cachedLocked(ref(0)); !ok { // 0 is now the most recent
		t.Fatal("plan 0 missing")
	}
	for i := 3; i < 100; i++ {
		p.rememberLocked(ref(i), planReply{})
		if p.lru.Len() > 3 || len(p.cache) > 3 {
			t.Fatalf("cache holds %d plans, cap 3", len(p.cache))
		}
	}
	if _, ok := p.cachedLocked(ref(1)); ok {
		t.Fatal("the least recently used plan was kept")
	}
	for i := 97; i < 100; i++ {
		if _, ok := p.cachedLocked(ref(i)); !ok {
			t.Fatalf("recent plan %d dropped", i)
		}
	}
}
