// Package testfault lets the multi-process tests of cmd/scellis make a real
// process fail at a named point of a protocol, where a signal sent from
// outside cannot land reliably (rounds take milliseconds: a test that kills
// a silo "after it encrypted, before it decrypted" from outside would race).
//
// It is inert in every binary but a test build: the variable
// SCELLIS_TEST_FAULT is read only when the binary was linked with
//
//	-ldflags "-X github.com/scellis/scellis/internal/testfault.enabled=yes"
//
// as cmd/scellis's tests link theirs. A release build (README: go build
// -ldflags "-X main.version=…") ignores the variable: nothing in the
// environment of a production process can make it fail on purpose.
package testfault

import (
	"os"
	"strings"
	"time"
)

// Env names the fault a test process was started with.
const Env = "SCELLIS_TEST_FAULT"

// The points a test can arm.
const (
	// KillAfterHECiphertext: a silo kills itself (SIGKILL) as soon as
	// the aggregator accepted its threshold-he ciphertext — paid for,
	// sent and summed, but never asked to decrypt.
	KillAfterHECiphertext = "kill-after-he-ciphertext"
	// KillAfterCharge: a silo kills itself (SIGKILL) as soon as its
	// ledger charge for a round is durable — paid for, nothing sent,
	// nothing reported (its outbox holds the round's record).
	KillAfterCharge = "kill-after-charge"
	// KillBeforeSubJob: a child cluster's leader kills itself (SIGKILL)
	// once it has leased shards of the parent job named JOB from its
	// parent cluster, before it proposes their sub-job — the one moment
	// those leases are known to no node of the child. Armed as
	// "kill-before-subjob:JOB:MARKER"; it fires once across every
	// process armed with the same MARKER file, so a whole
	// cluster can be armed and only the leader that gets there first
	// dies (Fires).
	KillBeforeSubJob = "kill-before-subjob"
	// BadOuterKey: a child cluster's leader posts, for the parent round
	// job named JOB, an outer key whose X25519 half is the all-zero
	// point, signed with its own delegate key. Every shared secret with
	// that point is zero, so another child's outer mask keyed with it
	// would be known to anyone: what a child colluding with the parent
	// to read another sub-cohort's sum would post. The parent's host
	// takes it (it checks the signature, not the point); every other
	// child refuses the round's keys (SC6020) and hands the round back.
	// The child itself masks with its real key. Armed as
	// "bad-outer-key:JOB:MARKER"; fires once across every process armed
	// with the same MARKER (Fires).
	BadOuterKey = "bad-outer-key"
	// ForgeRoundBundle: a child cluster's leader serves its silos, for
	// the parent round job named JOB, a copy of the parent's round
	// bundle with an X25519 key of its own in its sub-cohort's
	// Params.Parent (re-encoded, stored and named by its sub-job) — the
	// forgery that would let a child open its sub-cohort's shares. A
	// silo with parent_federation declines the round (SC7611) before it
	// charges or sends anything. Armed as "forge-round-bundle:JOB:MARKER";
	// fires once across every process armed with the same MARKER.
	ForgeRoundBundle = "forge-round-bundle"
	// SkewCrossCheck: an aggregator that recomputes a training round for
	// its leader (the cross-checked reduction) adds one ulp to the first
	// value of the sum it unmasked before its server step — a node whose
	// arithmetic is faulty. Its digest differs from the leader's, and the
	// leader stops the run (SC9107). The leader's own computation is not
	// touched, so every aggregator of a cluster may be armed.
	SkewCrossCheck = "skew-cross-check"
	// NoCrossCheck: an aggregator leads its training rounds as before
	// the cross-checked reduction (unrecorded, recorded "unchecked"):
	// the baseline BenchmarkFLRoundCrossCheck measures the check against,
	// in the same run.
	NoCrossCheck = "no-cross-check"
)

// enabled is "yes" in test builds only (set by the linker).
var enabled string

// Armed reports whether this process was started with the fault point.
func Armed(point string) bool {
	return enabled == "yes" && os.Getenv(Env) == point
}

// args returns the arguments a point was armed with ("point:a:b" gives
// a, b), and whether this process was started with that point.
func args(point string) ([]string, bool) {
	if enabled != "yes" {
		return nil, false
	}
	v := os.Getenv(Env)
	if v == point {
		return nil, true
	}
	rest, ok := strings.CutPrefix(v, point+":")
	if !ok {
		return nil, false
	}
	return strings.Split(rest, ":"), true
}

// Fires reports whether this process was armed with point for the job
// named name ("point:NAME:MARKER") and is the first, in any process
// armed with the same MARKER, to get there (once).
func Fires(point, name string) bool {
	a, ok := args(point)
	return ok && len(a) == 2 && a[0] == name && once(a[1])
}

// once reports whether this is the first call, in any process, to claim
// marker (a file it creates; an existing one, or none creatable, means
// another got there or none may).
func once(marker string) bool {
	f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// Kill ends the process at once, as SIGKILL from outside would: no
// deferred calls, no flushing, no goodbye to its peers.
func Kill() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		p.Kill()
	}
	time.Sleep(time.Minute) // the signal lands meanwhile
	os.Exit(137)
}
