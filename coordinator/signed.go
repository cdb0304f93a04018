package coordinator

import (
	"bytes"
	"runtime"
	"sync"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
)

// Signed reports and verdicts (the verification regime's item 7). In a
// machine configured with SignedReports every result report carries the
// peer's Ed25519ctx signature of a receipt.Statement — job, shard, result
// hash and the job's tier — and every verdict the verifier's signature of
// the verdict; both are checked here, on apply, and refused (SC7305) when
// missing or bad. The check is a pure function of the command and the
// replicated state, so every replica decides alike:
//
//   - once the membership has gone through the log (membership.go), the
//     key must be the signer's key there;
//   - before that, the key is the one the proposing leader authenticated
//     the peer by (its TLS certificate, pinned to the federation file every
//     node starts from), carried in the command.
//
// The agreeing peers' signatures are copied into the receipt their shard
// mints, so `scellis receipts verify` checks them offline against the
// federation file (receipt.Receipt.VerifySignatures).

// PurposeVerdict is the Ed25519ctx context of a verdict signature: the
// value of identity.PurposeVerdict.
const PurposeVerdict = "scellis/verdict/v1"

// TierOf is the reproducibility tier a job's peers sign for: convergent
// for a compare check, replayable otherwise (exact match, and Freivalds,
// whose one execution is judged, not compared).
func TierOf(p Policy) string {
	if p.Check == CheckCompare {
		return receipt.TierConvergent
	}
	return receipt.TierReplayable
}

// StatementOf is what peer signs when it reports result for job's shard.
func StatementOf(job content.Ref, shard int, result content.Ref, p Policy, peer string) receipt.Statement {
	return receipt.Statement{Job: job, Shard: shard, Result: result, Tier: TierOf(p), Peer: peer}
}

// VerdictBytes is the message a verifier signs for v: its canonical
// encoding without Now and Sig.
func VerdictBytes(v ReportVerdict) []byte {
	v.Now, v.Sig = 0, nil
	b, err := content.Encode(v)
	if err != nil {
		panic("coordinator: encoding a verdict: " + err.Error())
	}
	return b
}

// signerKey checks that key may sign for peer: the peer's key in the
// replicated membership once there is one, the proposer's otherwise.
func (m *Machine) signerKey(peer, key string) string {
	if key == "" {
		return "carries no key"
	}
	if receipt.IsVolunteer(peer) {
		// A browser volunteer is no member: its name is derived from
		// its key (receipt/volunteer.go), so the name says which key.
		if !receipt.VolunteerKey(peer, key) {
			return "is signed with a key the volunteer's name was not derived from"
		}
		return ""
	}
	if ms := m.st.Membership; ms != nil {
		e, ok := ms.member(peer)
		switch {
		case !ok:
			return "is not a member of the federation"
		case e.PublicKey != key:
			return "is signed with a key that is not the member's (rotated?)"
		}
	}
	return ""
}

func (m *Machine) checkReportSig(c ReportResult, j *jobState, s *shardState) *diag.Diagnostic {
	if !m.st.SignedReports && len(c.Sig) == 0 && c.Key == "" {
		return nil
	}
	why := m.signerKey(c.Peer, c.Key)
	if why == "" && len(c.Sig) == 0 {
		why = "is not signed"
	}
	if why == "" && !m.verifyStatement(c.Key, StatementOf(j.ID, s.Index, c.Result, j.Policy, c.Peer), c.Sig, c.Path) {
		why = "has a signature that does not verify for its job, shard, result and tier " + TierOf(j.Policy)
	}
	if why == "" {
		why = checkCite(c)
	}
	if why == "" {
		return nil
	}
	return diag.New(diag.VerifyBadSignature, shardSubject(j, s.Index), "%s's report of shard %d %s", c.Peer, s.Index, why).
		WithHelp("a peer signs its report with its federation identity key (scellis worker and scellis silo do by themselves); restart a worker whose key was rotated")
}

func (m *Machine) checkVerdictSig(c ReportVerdict, j *jobState) *diag.Diagnostic {
	if !m.st.SignedReports && len(c.Sig) == 0 && c.Key == "" {
		return nil
	}
	why := m.signerKey(c.Verifier, c.Key)
	if why == "" && !receipt.VerifySigned(c.Key, PurposeVerdict, VerdictBytes(c), c.Sig) {
		why = "has a missing or bad signature"
	}
	if why == "" {
		return nil
	}
	return diag.New(diag.VerifyBadSignature, shardSubject(j, c.Shard), "the verdict of %s on shard %d %s", c.Verifier, c.Shard, why).
		WithHelp("a verifier signs its verdict with its identity key; an aggregator does so by itself")
}

