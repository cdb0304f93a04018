package aggregator

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/identity"
)

// Early copies. A member uploads a result, then reports its hash; the
// report is proposed only once a second aggregator holds the bytes
// (durable). Made at the report, that copy — a round trip to a peer and
// its fsync — lay on every round's critical path, after the upload and
// before the report's commit (docs/fl.md, where a round's time goes). The
// leader starts the copy as soon as a member's upload is stored, so it
// travels while the member writes its outbox and sends the report, and
// durable waits for that copy instead of making another. Nothing is
// weakened: the report still waits until a peer has stored the bytes, and
// a copy that failed (or was never started) is made again at the report.

// earlyCopyMax bounds the uploads copied early: results are small; a
// large blob is copied at its report, as before.
const earlyCopyMax = durableBatchBytes / 4

// earlyCopyKeep is how long a finished early copy is surely remembered
// for the report that follows its upload; older ones are forgotten when
// the table is full.
const earlyCopyKeep = time.Minute

// earlyCopyCap bounds the copies remembered at once; past it no copy
// starts early (the report makes it).
const earlyCopyCap = 4096

var errEarlyTooLarge = errors.New("too large to copy early")

type earlyCopy struct {
	done chan struct{}
	err  error
	at   time.Time
}

type earlyCopies struct {
	life context.Context // the node's: ends when it closes
	mu   sync.Mutex
	m    map[content.Ref]*earlyCopy
}

// copyEarly wraps the blob handler: a member's (not a peer aggregator's:
// its copies are the copies) small upload stored on the leader starts
// its copy to a second aggregator at once. Uploads over a data channel
// start theirs in nodeStore.Put (the data plane serves members only;
// the aggregators copy to each other over HTTPS).
func (n *Node) copyEarly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut || r.ContentLength < 0 || r.ContentLength > earlyCopyMax {
			h.ServeHTTP(w, r)
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		if sw.status != http.StatusCreated {
			return
		}
		if m, ok := n.fed.PeerFromRequest(r); !ok || m.Role == identity.Aggregator {
			return
		}
		if _, _, self := n.leader(); !self {
			return
		}
		if ref, err := content.ParseRef(strings.TrimPrefix(r.URL.Path, "/blobs/")); err == nil {
			n.startEarlyCopy(ref)
		}
	})
}

// statusWriter notes the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// startEarlyCopy copies ref, stored here, to a second aggregator in the
// background, and remembers how it went for durable.
func (n *Node) startEarlyCopy(ref content.Ref) {
	c := &earlyCopy{done: make(chan struct{}), at: time.Now()}
	ec := &n.early
	ec.mu.Lock()
	if ec.m == nil {
		ec.m = map[content.Ref]*earlyCopy{}
	}
	if len(ec.m) >= earlyCopyCap {
		// Forget the finished copies of over a minute ago only when the
		// table is full: a sweep on every upload would walk it each time.
		for k, v := range ec.m {
			if time.Since(v.at) > earlyCopyKeep && finished(v) {
				delete(ec.m, k)
			}
		}
	}
	if _, dup := ec.m[ref]; dup || len(ec.m) >= earlyCopyCap {
		ec.mu.Unlock()
		return
	}
	ec.m[ref] = c
	ec.mu.Unlock()
	go func() {
		defer close(c.done)
		life := ec.life
		if life == nil {
			life = context.Background()
		}
		ctx, cancel := context.WithTimeout(life, 10*time.Second)
		defer cancel()
		b, err := n.blobs.Get(ref)
		switch {
		case err != nil:
		case len(b) > earlyCopyMax:
			err = errEarlyTooLarge // copied at its report, as before
		default:
			err = n.replicate(ctx, ref, b)
		}
		c.err = err
	}()
}

func finished(c *earlyCopy) bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// earlyCopied waits for ref's early copy, if one was started: true once
// a second aggregator holds ref by it. False (no early copy, or it
// failed) leaves the copy to the caller.
func (n *Node) earlyCopied(ctx context.Context, ref content.Ref) bool {
	ec := &n.early
	ec.mu.Lock()
	c, ok := ec.m[ref]
	ec.mu.Unlock()
	if !ok {
		return false
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return false
	}
	return c.err == nil
}
