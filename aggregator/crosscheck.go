package aggregator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/internal/testfault"
	"github.com/scellis/scellis/script"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/wire"
)

// The cross-checked reduction. A training round's outcome — the sum its
// secure aggregation opened and what the round's step made of it — is
// computed by the leader, and once more by a second aggregator node
// before anything is stored: the leader's host records the round's
// transcript (every message its secure-aggregation server accepted,
// wire.OpenRecorded; the masked inputs go to the checking peer as they
// arrive, crosscheck_forward.go), and as soon as the sum is open the
// leader sends the transcript to that peer, which replays the secure sum
// on a server of its own (wire.Replay) and runs the server step on it,
// while the leader runs its own. Each node hashes the outcome
// (fl.RoundDigest) and signs its digest; the round's result document
// cites both (fl.ReductionCheck). Different digests pause the run for a
// person with SC9107, before the next model is stored or reported:
// nothing of that round becomes the global model.
//
// A cluster of one node has no second node: its rounds are recorded
// self-only. A threshold-he or hierarchical round has no transcript a
// peer could replay (the partial decryptions and the children's partial
// sums are not the host's to hand over), and a round too large to
// record is not recorded: both are recorded unchecked, saying why.

// crossCheckPath is where an aggregator node recomputes a round for its
// leader (aggregators only).
const crossCheckPath = api.CrossCheckPath

// crossCheckMax bounds a cross-check request or a forwarded input: a
// transcript holds at most crossCheckMaxTranscript of masked inputs (the
// leader records no larger round) besides small messages.
const crossCheckMax = crossCheckMaxTranscript + 16<<20

// crossCheckRequest is what the leader sends a peer: the round, by its
// bundle (stored durably when the round opened), and its transcript.
type crossCheckRequest struct {
	Run        content.Ref      `cbor:"run"`
	Round      int              `cbor:"round"`
	Bundle     content.Ref      `cbor:"bundle"`
	Transcript *wire.Transcript `cbor:"transcript"`
}

// crossCheck is a peer's answer, or why there is none.
type crossCheck struct {
	node fl.CheckNode
	err  error
}

// crossCheckMaxTranscript bounds the transcript a round records: its
// masked inputs are held until the sum is open (n vectors, not the one
// accumulator), on the leader and again on the peer. A larger round is
// recorded unchecked, saying so.
const crossCheckMaxTranscript = 256 << 20

// recordRound says whether a round's secure sum is opened recorded, for a
// peer to replay: a masking round, flat, in a cluster of more than one
// node, whose masked inputs fit crossCheckMaxTranscript. Otherwise why
// is the note its result carries ("" in a cluster of one node).
func (n *Node) recordRound(b *fl.RoundBundle) (ok bool, why string) {
	size := int64(len(b.SecAgg.Members)) * int64(b.SecAgg.Dim+1) * 8
	switch {
	case n.peerClient == nil || len(n.peers()) == 0:
		return false, ""
	case b.SubCohorts != nil:
		return false, "a hierarchical round: its partial sums come from the child clusters, and no peer can replay them"
	case b.HE != nil:
		return false, "a threshold-he round: its partial decryptions are combined once, and no peer can replay them"
	case size > crossCheckMaxTranscript:
		return false, fmt.Sprintf("its masked inputs (up to %d MiB) are over the %d MiB a cross-checked round may hold", size>>20, crossCheckMaxTranscript>>20)
	case testfault.Armed(testfault.NoCrossCheck):
		return false, "not cross-checked (test fault " + testfault.NoCrossCheck + ")"
	}
	return true, ""
}