// signaturesOf returns the tier and the agreeing peers' signatures for
// s's receipt, in the order of s.Agreeing; none when some agreeing
// report is unsigned (a machine without SignedReports).
func signaturesOf(j *jobState, s *shardState) (string, []receipt.PeerSignature) {
	sigs := make([]receipt.PeerSignature, 0, len(s.Agreeing))
	for _, p := range s.Agreeing {
		rep := s.reportOf(p)
		if rep == nil || len(rep.Sig) == 0 {
			return "", nil
		}
		sigs = append(sigs, receipt.PeerSignature{Peer: p, Result: rep.Result, Key: rep.Key, Sig: bytes.Clone(rep.Sig), Path: bytes.Clone(rep.Path)})
	}
	if len(sigs) == 0 {
		return "", nil
	}
	return TierOf(j.Policy), sigs
}

func bytesClone(b []byte) []byte { return bytes.Clone(b) }

// info is r as queries show it: without its signature, which would let
// anyone test a guess of an undecided result's hash (law 13).
func (r report) info() ReportInfo {
	return ReportInfo{Peer: r.Peer, Result: r.Result, Late: r.Late, Outcome: r.Outcome, At: r.At}
}

// sigCheck is one Ed25519ctx check of a result's signature: of a
// statement (purpose receipt.PurposeResult), or of the Merkle root of a
// batch of them (receipt.PurposeResultBatch).
type sigCheck struct{ key, purpose, msg, sig string }

// checkOf is the check that sig, with its batch path, signs st; false
// when the path is malformed (the signature then does not verify).
func checkOf(key string, st receipt.Statement, sig, path []byte) (sigCheck, bool) {
	purpose, msg, ok := receipt.SignedMessage(st, path)
	return sigCheck{key, purpose, string(msg), string(sig)}, ok
}

func (c sigCheck) verify() bool {
	return receipt.VerifySigned(c.key, c.purpose, []byte(c.msg), []byte(c.sig))
}

// verifyStatement checks a report's signature (and its batch path),
// answered from the checks a batch made ahead (preverify) when it has one.
func (m *Machine) verifyStatement(key string, st receipt.Statement, sig, path []byte) bool {
	c, ok := checkOf(key, st, sig, path)
	if !ok {
		return false
	}
	if ok, done := m.preverified[c]; done {
		return ok
	}
	return c.verify()
}

// preverify checks the signatures of a batch's reports before the batch
// applies, one by one, in order: each distinct signature once — a
// worker's batch of reports shares one signature of its Merkle root
// (receipt/batch.go) — and on all cores when there are many: a batch of
// hundreds of reports signed one by one otherwise spends most of its
// apply in Ed25519 on one core. The check is a pure function of the
// report and its job's policy (fixed at submission), so the verdicts are
// the ones apply would reach itself; reports of jobs not known yet are
// left to apply.
func (m *Machine) preverify(b Batch) {
	var checks []sigCheck
	seen := map[sigCheck]bool{}
	reports := 0
	for _, c := range b.Commands {
		r, ok := c.(ReportResult)
		if !ok || len(r.Sig) == 0 || r.Key == "" {
			continue
		}
		j, s, d := m.shard(r.Job, r.Shard)
		if d != nil {
			continue
		}
		check, ok := checkOf(r.Key, StatementOf(j.ID, s.Index, r.Result, j.Policy, r.Peer), r.Sig, r.Path)
		if !ok {
			continue // refused by apply without a signature check
		}
		reports++
		if !seen[check] {
			seen[check] = true
			checks = append(checks, check)
		}
	}
	if reports < 2 || (len(checks) == reports && reports < 8) {
		return // nothing shared, and too few to be worth the goroutines
	}
	ok := make([]bool, len(checks))
	workers := min(runtime.GOMAXPROCS(0), len(checks))
	if len(checks) < 8 {
		workers = 1
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(checks); i += workers {
				ok[i] = checks[i].verify()
			}
		}()
	}
	wg.Wait()
	m.preverified = make(map[sigCheck]bool, len(checks))
	for i, c := range checks {
		m.preverified[c] = ok[i]
	}
}
