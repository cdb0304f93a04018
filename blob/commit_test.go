package blob

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/scellis/scellis/content"
)

// TestGroupCommit: Puts queued while a round runs are made durable by one
// shared round, each returns only after it, every blob is then readable
// under its name, and no temporary file is left behind.
func TestGroupCommit(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Pretend a round is running, so the Puts below queue behind it.
	s.mu.Lock()
	s.committing = true
	s.mu.Unlock()
	const n = 20
	refs := make([]content.Ref, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			refs[i], errs[i] = s.PutBytes(fmt.Appendf(nil, "blob %d", i))
		}()
	}
	// The same bytes twice in one round: one file, both Puts succeed.
	wg.Add(1)
	go func() { defer wg.Done(); s.PutBytes([]byte("blob 0")) }()
	for {
		s.mu.Lock()
		q := len(s.pending)
		s.mu.Unlock()
		if q >= n {
			break
		}
		runtimeGosched()
	}
	for i := range n {
		if s.Has(content.Hash(fmt.Appendf(nil, "blob %d", i))) {
			t.Fatalf("blob %d visible under its name before its round", i)
		}
	}
	// End the pretend round: the next Put becomes the committer and runs
	// one round for everything queued.
	s.mu.Lock()
	s.committing = false
	s.mu.Unlock()
	if _, err := s.PutBytes([]byte("last")); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("put %d: %v", i, errs[i])
		}
		b, err := s.Get(refs[i])
		if err != nil || string(b) != fmt.Sprintf("blob %d", i) {
			t.Fatalf("get %d: %q %v", i, b, err)
		}
	}
	if s.rounds > 2 {
		t.Errorf("%d blobs queued together took %d commit rounds; want them to share one", n+1, s.rounds)
	}
	if left := temporaries(t, dir); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if len(s.pending) != 0 {
		t.Errorf("%d blobs still pending", len(s.pending))
	}
}

// TestRefusedPutLeavesNothing: a refused upload leaves no file, named or
// temporary.
func TestRefusedPutLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir, 8)
	if err := s.Put(content.Hash([]byte("x")), strings.NewReader("y")); err == nil {
		t.Fatal("mismatch accepted")
	}
	big := bytes.Repeat([]byte("a"), 9)
	if err := s.Put(content.Hash(big), bytes.NewReader(big)); err == nil {
		t.Fatal("oversize accepted")
	}
	if left := temporaries(t, dir); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func temporaries(t *testing.T, dir string) []string {
	var left []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".put-") {
			left = append(left, p)
		}
		return nil
	})
	return left
}

// BenchmarkPut: blobs of a shard result's size stored by 1, 4 and 16
// concurrent writers, each Put durable when it returns, as files of their
// own (files: group commit only) and in packs. "vs-serial" is the rate
// against one writer of files in the same run: what group commit and
// packs gain (before both, every blob paid two fsyncs and a file
// creation alone); "vs-files" is packs against files for as many writers.
//
//	go test -run '^$' -bench Put -benchtime 200x ./blob/
func BenchmarkPut(b *testing.B) {
	var serial float64
	files := map[int]float64{}
	for _, c := range []struct {
		writers int
		packed  bool
	}{{1, false}, {4, false}, {16, false}, {1, true}, {4, true}, {16, true}} {
		writers := c.writers
		name := fmt.Sprintf("files/writers=%d", writers)
		if c.packed {
			name = fmt.Sprintf("packed/writers=%d", writers)
		}
		b.Run(name, func(b *testing.B) {
			s, err := Open(b.TempDir(), 0)
			if err != nil {
				b.Fatal(err)
			}
			if !c.packed {
				s.packMax = -1
			}
			var next sync.WaitGroup
			work := make(chan int)
			for range writers {
				next.Add(1)
				go func() {
					defer next.Done()
					for i := range work {
						if _, err := s.PutBytes(fmt.Appendf(bytes.Repeat([]byte{'r'}, 300), "%d-%d", writers, i)); err != nil {
							b.Error(err)
						}
					}
				}()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				work <- i
			}
			close(work)
			next.Wait()
			rate := float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(rate, "blobs/s")
			b.ReportMetric(float64(b.N)/float64(max(s.rounds, 1)), "blobs/round")
			if writers == 1 && !c.packed {
				serial = rate
			} else if serial > 0 {
				b.ReportMetric(rate/serial, "vs-serial")
			}
			if !c.packed {
				files[writers] = rate
			} else if files[writers] > 0 {
				b.ReportMetric(rate/files[writers], "vs-files")
			}
		})
	}
}

func runtimeGosched() { runtime.Gosched() }
