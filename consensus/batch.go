package consensus

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/scellis/scellis/content"
)

// Log entry kinds: the first byte of every LogCommand entry's data.
const (
	// entryNoop entries change nothing. Only the raw-Raft baseline of the
	// benchmarks writes them; every node skips them.
	entryNoop byte = 0x00
	// entryBatch is followed by the canonical CBOR of an envelope.
	entryBatch byte = 0x01
)

// envelope is the body of an entryBatch log entry: commands in the order
// they are applied. Encoded with content.Encode (deterministic CBOR) as
// {1: [bstr, ...]}.
type envelope struct {
	Cmds [][]byte `cbor:"1,keyasint"`
}

// encodeBatch returns the log entry data for cmds.
func encodeBatch(cmds [][]byte) ([]byte, error) {
	body, err := content.Encode(envelope{Cmds: cmds})
	if err != nil {
		return nil, fmt.Errorf("consensus: encode batch: %w", err)
	}
	data := make([]byte, 1+len(body))
	data[0] = entryBatch
	copy(data[1:], body)
	return data, nil
}

// decodeEntry splits log entry data into its kind and, for a batch, its
// commands. It refuses unknown kinds and non-canonical or trailing bytes.
func decodeEntry(data []byte) (kind byte, cmds [][]byte, err error) {
	if len(data) == 0 {
		return 0, nil, errors.New("consensus: empty log entry")
	}
	switch data[0] {
	case entryNoop:
		return entryNoop, nil, nil
	case entryBatch:
		var env envelope
		if err := content.Decode(data[1:], &env); err != nil {
			return 0, nil, fmt.Errorf("consensus: batch envelope: %w", err)
		}
		if len(env.Cmds) == 0 {
			return 0, nil, errors.New("consensus: batch envelope holds no command")
		}
		return entryBatch, env.Cmds, nil
	default:
		return 0, nil, fmt.Errorf("consensus: unknown log entry kind 0x%02x", data[0])
	}
}

// request is one Apply call waiting for its command's response.
type request struct {
	cmd  []byte
	done chan reply // buffered: the batcher never blocks on a caller
}

type reply struct {
	resp []byte
	err  error
}

// inflight is one batch handed to Raft, in log order.
type inflight struct {
	f    raft.ApplyFuture
	reqs []*request
	bulk bool // a batch of bulk commands: it holds a bulkSlots place too
}

// batcher packs concurrent Apply calls into log entries (group commit).
//
// One goroutine (run) takes the first queued request, waits for a free
// in-flight slot — requests arriving meanwhile queue behind it — then drains
// the queue up to the size limits and hands the batch to Raft as one entry.
// A second goroutine (wait) resolves the futures in log order, gives each
// caller its own response and frees the slot. A lone writer therefore pays
// one commit; many writers share each commit (and its fsyncs).
//
// Bulk commands (ApplyBulk: a pool's stream of generic leases and reports)
// queue apart and yield to the others: a batch holds commands of one
// class, a normal request waiting is always batched before a bulk one, and
// bulk batches hold at most MaxInflightBatches−1 of the in-flight slots
// (at least one), so a normal command — a training round's — never waits
// for a slot behind bulk batches, and has at most that many bulk entries
// ahead of it in the log to be applied first. A round step of ten commits
// in a row otherwise paid, for each, a sweep's batch of hundreds of
// reports to be written and applied ahead of it.
type batcher struct {
	raft     *raft.Raft
	mapErr   func(error) error
	maxCmds  int
	maxBytes int

	in        chan *request
	bulk      chan *request
	slots     chan struct{}
	bulkSlots chan struct{}
	// answering is held by wait while it answers one resolved batch's
	// callers. run waits for it before it forms a batch while another is
	// in flight: the callers it answers submit again at once, and a batch
	// formed in the middle of that burst held one or two of them and took
	// a slot from the rest (64 writers made entries of 64, 1 and 1 commands
	// in turn, and the two small entries delayed the large one by a whole
	// commit).
	answering sync.Mutex

	pending chan inflight
	stop    chan struct{} // closed by close: form no more batches
	ranOut  chan struct{} // closed when run has returned
	waited  chan struct{} // closed when wait has returned
}

func newBatcher(r *raft.Raft, mapErr func(error) error, cfg Config) *batcher {
	b := &batcher{
		raft:      r,
		mapErr:    mapErr,
		maxCmds:   cfg.MaxBatchCommands,
		maxBytes:  cfg.MaxBatchBytes,
		in:        make(chan *request, 4*cfg.MaxBatchCommands),
		bulk:      make(chan *request, 4*cfg.MaxBatchCommands),
		slots:     make(chan struct{}, cfg.MaxInflightBatches),
		bulkSlots: make(chan struct{}, max(cfg.MaxInflightBatches-1, 1)),
		pending:   make(chan inflight, cfg.MaxInflightBatches),
		stop:      make(chan struct{}),
		ranOut:    make(chan struct{}),
		waited:    make(chan struct{}),
	}
	go b.run()
	go b.wait()
	return b
}

