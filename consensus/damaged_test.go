package consensus

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
)

// One damaged byte in a committed entry of a sealed segment of the log on
// disk (raft-wal checks only the tail it recovers, dropping a torn tail
// write): the node refuses to start with SC8002 and the recovery steps,
// instead of panicking in Apply at every start (the drill's 1 flip in 20).
func TestDamagedLogEntryRefusedAtStart(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, func(cfg *Config) { cfg.SegmentSize = 1024 })
	leader := c.waitLeader()
	var ref chain
	c.applyN(leader, "before", 3, &ref)
	marker := []byte("MARKER-entry-to-damage")
	c.apply(leader, marker)
	ref.add(marker)
	c.applyN(leader, "after", 40, &ref) // seals the marker's segment
	c.stop(leader)

	segs, _ := filepath.Glob(filepath.Join(c.dirs[leader], "wal", "*.wal"))
	damaged := false
	for _, seg := range segs {
		b, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(b, marker); i > 0 {
			b[i-1] = 0xff // the command's CBOR length header: now a stray break
			if err := os.WriteFile(seg, b, 0o600); err != nil {
				t.Fatal(err)
			}
			damaged = true
		}
	}
	if !damaged {
		t.Fatalf("the marker entry is in none of %v", segs)
	}
	n, err := Open(c.config(leader, listen(t, c.addrs[leader]), c.boot), &chainSM{})
	if err == nil {
		n.Close()
		t.Fatal("a node with a damaged log entry started")
	}
	ds, ok := diag.As(err)
	if !ok || ds[0].Code != diag.ConsensusStore || !strings.Contains(ds[0].Message, "damaged") || !strings.Contains(ds[0].Help, "empty data directory") {
		t.Fatalf("want SC8002 naming the damaged entry with the recovery steps, got %v", err)
	}
}
