package api

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// silentNode accepts connections and never answers, like a black-holed
// link or a frozen process: nothing is refused or reset.
func silentNode(t *testing.T) string {
	u, _ := countedSilentNode(t)
	return u
}

// countedSilentNode is silentNode, also counting the connections made.
func countedSilentNode(t *testing.T) (string, *atomic.Int32) {
	var n atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String(), &n
}

func answering(t *testing.T, h http.HandlerFunc) string {
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.URL
}

func jobsOK(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, []any{}) }

// A silent first node costs one attempt's deadline, then the client asks
// the next node — within the operation's context, which is far longer.
func TestClientRotatesPastSilentNode(t *testing.T) {
	c := NewClientTLS(http.DefaultTransport, []string{silentNode(t), answering(t, jobsOK)})
	c.AttemptTimeout = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Jobs(ctx); err != nil {
		t.Fatalf("jobs with a silent first node: %v", err)
	}
	// The silent node is now avoided: the next call goes straight to the
	// node that answers.
	if _, idx := c.endpoint(); idx != 1 {
		t.Fatalf("after a timeout the client still prefers the silent node")
	}
}

// A node cut off from the cluster refuses reads (SC7107); the client asks
// another node.
func TestClientRotatesPastStaleNode(t *testing.T) {
	var stale atomic.Int32
	c := NewClientTLS(http.DefaultTransport, []string{
		answering(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/jobs" {
				stale.Add(1)
			}
			writeDiag(w, http.StatusServiceUnavailable, diag.New(diag.PoolStaleRead, "agg-1", "cut off"))
		}),
		answering(t, jobsOK),
	})
	if _, err := c.Jobs(context.Background()); err != nil {
		t.Fatal(err)
	}
	if stale.Load() != 1 {
		t.Fatalf("the stale node was asked %d times", stale.Load())
	}
}

// A redirect to a leader that does not answer is not followed again while
// another node can name a live leader.
func TestClientPrefersTheLeaderThatAnswers(t *testing.T) {
	silent, dialled := countedSilentNode(t)
	live := answering(t, jobsOK)
	var toLive string
	follower := answering(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, toLive+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	})
	toLive = live
	stuck := answering(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, silent+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	})
	c := NewClientTLS(http.DefaultTransport, []string{stuck, silent, follower, live})
	c.AttemptTimeout = 200 * time.Millisecond
	if _, err := c.Jobs(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The silent leader is avoided now: the stale redirect is not
	// followed to it again, another node is asked instead.
	before := dialled.Load()
	c.current = 0
	if _, err := c.Jobs(context.Background()); err != nil {
		t.Fatal(err)
	}
	if dialled.Load() != before {
		t.Fatalf("the client went back to the silent leader (%d connections, %d before)", dialled.Load(), before)
	}
}

// With no node answering, a CLI client (GiveUpAfter) fails with SC7103
// naming every node, instead of retrying for its whole budget.
func TestClientGivesUpWhenNoNodeAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close()
	c := NewClientTLS(http.DefaultTransport, []string{refused, silentNode(t)})
	c.AttemptTimeout = 100 * time.Millisecond
	c.GiveUpAfter = 300 * time.Millisecond
	_, err = c.Jobs(context.Background()) // no deadline: only GiveUpAfter ends it
	ds, ok := diag.As(err)
	if !ok || ds[0].Code != diag.PoolNoLeader {
		t.Fatalf("want SC7103, got %v", err)
	}
}

// statusAs answers /v1/status as a node in the given Raft state, and
// counts the job reads it serves.
func statusAs(t *testing.T, state string, reads *atomic.Int32) string {
	return answering(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/status" {
			writeJSON(w, http.StatusOK, map[string]any{"raft": map[string]string{"State": state}})
			return
		}
		reads.Add(1)
		jobsOK(w, r)
	})
}

// Before its first call a client asks every node at once and starts with
// the leader that answers: a silent node listed first costs nothing.
func TestClientDiscoversTheLeaderThatAnswers(t *testing.T) {
	silent, dialled := countedSilentNode(t)
	var followerReads, leaderReads atomic.Int32
	c := NewClientTLS(http.DefaultTransport, []string{silent, statusAs(t, "follower", &followerReads), statusAs(t, "leader", &leaderReads)})
	c.AttemptTimeout = time.Minute // a call that went to the silent node would hang the test
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Jobs(ctx); err != nil {
		t.Fatal(err)
	}
	if leaderReads.Load() != 1 || followerReads.Load() != 0 {
		t.Fatalf("reads: leader %d, follower %d; want the leader's only", leaderReads.Load(), followerReads.Load())
	}
	if dialled.Load() > 1 {
		t.Fatalf("the silent node was dialled %d times; only the status probe should reach it", dialled.Load())
	}
}

// A leader slower than one attempt's deadline (planning a large job, on a
// loaded machine) is still served: coming back to it after the followers
// named it, the client gives it a longer deadline.
func TestClientWaitsLongerForASlowLeader(t *testing.T) {
	var leader string
	slow := answering(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(300 * time.Millisecond):
			jobsOK(w, r)
		case <-r.Context().Done():
		}
	})
	leader = slow
	follower := answering(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, leader+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	})
	c := NewClientTLS(http.DefaultTransport, []string{follower, slow})
	c.AttemptTimeout = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Jobs(ctx); err != nil {
		t.Fatalf("a slow leader was never given the time: %v", err)
	}
}

// A blob held by the second node is fetched even when the first is silent
// and one attempt's deadline is an hour: the next node is asked after a
// short hedge (a node that says no hands over at once).
func TestGetBlobFromHedgesPastSilentNode(t *testing.T) {
	data := []byte("the result, on the data plane's node only")
	ref := content.Hash(data)
	holder := answering(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/blobs/"+string(ref) {
			http.NotFound(w, r)
			return
		}
		w.Write(data)
	})
	lacks := answering(t, http.NotFound)
	c := NewClientTLS(http.DefaultTransport, nil)
	c.AttemptTimeout = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := c.GetBlobFrom(ctx, []string{silentNode(t), lacks, holder}, ref)
	if err != nil || string(b) != string(data) {
		t.Fatalf("GetBlobFrom past a silent node: %q, %v", b, err)
	}
	if _, err := c.GetBlobFrom(ctx, []string{lacks}, ref); err == nil {
		t.Fatal("a blob no node holds was found")
	}
}
