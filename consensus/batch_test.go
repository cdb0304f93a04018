package consensus

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"
)

// heldLeader starts three nodes with inflight in-flight batches and holds
// the leader's state machine on its next command until release (called
// at the latest when the test ends).
func heldLeader(t *testing.T, inflight int) (*testCluster, *Node, *gate, func()) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.MaxInflightBatches = inflight })
	leader := c.waitLeader()
	g := c.sms[leader].holdNext()
	var once sync.Once
	release := func() { once.Do(func() { close(g.release) }) }
	t.Cleanup(release)
	return c, c.nodes[leader], g, release
}

// TestBatchOneResponsePerCaller holds the leader's state machine on one
// command so that fifty more queue behind it, then checks that they travel
// as one log entry and that each caller gets its own response, in log order.
func TestBatchOneResponsePerCaller(t *testing.T) {
	t.Parallel()
	c, n, g, release := heldLeader(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const callers = 50
	type answer struct {
		cmd, resp []byte
		err       error
	}
	answers := make(chan answer, callers+1)
	call := func(cmd []byte) {
		resp, err := n.Apply(ctx, cmd)
		answers <- answer{cmd, resp, err}
	}
	go call([]byte("first"))
	select {
	case <-g.entered:
	case <-ctx.Done():
		t.Fatal("the first command never reached the state machine")
	}
	entries := n.raft.LastIndex() // the first command's entry is in the log

	for i := 0; i < callers; i++ {
		go call(fmt.Appendf(nil, "caller-%d", i))
	}
	// The batcher holds one of them while it waits for the in-flight slot.
	waitFor(t, 10*time.Second, func() bool { return len(n.b.in) == callers-1 }, "%d queued commands", callers-1)
	release()

	got := make([]answer, 0, callers+1)
	for range callers + 1 {
		a := <-answers
		if a.err != nil {
			t.Fatalf("apply %s: %v", a.cmd, a.err)
		}
		got = append(got, a)
	}
	if d := n.raft.LastIndex() - entries; d != 1 {
		t.Errorf("%d commands took %d log entries, want 1", callers, d)
	}

	// Order the answers by the sequence number in each response and replay
	// the chain: every response must be the state right after its own
	// command.
	sort.Slice(got, func(i, j int) bool {
		return binary.BigEndian.Uint64(got[i].resp) < binary.BigEndian.Uint64(got[j].resp)
	})
	var ref chain
	for i, a := range got {
		want := ref.add(a.cmd)
		if !bytes.Equal(a.resp, want) {
			t.Fatalf("answer %d (%s): response %x, want %x", i, a.cmd, a.resp, want)
		}
	}
	if !bytes.Equal(got[0].cmd, []byte("first")) {
		t.Errorf("first applied command is %s", got[0].cmd)
	}
	c.waitConverged(c.live(), ref)
}

// TestBulkYieldsToOtherCommands: with a bulk batch held in the state
// machine and twenty bulk commands queued behind it, a normal command
// takes the in-flight slot bulk batches leave free and is applied right
// after the held batch, before every queued bulk command; the bulk
// commands then travel together, and each caller gets its own response.
func TestBulkYieldsToOtherCommands(t *testing.T) {
	t.Parallel()
	c, n, g, release := heldLeader(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type answer struct {
		cmd  string
		seq  uint64
		resp []byte
		err  error
	}
	answers := make(chan answer, 32)
	call := func(apply func(context.Context, []byte) ([]byte, error), cmd string) {
		resp, err := apply(ctx, []byte(cmd))
		a := answer{cmd: cmd, resp: resp, err: err}
		if err == nil {
			a.seq = binary.BigEndian.Uint64(resp)
		}
		answers <- a
	}
	go call(n.ApplyBulk, "bulk-held")
	select {
	case <-g.entered:
	case <-ctx.Done():
		t.Fatal("the first bulk command never reached the state machine")
	}
	const queued = 20
	for i := 0; i < queued; i++ {
		go call(n.ApplyBulk, fmt.Sprintf("bulk-%d", i))
	}
	// One waits in the batcher for a bulk slot, the rest in the queue.
	waitFor(t, 10*time.Second, func() bool { return len(n.b.bulk) == queued-1 }, "%d queued bulk commands", queued-1)
	entries := n.raft.LastIndex()
	go call(n.Apply, "normal")
	// The normal command reaches the log while the bulk batch is held.
	waitFor(t, 10*time.Second, func() bool { return n.raft.LastIndex() == entries+1 }, "the normal command's entry")
	release()

	got := make([]answer, 0, queued+2)
	for range queued + 2 {
		a := <-answers
		if a.err != nil {
			t.Fatalf("apply %s: %v", a.cmd, a.err)
		}
		got = append(got, a)
	}
	sort.Slice(got, func(i, j int) bool { return got[i].seq < got[j].seq })
	if got[0].cmd != "bulk-held" || got[1].cmd != "normal" {
		t.Fatalf("applied first %s then %s; want the held bulk command, then the normal one", got[0].cmd, got[1].cmd)
	}
	var ref chain
	for i, a := range got {
		if want := ref.add([]byte(a.cmd)); !bytes.Equal(a.resp, want) {
			t.Fatalf("answer %d (%s): response %x, want %x", i, a.cmd, a.resp, want)
		}
	}
	if d := n.raft.LastIndex() - entries; d != 2 {
		t.Errorf("the normal command and %d queued bulk ones took %d log entries, want 2", queued, d)
	}
	c.waitConverged(c.live(), ref)
}

// TestBatchConcurrentWriters: many writers, no gate; every response is the
// chain state right after its own command and replicas agree.
func TestBatchConcurrentWriters(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3, nil)
	leader := c.waitLeader()
	n := c.nodes[leader]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const writers, each = 16, 25
	var mu sync.Mutex
	bySeq := map[uint64][2][]byte{}
	var wg sync.WaitGroup
	start := n.raft.LastIndex()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				cmd := fmt.Appendf(nil, "w%d-%d", w, i)
				resp, err := n.Apply(ctx, cmd)
				if err != nil {
					t.Errorf("apply %s: %v", cmd, err)
					return
				}
				mu.Lock()
				bySeq[binary.BigEndian.Uint64(resp)] = [2][]byte{cmd, resp}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	var ref chain
	for seq := uint64(1); seq <= writers*each; seq++ {
		a, ok := bySeq[seq]
		if !ok {
			t.Fatalf("no caller got sequence number %d", seq)
		}
		if want := ref.add(a[0]); !bytes.Equal(a[1], want) {
			t.Fatalf("seq %d (%s): response %x, want %x", seq, a[0], a[1], want)
		}
	}
	c.waitConverged(c.live(), ref)
	t.Logf("%d commands in %d log entries", writers*each, n.raft.LastIndex()-start)
}

// TestBatchFill: a batch takes what is queued, up to the command and byte
// limits; the command that overflows the bytes opens the next batch, and a
// command over the limit on its own travels alone.
func TestBatchFill(t *testing.T) {
	b := &batcher{in: make(chan *request, 16), maxCmds: 3, maxBytes: 100}
	req := func(size int, tag byte) *request { return &request{cmd: bytes.Repeat([]byte{tag}, size)} }
	var batches []string
	queue := []*request{req(60, 'b'), req(150, 'c'), req(1, 'd'), req(1, 'e'), req(1, 'f'), req(1, 'g')}
	for _, r := range queue {
		b.in <- r
	}
	first := req(30, 'a')
	for first != nil {
		reqs, carry := b.fill(first, b.in)
		var s []byte
		for _, r := range reqs {
			s = append(s, r.cmd[0])
		}
		batches = append(batches, string(s))
		first = carry
		if first == nil {
			select {
			case first = <-b.in:
			default:
			}
		}
	}
	// a+b = 90 bytes; c (150) overflows and goes alone; d e f hit the count
	// limit; g last.
	if got, want := fmt.Sprint(batches), "[ab c def g]"; got != want {
		t.Errorf("batches %s, want %s", got, want)
	}
}

func TestEnvelopeRoundTrip(t *testing.T) {
	for _, cmds := range [][][]byte{
		{{}},
		{[]byte("one")},
		{[]byte("a"), {}, bytes.Repeat([]byte{0xff}, 1000)},
	} {
		data, err := encodeBatch(cmds)
		if err != nil {
			t.Fatal(err)
		}
		kind, got, err := decodeEntry(data)
		if err != nil || kind != entryBatch || len(got) != len(cmds) {
			t.Fatalf("decode(encode(%q)) = %v, %q, %v", cmds, kind, got, err)
		}
		for i := range cmds {
			if !bytes.Equal(got[i], cmds[i]) {
				t.Fatalf("command %d: %q, want %q", i, got[i], cmds[i])
			}
		}
	}
	for _, bad := range [][]byte{nil, {0x02}, {entryBatch}, {entryBatch, 0xa0}, {entryBatch, 0xa1, 0x01, 0x80}} {
		if _, _, err := decodeEntry(bad); err == nil {
			t.Errorf("decodeEntry(%x) accepted", bad)
		}
	}
}

// FuzzDecodeEntry: decoding never panics, and whatever decodes re-encodes
// to the same bytes (the envelope is canonical).
func FuzzDecodeEntry(f *testing.F) {
	for _, cmds := range [][][]byte{{[]byte("x")}, {{}, []byte("yz")}} {
		b, _ := encodeBatch(cmds)
		f.Add(b)
	}
	f.Add([]byte{entryNoop, 1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		kind, cmds, err := decodeEntry(data)
		if err != nil || kind != entryBatch {
			return
		}
		again, err := encodeBatch(cmds)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("not canonical: %x re-encodes as %x", data, again)
		}
	})
}
