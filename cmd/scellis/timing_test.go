package main

import (
	"time"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/internal/testharness"
)

// How long a multi-process test waits for something is derived from the
// cluster's own timing settings, in one place, not written as a wall-clock
// constant at each wait: the Raft profile the aggregators run (lan, the
// default) and the lease, join timeout and poll the tests write into the
// members' configs. Each budget is many times the setting it waits on — a
// step that takes one election timeout on an idle machine can take ten
// when two cores are shared with forty busy processes — and is then
// scaled by slack, so a machine busier still gets more.

// raftLAN is the aggregators' Raft profile: heartbeat, election and
// leader-lease timeouts.
var raftLAN = config.RaftTimings["lan"]

const (
	// testLeaseTTL and testJoinTimeout are newCluster's aggregator
	// lease_ttl and round_join_timeout.
	testLeaseTTL    = 2 * time.Second
	testJoinTimeout = 4 * time.Second
)

// slack scales every budget (testharness.Slack: SCELLIS_TEST_SLACK, or
// the machine's load per core at start).
var slack = testharness.Slack

// budget is n times unit, scaled by slack.
func budget(n float64, unit time.Duration) time.Duration {
	return time.Duration(n * float64(unit) * slack())
}

// untilQuorum bounds one read or command the cluster answers (a leader to
// forward to, a commit): 30 election timeouts, 30 s idle.
func untilQuorum() time.Duration { return budget(30, raftLAN[1]) }

// untilExit bounds a signalled process's exit (a leader hands over
// first): 30 election timeouts.
func untilExit() time.Duration { return budget(30, raftLAN[1]) }

// untilElected bounds a started or changed cluster's election of a
// leader, and a membership change taking effect: 60 election timeouts,
// a minute idle.
func untilElected() time.Duration { return budget(60, raftLAN[1]) }

// untilNoticed bounds the cluster noticing a member's start, death or
// return (its polls and leases) and the member acting on it: 30 lease
// TTLs, a minute idle.
func untilNoticed() time.Duration { return budget(30, testLeaseTTL) }

// untilRun bounds a short run or job (a few rounds, retries with their
// join timeouts and backoff, a pause): 45 round join timeouts, 3 minutes
// idle.
func untilRun() time.Duration { return budget(45, testJoinTimeout) }

// untilLongRun bounds a run of a hundred rounds with a crash or an
// election among them: 75 round join timeouts, 5 minutes idle.
func untilLongRun() time.Duration { return budget(75, testJoinTimeout) }

// untilCLI bounds one CLI command, retries included, so a client retrying
// against a dead cluster cannot outlive the test: 60 round join timeouts,
// 4 minutes idle.
func untilCLI() time.Duration { return budget(60, testJoinTimeout) }
