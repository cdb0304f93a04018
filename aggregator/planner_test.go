package aggregator

import (
	"fmt"
	"testing"

	"github.com/scellis/scellis/blob"
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

// A child uses a blob its parent handed over only if it hashes to its ref
// (law 14), reads the rest from the store, and the parent hands over
// only small blobs, within sendMax in all.
func TestChildBlobsRehashed(t *testing.T) {
	store, err := blob.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := store.PutBytes([]byte("in the store"))
	if err != nil {
		t.Fatal(err)
	}
	good, bad := content.Hash([]byte("good")), content.Hash([]byte("bad"))
	c := &childBlobs{sent: map[content.Ref][]byte{good: []byte("good"), bad: []byte("tampered")}, store: store}
	if b, err := c.get(good); err != nil || string(b) != "good" {
		t.Fatalf("handed over: %q %v", b, err)
	}
	if _, err := c.get(bad); err == nil {
		t.Fatal("a handed-over blob that does not hash to its ref was used")
	}
	if b, err := c.get(stored); err != nil || string(b) != "in the store" {
		t.Fatalf("from the store: %q %v", b, err)
	}

	s := &sent{blobs: map[content.Ref][]byte{}}
	big := make([]byte, blob.PackThreshold+1)
	s.add(content.Hash(big), big)
	if len(s.blobs) != 0 {
		t.Fatal("a blob larger than a packed one was handed over")
	}
	small := make([]byte, blob.PackThreshold)
	for i := 0; s.size+len(small) <= sendMax; i++ {
		small[0], small[1] = byte(i), byte(i>>8)
		s.add(content.Hash(small), append([]byte(nil), small...))
	}
	n := len(s.blobs)
	small[2] = 1
	s.add(content.Hash(small), small)
	if len(s.blobs) != n || s.size > sendMax {
		t.Fatalf("handed over %d bytes, more than sendMax %d", s.size, sendMax)
	}
}
