package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl/account"
)

// Facts the multi-process tests wait on and assert, read from what the
// cluster keeps — the replicated job and run state through the API, a
// silo's ledger and folders, how a process ended — never from the wording
// of a log line: a retried round, a summarised repeat or a reworded
// message would change the log and not the fact. (A failed test still
// prints each process's log tail: that is for the person reading it.)

// clients holds one in-process API client per cluster.
var clients sync.Map

// client is alice's API client of c, in process: a CLI process per poll
// would load the busy cores more.
func (c *cluster) client() *api.Client {
	c.t.Helper()
	cl, ok := clients.Load(c)
	if !ok {
		cl, _ = clients.LoadOrStore(c, c.apiClient("alice"))
		c.t.Cleanup(func() { clients.Delete(c) })
	}
	return cl.(*api.Client)
}

// factCtx bounds one read of a fact: a cluster that lost its quorum
// fails the read instead of hanging the test.
func factCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), untilQuorum())
}

// fullStatus is a job's status as the coordinator reports it.
func (c *cluster) fullStatus(id string) coordinator.JobStatus {
	c.t.Helper()
	ctx, cancel := factCtx()
	defer cancel()
	st, err := c.client().Job(ctx, content.Ref(id))
	if err != nil {
		c.t.Fatalf("status of %s: %v", id, err)
	}
	return st
}

// attempts returns the round jobs that attempted step r of run id, in
// submission order, with their shards; none while the cluster does not
// answer (an election under way: a wait polls again).
func (c *cluster) attempts(id string, r int) []coordinator.JobStatus {
	ctx, cancel := factCtx()
	defer cancel()
	cl := c.client()
	jobs, err := cl.Jobs(ctx)
	if err != nil {
		c.t.Logf("job list: %v", err)
		return nil
	}
	var out []coordinator.JobStatus
	for _, j := range jobs {
		if string(j.Run) == id && j.Round == r {
			js, err := cl.Job(ctx, j.ID)
			if err != nil {
				c.t.Logf("status of %s: %v", j.ID, err)
				return nil
			}
			out = append(out, js)
		}
	}
	return out
}

// reportedTo reports whether silo reported its record of step r of run id
// to one of the step's attempts: a silo reports once it took part (or
// declined). The job's shard reports name the peer while the job runs;
// law 13 hides only the record's bytes until then.
func (c *cluster) reportedTo(id string, r int, silo string) bool {
	for _, j := range c.attempts(id, r) {
		for _, s := range j.Shards {
			for _, rep := range s.Reports {
				if rep.Peer == silo {
					return true
				}
			}
		}
	}
	return false
}

// ledgerEntries reads silo's privacy ledger (data_dir silo/data) as
// `scellis ledger show` does, verified; nil while it does not exist. A
// torn last write of a charge under way is left out, as show leaves it;
// a ledger that does not verify reads as empty here, and fails the
// test's ledger checks (checkLedger: scellis ledger verify).
func (c *cluster) ledgerEntries(silo string) []dp.Entry {
	path := filepath.Join(c.dir, silo, "data", "privacy.ledger")
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	s, err := dp.Verify(path, nil)
	if err != nil {
		c.t.Logf("%s's ledger: %v", silo, err)
		return nil
	}
	return s.Entries()
}

// roundConsumer is the ledger consumer a silo's charge for step r of run
// id names (every attempt of the step names the same one).
func roundConsumer(id string, r int) string {
	return id + "/round-" + strconv.Itoa(r)
}

// charged reports whether silo's ledger holds a charge for consumer.
func (c *cluster) charged(silo, consumer string) bool {
	for _, e := range c.ledgerEntries(silo) {
		if e.Charge != nil && e.Charge.Consumer == consumer {
			return true
		}
	}
	return false
}

// chargedRounds returns the steps of run id silo's ledger charges, in
// the order it paid for them.
func (c *cluster) chargedRounds(silo, id string) []int {
	var out []int
	for _, e := range c.ledgerEntries(silo) {
		if e.Charge == nil {
			continue
		}
		if r, ok := strings.CutPrefix(e.Charge.Consumer, id+"/round-"); ok {
			if n, err := strconv.Atoi(r); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// account reads run id's whole account in process: every signed record
// its silos reported to its round jobs, as fl watch and privacy report
// read it (package account).
func (c *cluster) account(id string) *account.Run {
	c.t.Helper()
	ctx, cancel := factCtx()
	defer cancel()
	cl := c.client()
	st, err := cl.Run(ctx, content.Ref(id))
	if err != nil {
		c.t.Fatalf("run %s: %v", id, err)
	}
	_, fed := c.memberKeys("alice")
	run, err := account.NewReader(poolSource{cl}, fed).Run(ctx, st)
	if err != nil {
		c.t.Fatalf("the account of run %s: %v", id, err)
	}
	return run
}

// exitSignal is the signal that ended a process started by start (0 if
// it exited by itself). Call it once the process has exited (waitExit).
func (c *cluster) exitSignal(name string) syscall.Signal {
	select {
	case <-c.exits[name]:
	case <-time.After(untilExit()):
		c.t.Fatalf("%s has not exited", name)
	}
	if ws, ok := c.procs[name].ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal()
	}
	return 0
}

// channelUp reports whether aggregator agg has made a data channel with
// peer over path (direct or relayed) and its last one took that path
// (aggregator status, as member as): the peer's blobs with agg then go
// over it.
func (c *cluster) channelUp(as, agg, peer, path string) bool {
	st, ok := c.statuses(as)[agg]
	if !ok || st.DataPlane == nil {
		return false
	}
	for _, p := range st.DataPlane.Pairs {
		if p.Peer != peer || p.Path != path {
			continue
		}
		switch path {
		case "direct":
			return p.DirectConns > 0
		case "relayed":
			return p.RelayedConns > 0
		}
	}
	return false
}