// run forms batches until stop.
func (b *batcher) run() {
	defer close(b.ranOut)
	defer close(b.pending)
	// carry and carryBulk are requests taken from their queue and not yet
	// batched: each opens the next batch of its class.
	var carry, carryBulk *request
	defer func() {
		for _, r := range []*request{carry, carryBulk} {
			if r != nil {
				r.done <- reply{err: ErrClosed}
			}
		}
	}()
	for {
		first, bulk := b.next(&carry, &carryBulk)
		if first == nil {
			return
		}
		if bulk {
			select {
			case b.bulkSlots <- struct{}{}:
			case r := <-b.in:
				// A normal command goes first; this one opens the
				// next bulk batch.
				carry, carryBulk = r, first
				continue
			case <-b.stop:
				carryBulk = first
				return
			}
		}
		var normal <-chan *request // a bulk batch gives way to a normal command until it has a slot
		if bulk {
			normal = b.in
		}
		select {
		case b.slots <- struct{}{}:
		case r := <-normal:
			<-b.bulkSlots
			carry, carryBulk = r, first
			continue
		case <-b.stop:
			if bulk {
				<-b.bulkSlots
				carryBulk = first
			} else {
				carry = first
			}
			return
		}
		if len(b.slots) > 1 {
			// Another batch is in flight: let the callers just answered
			// queue their next commands, so this batch carries them.
			b.answering.Lock()
			//lint:ignore SA2001 the empty critical section waits until wait has answered
			b.answering.Unlock()
			runtime.Gosched()
		}
		q := b.in
		if bulk {
			q = b.bulk
		}
		reqs, over := b.fill(first, q)
		if bulk {
			carryBulk = over
		} else {
			carry = over
		}
		cmds := make([][]byte, len(reqs))
		for i, r := range reqs {
			cmds[i] = r.cmd
		}
		data, err := encodeBatch(cmds)
		if err != nil {
			for _, r := range reqs {
				r.done <- reply{err: err}
			}
			<-b.slots
			if bulk {
				<-b.bulkSlots
			}
			continue
		}
		b.pending <- inflight{f: b.raft.Apply(data, 0), reqs: reqs, bulk: bulk}
	}
}

// next returns the request that opens the next batch, and whether it is a
// bulk one: a normal request whenever one waits (carried over or queued),
// else a bulk one; it blocks until there is one, and returns nil once
// stop is closed.
func (b *batcher) next(carry, carryBulk **request) (*request, bool) {
	if r := *carry; r != nil {
		*carry = nil
		return r, false
	}
	select {
	case r := <-b.in:
		return r, false
	default:
	}
	if r := *carryBulk; r != nil {
		*carryBulk = nil
		return r, true
	}
	select {
	case r := <-b.in:
		return r, false
	case r := <-b.bulk:
		return r, true
	case <-b.stop:
		return nil, false
	}
}

// fill forms a batch: first, then whatever is queued on q (first's class), up to maxCmds
// commands and maxBytes of commands. The request that would overflow the
// bytes is returned as carry, to open the next batch; first always goes, so
// a command larger than maxBytes travels alone.
func (b *batcher) fill(first *request, q <-chan *request) (reqs []*request, carry *request) {
	reqs = []*request{first}
	size := len(first.cmd)
	for len(reqs) < b.maxCmds {
		select {
		case r := <-q:
			if size+len(r.cmd) > b.maxBytes {
				return reqs, r
			}
			reqs = append(reqs, r)
			size += len(r.cmd)
		default:
			return reqs, nil
		}
	}
	return reqs, nil
}

// wait answers the callers of each batch once Raft resolves it.
func (b *batcher) wait() {
	defer close(b.waited)
	for inf := range b.pending {
		err := inf.f.Error()
		b.answering.Lock()
		if err != nil {
			err = b.mapErr(err)
			for _, r := range inf.reqs {
				r.done <- reply{err: err}
			}
		} else {
			resps, ok := inf.f.Response().([][]byte)
			if !ok || len(resps) != len(inf.reqs) {
				panic(fmt.Sprintf("consensus: batch of %d commands got %d responses (invariant: one response per command)", len(inf.reqs), len(resps)))
			}
			for i, r := range inf.reqs {
				r.done <- reply{resp: resps[i]}
			}
		}
		b.answering.Unlock()
		<-b.slots
		if inf.bulk {
			<-b.bulkSlots
		}
	}
}

// close stops the batcher while Raft still runs: it forms no more batches,
// fails the requests still queued with ErrClosed (they never reached Raft),
// and waits up to drain for the batches in flight to resolve — they commit,
// or fail once the leader loses its quorum. It reports whether they all
// resolved.
//
// Draining before Raft shuts down matters: raft v1.8 never resolves an
// Apply future that is committed but still queued for the FSM when it shuts
// down, so a waiter on it would block for ever.
func (b *batcher) close(drain time.Duration) bool {
	close(b.stop)
	<-b.ranOut
	for {
		select {
		case r := <-b.in:
			r.done <- reply{err: ErrClosed}
			continue
		case r := <-b.bulk:
			r.done <- reply{err: ErrClosed}
			continue
		default:
		}
		break
	}
	t := time.NewTimer(drain)
	defer t.Stop()
	select {
	case <-b.waited:
		return true
	case <-t.C:
		return false
	}
}