// startCrossCheck asks the peers, in name order, to recompute the round
// until one answers with its digest or finds the round's inputs do not
// give its outcome; a peer that cannot be reached or is not ready is
// passed over. The answer arrives on the channel.
func (rr *roundRun) startCrossCheck(ctx context.Context) <-chan crossCheck {
	n := rr.n
	out := make(chan crossCheck, 1)
	req := crossCheckRequest{Run: rr.st.ID, Round: rr.r, Bundle: rr.bref, Transcript: rr.transcript}
	rr.unmasked = time.Now()
	go func() {
		body, err := content.Encode(&req)
		if err != nil {
			out <- crossCheck{err: err}
			return
		}
		var errs []error
		peers := n.fed.ByRole(identity.Aggregator)
		// The checker the masked inputs were forwarded to first.
		slices.SortStableFunc(peers, func(a, b identity.Member) int { return cmpBool(a.Name != rr.checker, b.Name != rr.checker) })
		for _, m := range peers {
			if m.Name == n.Self.Name {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, WriteTimeout)
			raw, err := n.peerClient.PostCBORTo(cctx, "https://"+m.Address, crossCheckPath, body)
			cancel()
			if err != nil {
				if ds, ok := diag.As(err); ok && slices.ContainsFunc(ds, func(d *diag.Diagnostic) bool { return d.Code == diag.FLCrossCheck }) {
					out <- crossCheck{node: fl.CheckNode{Node: m.Name}, err: err}
					return
				}
				errs = append(errs, fmt.Errorf("%s: %w", m.Name, err))
				continue
			}
			var node fl.CheckNode
			if err := content.Decode(raw, &node); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", m.Name, err))
				continue
			}
			if err := checkSigned(m, rr.statement(m.Name, node.Digest), node); err != nil {
				errs = append(errs, err)
				continue
			}
			out <- crossCheck{node: node}
			return
		}
		out <- crossCheck{err: fmt.Errorf("no peer recomputed the round: %w", errors.Join(errs...))}
	}()
	return out
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// statement is what node signs for its digest of this round.
func (rr *roundRun) statement(node string, digest content.Ref) fl.CheckStatement {
	return fl.CheckStatement{Format: fl.CheckStatementFormat, Run: rr.st.ID, Round: rr.r, Bundle: rr.bref, Node: node, Digest: digest}
}

// checkSigned checks that node is m's, signed by m's federation key.
func checkSigned(m identity.Member, st fl.CheckStatement, node fl.CheckNode) error {
	if node.Node != m.Name || node.Key != m.PublicKey.String() || !identity.VerifyValue(m.PublicKey, identity.PurposeRoundCheck, st, node.Sig) {
		return fmt.Errorf("%s: its round check is not signed with its federation key", m.Name)
	}
	return nil
}

// signedCheck is this node's signed digest of the round.
func (n *Node) signedCheck(st fl.CheckStatement) (fl.CheckNode, error) {
	sig, err := identity.SignValue(n.id, identity.PurposeRoundCheck, st)
	if err != nil {
		return fl.CheckNode{}, err
	}
	return fl.CheckNode{Node: n.Self.Name, Key: n.id.Public().String(), Digest: st.Digest, Sig: sig}, nil
}

