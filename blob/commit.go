package blob

import (
	"os"
	"path/filepath"
	"sync"
)

// Group commit. A file blob is durable once its bytes are fsync'd, it is renamed
// to its ref's name, and that name's folder is fsync'd (without the last
// step a crash can lose the rename). Done blob by blob that is two fsyncs
// in a row per blob, and fsyncs, not bytes, bound a pool of trivial shards.
// So Puts queue their written temporary files, and one of them at a time
// (the committer) runs commit rounds for everyone queued: the round's files
// are fsync'd together, renamed, and each folder they landed in is fsync'd
// once. Puts arriving during a round queue for the next one. A lone Put
// pays what it paid before; concurrent Puts share two fsync waits per
// round. A blob becomes visible under its name only after its bytes are
// durable, so a crash never leaves a named file with partial bytes; it
// may leave .put-* temporaries, which no reader looks at. Small blobs
// skip the files altogether: a round appends them to a pack with one
// write and one fsync (pack.go).

// staged is one written blob waiting for a commit round: a temporary
// file, or (f nil) a small blob's bytes bound for the pack (pack.go).
type staged struct {
	f    *os.File // the temporary file, still open
	data []byte   // the bytes of a packed blob
	sum  [32]byte // their sha256
	path string   // its final name (or, packed, the name it would have)
	err  error
	done chan struct{}
}

// syncParallel bounds the fsyncs one round issues at once.
const syncParallel = 16

// commit queues st and returns once a round has made it durable (or
// failed it). The caller that finds no round running runs rounds until
// the queue is empty.
func (s *Store) commit(st *staged) error {
	st.done = make(chan struct{})
	s.mu.Lock()
	s.queue = append(s.queue, st)
	if s.pending == nil {
		s.pending = map[string]*staged{}
	}
	s.pending[st.path] = st
	if s.committing {
		s.mu.Unlock()
		<-st.done
		return st.err
	}
	s.committing = true
	for len(s.queue) > 0 {
		round := s.queue
		s.queue = nil
		s.mu.Unlock()
		s.commitRound(round)
		s.mu.Lock()
		s.rounds++
		for _, r := range round {
			if s.pending[r.path] == r {
				delete(s.pending, r.path)
			}
			close(r.done)
		}
	}
	s.committing = false
	s.mu.Unlock()
	return st.err
}

// committingPath returns the queued or committing blob named path, if any.
func (s *Store) committingPath(path string) *staged {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending[path]
}

// commitRound makes every blob of round durable: the packed ones by one
// append and fsync of the pack, beside the files' steps.
func (s *Store) commitRound(round []*staged) {
	var files, packed []*staged
	for _, st := range round {
		if st.f == nil {
			packed = append(packed, st)
		} else {
			files = append(files, st)
		}
	}
	var wg sync.WaitGroup
	if len(packed) > 0 {
		wg.Go(func() { s.appendRound(packed) })
	}
	if len(files) > 0 {
		commitFiles(files)
	}
	wg.Wait()
}

// commitFiles makes every file blob of round durable under its name: fsync
// the files, rename them into place, fsync each folder once. A blob whose
// step fails gets the error and its temporary file removed.
func commitFiles(round []*staged) {
	each(len(round), func(i int) {
		st := round[i]
		st.err = st.f.Sync()
		if cerr := st.f.Close(); st.err == nil {
			st.err = cerr
		}
	})
	dirs := map[string][]*staged{}
	for _, st := range round {
		if st.err == nil {
			st.err = os.Rename(st.f.Name(), st.path)
		}
		if st.err != nil {
			os.Remove(st.f.Name())
			continue
		}
		d := filepath.Dir(st.path)
		dirs[d] = append(dirs[d], st)
	}
	names := make([]string, 0, len(dirs))
	for d := range dirs {
		names = append(names, d)
	}
	each(len(names), func(i int) {
		if err := syncDir(names[i]); err != nil {
			for _, st := range dirs[names[i]] {
				st.err = err
			}
		}
	})
}

// each runs f(0..n-1), at most syncParallel at once.
func each(n int, f func(i int)) {
	if n == 1 {
		f(0)
		return
	}
	sem := make(chan struct{}, syncParallel)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(i)
		}()
	}
	wg.Wait()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