// checkReduction is the round's cross-check, once the leader computed
// its own outcome (nb, the next model encoded): both digests, equal, or
// the run stopped (SC9107), or the round retried when no peer answered.
func (rr *roundRun) checkReduction(ctx context.Context, nb []byte) (*fl.ReductionCheck, error) {
	n := rr.n
	digest, err := roundDigest(rr.st.ID, rr.r, rr.bref, rr.sum, nb, rr.step, rr.std)
	if err != nil {
		return nil, err
	}
	mine, err := n.signedCheck(rr.statement(n.Self.Name, digest))
	if err != nil {
		return nil, err
	}
	chk := &fl.ReductionCheck{Mode: fl.CrossChecked, Nodes: []fl.CheckNode{mine}}
	switch {
	case rr.check == nil && len(n.peers()) == 0:
		chk.Mode, chk.Note = fl.SelfOnly, "a cluster of one aggregator node: no second node recomputed the round"
		return chk, nil
	case rr.check == nil:
		chk.Mode, chk.Note = fl.Unchecked, rr.unchecked
		return chk, nil
	}
	var got crossCheck
	waited := time.Now()
	select {
	case got = <-rr.check:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	n.metrics.checkWait.Observe(time.Since(waited).Seconds())
	n.metrics.checkInputs.WithLabelValues("forwarded").Add(float64(len(rr.transcript.Forwarded)))
	n.metrics.checkInputs.WithLabelValues("held").Add(float64(len(rr.transcript.Stages["masked"])))
	n.log.Debug("round cross-checked", "run", rr.st.ID.Short(), "round", rr.r, "waited", time.Since(waited).Round(time.Microsecond), "since unmask", time.Since(rr.unmasked).Round(time.Microsecond),
		"forwarded", len(rr.transcript.Forwarded), "held", len(rr.transcript.Stages["masked"]))
	switch {
	case got.err != nil && got.node.Node != "":
		return nil, rr.halt(diag.New(diag.FLCrossCheck, fmt.Sprintf("run %s round %d", rr.spec.Name, rr.r),
			"%s could not recompute the round from its inputs: %v", got.node.Node, got.err).WithHelp(crossCheckHelp))
	case got.err != nil:
		return nil, rr.retry("round %d: %v", rr.r, got.err)
	case got.node.Digest != digest:
		return nil, rr.halt(diag.New(diag.FLCrossCheck, fmt.Sprintf("run %s round %d", rr.spec.Name, rr.r),
			"%s computed the round's outcome as %s, %s as %s", n.Self.Name, digest.Short(), got.node.Node, got.node.Digest.Short()).WithHelp(crossCheckHelp))
	}
	chk.Nodes = append(chk.Nodes, got.node)
	return chk, nil
}

// halt pauses the run for a person, with d as its reason.
func (rr *roundRun) halt(d *diag.Diagnostic) error {
	rr.n.metrics.rounds.WithLabelValues(rr.step, "cross-check-failed").Inc()
	return roundHalt{rr.job, d.Error()}
}

const crossCheckHelp = "nothing of the round was stored as the global model and the run is paused; one of the two nodes is faulty or compromised: " +
	"compare their logs and versions (scellis aggregator status), fix or replace the faulty node, then resume the run (scellis fl resume RUN) to run the round again"

// roundDigest hashes a round's outcome (fl.RoundDigest): the sum, who it
// holds, and the next model nb; std counts for the statistics step only
// (the other steps carry it forward).
func roundDigest(run content.Ref, round int, bundle content.Ref, sum *secagg.Result, nb []byte, step string, std *fl.Standardization) (content.Ref, error) {
	bits := make([]byte, 8*len(sum.Sum))
	for i, v := range sum.Sum {
		binary.LittleEndian.PutUint64(bits[8*i:], math.Float64bits(v))
	}
	d := fl.RoundDigest{
		Format: fl.RoundDigestFormat, Run: run, Round: round, Bundle: bundle, Sum: content.Hash(bits),
		Weight: sum.Weight, ErrorBound: sum.ErrorBound,
		Contributors: slices.Sorted(slices.Values(sum.Contributors)), Dropped: slices.Sorted(slices.Values(sum.Dropped)),
		Model: content.Hash(nb),
	}
	if step == fl.StepStats {
		d.Std = std
	}
	return content.HashOf(&d)
}

// stepOutcome is the round's step applied to its sum: the next global
// state (a training round's server step; the global as it is otherwise)
// and the statistics step's standardisation (std otherwise). The leader
// (reduce) and a cross-checking node (recompute) both run it.
func stepOutcome(ctx context.Context, env script.Env, strat *fl.Strategy, spec *fl.RunSpec, step string, global fl.Global, std *fl.Standardization, update []float64, metrics map[string]float64, sum *secagg.Result) (fl.Global, *fl.Standardization, error) {
	switch step {
	case fl.StepStats:
		// Under DP the noised sums are made possible ones (post-processing,
		// fl.StatsFromSums): noise never makes the step fail.
		s, err := fl.StatsFromSums(update, metrics["rows"], spec.StatsDP(len(sum.Contributors)))
		return global, s, err
	case fl.StepTrain:
		next, err := fl.ServerStep(ctx, env, strat, global, update, sum.Weight)
		return next, std, err
	}
	return global, std, nil
}

// serveCrossCheck recomputes a round for the leader: another aggregator
// node only. Its answer is this node's signed digest; a round whose
// inputs do not give an outcome here is refused with SC9107 (422), and
// what may heal (a blob not here yet) with 503.
func (n *Node) serveCrossCheck(w http.ResponseWriter, r *http.Request) {
	if !n.aggregatorOnly(w, r, crossCheckPath) {
		return
	}
	m, _ := n.fed.PeerFromRequest(r)
	raw, err := n.shadows.readBody(w, r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	var req crossCheckRequest
	if err := content.Decode(raw, &req); err != nil || req.Transcript == nil {
		http.Error(w, fmt.Sprintf("not a cross-check request: %v", err), http.StatusBadRequest)
		return
	}
	started := time.Now()
	node, err := n.recompute(r.Context(), req)
	var refused *refusedInputs
	switch {
	case errors.As(err, &refused):
		n.log.Warn("cross-check: the round's inputs give no outcome here", "run", req.Run.Short(), "round", req.Round, "err", err)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		diag.RenderJSON(w, diag.List{diag.New(diag.FLCrossCheck, fmt.Sprintf("run %s round %d", req.Run.Short(), req.Round), "%v", refused.err).
			WithHelp(crossCheckHelp)})
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	b, err := content.Encode(&node)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	n.log.Debug("cross-checked a round", "run", req.Run.Short(), "round", req.Round, "digest", node.Digest.Short(), "for", m.Name, "took", time.Since(started).Round(time.Microsecond))
	w.Header().Set("Content-Type", "application/cbor")
	w.Write(b)
}

// refusedInputs: the round's inputs give no outcome (the transcript does
// not replay, the server step fails): a disagreement, not a transient
// failure.
type refusedInputs struct{ err error }

func (e *refusedInputs) Error() string { return e.err.Error() }

// recompute computes a round's outcome on this node from its replicated
// inputs — the run spec and round bundle from the blob stores, the run
// from this node's replica of the log, the sum from the transcript — and
// signs its digest.
func (n *Node) recompute(ctx context.Context, req crossCheckRequest) (fl.CheckNode, error) {
	start := time.Now()
	st, err := n.fsm.machine().Run(req.Run)
	if err != nil {
		return fl.CheckNode{}, err
	}
	rc, err := n.loadRun(ctx, req.Run)
	if err != nil {
		return fl.CheckNode{}, err
	}
	bb, err := n.fetchBlob(ctx, req.Bundle)
	if err != nil {
		return fl.CheckNode{}, err
	}
	var b fl.RoundBundle
	if err := content.Decode(bb, &b); err != nil || b.Run != req.Run || b.Round != req.Round || b.HE != nil || b.SubCohorts != nil {
		return fl.CheckNode{}, &refusedInputs{fmt.Errorf("bundle %s is not a masking round %d of run %s (%v)", req.Bundle.Short(), req.Round, req.Run.Short(), err)}
	}
	gb, err := n.fetchBlob(ctx, b.Global)
	if err != nil {
		return fl.CheckNode{}, err
	}
	global, err := fl.DecodeGlobal(gb)
	if err != nil {
		return fl.CheckNode{}, &refusedInputs{err}
	}
	spec := &rc.canon.Spec
	step, trainRound := spec.Step(req.Round)
	strat := rc.strat.With(map[string]any{"round": int64(trainRound), "sites": int64(len(st.Silos))})
	t0 := time.Now()
	var fs *wire.ForwardedSum
	if len(req.Transcript.Forwarded) > 0 {
		var ok bool
		if fs, ok = n.takeShadow(req.Bundle); !ok {
			return fl.CheckNode{}, fmt.Errorf("no masked input of round %q was forwarded here", b.SecAgg.Round)
		}
	}
	sum, err := wire.Replay(b.SecAgg, req.Transcript, fs)
	t1 := time.Now()
	if err != nil {
		return fl.CheckNode{}, &refusedInputs{fmt.Errorf("its secure sum does not replay: %w", err)}
	}
	if testfault.Armed(testfault.SkewCrossCheck) && len(sum.Sum) > 0 {
		n.log.Warn("test fault: skewing the recomputed sum by one ulp", "fault", testfault.SkewCrossCheck)
		sum.Sum[0] = math.Nextafter(sum.Sum[0], math.Inf(1))
	}
	update, metrics := b.Unpack(sum.Sum)
	next, std, err := stepOutcome(ctx, n.env(rc, req.Run, req.Round), strat, spec, step, global, b.Std, update, metrics, sum)
	if err != nil {
		return fl.CheckNode{}, &refusedInputs{fmt.Errorf("its %s step fails here: %w", step, err)}
	}
	nb, err := next.Encode()
	if err != nil {
		return fl.CheckNode{}, &refusedInputs{err}
	}
	n.log.Debug("recomputed a round", "run", req.Run.Short(), "round", req.Round, "inputs", t0.Sub(start).Round(time.Microsecond), "replay", t1.Sub(t0).Round(time.Microsecond), "step", time.Since(t1).Round(time.Microsecond))
	digest, err := roundDigest(req.Run, req.Round, req.Bundle, sum, nb, step, std)
	if err != nil {
		return fl.CheckNode{}, err
	}
	return n.signedCheck(fl.CheckStatement{Format: fl.CheckStatementFormat, Run: req.Run, Round: req.Round, Bundle: req.Bundle, Node: n.Self.Name, Digest: digest})
}
