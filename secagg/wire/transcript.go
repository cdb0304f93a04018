package wire

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/secagg"
)

// Transcripts. A masking round opened with OpenRecorded keeps the
// canonical bytes of every message its state machine accepted, stage by
// stage, so that another node can Replay the round: build its own server
// from the same params, add the same messages, end the same phases and
// unmask the sum itself. The aggregator's cross-checked reduction of a
// training round rests on it (docs/fl.md, "The cross-checked reduction").
//
// What it costs: a recorded round holds every site's masked input until
// its outcome is taken — n masked vectors instead of the one accumulator
// an unrecorded round holds — unless it forwards them: then each masked
// input is sent on to the replaying node as the host accepts it (Forwarder),
// which sums them as they come (secagg.Accumulator), and the transcript
// keeps only its hash. What it reveals: nothing the host did not see
// already; every message was sent to the host, and a masked input alone
// is uniformly random.

// TranscriptFormat versions Transcript.
const TranscriptFormat = "scellis/secagg-transcript/v1"

// Transcript is what a masking round's host accepted: for each stage (its
// path: advert, shares, masked, signature, unmasking), each site's
// message as it arrived, in canonical CBOR.
type Transcript struct {
	Format string                       `cbor:"format"`
	Round  string                       `cbor:"round"`
	Stages map[string]map[string][]byte `cbor:"stages"`
	// Forwarded are the masked inputs that reached the replaying node as
	// the host accepted them (Forwarder), by site: the hash of each one's
	// bytes. Stages["masked"] holds the others.
	Forwarded map[string]content.Ref `cbor:"forwarded,omitempty"`
}

// Forwarder sends a masked input (its canonical bytes) from site on to the
// node that will replay the round, as the host accepts it; nil once it
// arrived there. It runs in the background, beside the round.
type Forwarder func(site string, body []byte) error

// recorder keeps a recorded round's transcript as its messages arrive.
type recorder struct {
	mu  sync.Mutex
	t   Transcript
	fwd Forwarder      // nil: masked inputs are kept
	wg  sync.WaitGroup // forwards not yet done
}

func newRecorder(round string, fwd Forwarder) *recorder {
	return &recorder{fwd: fwd, t: Transcript{Format: TranscriptFormat, Round: round, Stages: map[string]map[string][]byte{}, Forwarded: map[string]content.Ref{}}}
}

// stageMasked is the masked inputs' stage.
const stageMasked = "masked"

// record notes site's message of stage before the state machine adds it,
// so that no message the machine used is missing however the round ends;
// undo takes it back when the machine refuses it, and done, once it took
// it, forwards a masked input (the transcript then drops its bytes once
// it arrived). A site's second message of a stage is not noted (the
// machine refuses it: a site sends one).
func (r *recorder) record(stage, site string, body []byte) (undo, done func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.t.Stages[stage]
	if m == nil {
		m = map[string][]byte{}
		r.t.Stages[stage] = m
	}
	if _, dup := m[site]; dup {
		return func() {}, func() {}
	}
	if _, dup := r.t.Forwarded[site]; dup && stage == stageMasked {
		return func() {}, func() {}
	}
	b := slices.Clone(body)
	m[site] = b
	fwd := stage == stageMasked && r.fwd != nil
	if fwd {
		r.wg.Add(1) // before the machine adds it: a snapshot waits for it
	}
	undo = func() {
		r.mu.Lock()
		delete(r.t.Stages[stage], site)
		r.mu.Unlock()
		if fwd {
			r.wg.Done()
		}
	}
	done = func() {
		if !fwd {
			return
		}
		go func() {
			defer r.wg.Done()
			if r.fwd(site, b) != nil {
				return // kept: the transcript carries it
			}
			r.mu.Lock()
			delete(r.t.Stages[stage], site)
			r.t.Forwarded[site] = content.Hash(b)
			r.mu.Unlock()
		}()
	}
	return undo, done
}

// snapshot is a copy of the transcript, once every forward started is
// done (the messages are shared: they are never written again).
func (r *recorder) snapshot() *Transcript {
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	t := Transcript{Format: r.t.Format, Round: r.t.Round, Stages: make(map[string]map[string][]byte, len(r.t.Stages)), Forwarded: maps.Clone(r.t.Forwarded)}
	for k, v := range r.t.Stages {
		t.Stages[k] = maps.Clone(v)
	}
	return &t
}

// OpenRecorded opens a masking round as Open does, keeping its transcript
// for WaitRecorded; fwd, when not nil, forwards each masked input as it
// is accepted, and the transcript keeps the bytes of those it could not.
// A relayed sub-cohort (p.Parent) is refused: its sum is opened by its
// parent.
func (h *Host) OpenRecorded(p secagg.Params, dl Deadlines, fwd Forwarder) error {
	if p.Parent != nil {
		return fmt.Errorf("wire: round %q: a relayed sub-cohort is not recorded", p.Round)
	}
	return h.open(opening{sch: &masking, id: p.Round, digest: p.Digest, members: p.Members, state: func() (roundState, error) {
		srv, err := secagg.NewServer(p)
		return &maskRound{srv: srv, n: int64(len(p.Members)), units: int64(maskUnits(p)), rec: newRecorder(p.Round, fwd)}, err
	}}, dl)
}

// WaitRecorded waits for a round opened with OpenRecorded, as Wait does,
// and takes its transcript with its sum, once the forwards are done.
func (h *Host) WaitRecorded(ctx context.Context, round string) (*secagg.Result, *Transcript, error) {
	rd, err := h.ended(ctx, round, &masking)
	if err != nil {
		return nil, nil, err
	}
	var t *Transcript
	res, err := takeOutcome(h, rd, func(m *maskRound) (*secagg.Result, error) {
		if m.rec == nil {
			return nil, fmt.Errorf("wire: round %q was not opened recorded", round)
		}
		t = m.rec.snapshot()
		res := m.result
		m.result, m.resultCBOR = nil, nil
		return res, nil
	})
	return res, t, err
}

// phaseEnds are what Replay calls after each stage's messages: the phase
// ends the host's round ran (maskRound.run), the last being Finish.
var phaseEnds = map[string]func(*secagg.Server) error{
	"advert":    func(s *secagg.Server) error { _, err := s.EndAdvertise(); return err },
	pathReveal:  func(s *secagg.Server) error { _, err := s.EndReveal(); return err },
	"shares":    func(s *secagg.Server) error { _, err := s.EndShare(); return err },
	"masked":    func(s *secagg.Server) error { _, err := s.EndMask(); return err },
	"signature": func(s *secagg.Server) error { _, err := s.EndConsistency(); return err },
}

// pathReveal is the path of a sparse SecAgg+ round's graph reveals.
const pathReveal = "reveal"

// replayOrder is masking's stages in the order a round runs them: the
// graph reveals come right after the adverts (secagg.PhaseReveal), though
// the scheme lists that stage last.
func replayOrder() []stage {
	var order []stage
	for _, st := range masking.stages {
		if st.path != pathReveal {
			order = append(order, st)
		}
		if st.path == "advert" {
			i := slices.IndexFunc(masking.stages, func(s stage) bool { return s.path == pathReveal })
			order = append(order, masking.stages[i])
		}
	}
	return order
}

// ForwardedSum is what the replaying node made of the masked inputs
// forwarded to it: their sum (secagg.Accumulator) and each one's hash, by
// site.
type ForwardedSum struct {
	Sum    []byte
	Hashes map[string]content.Ref
}

// Replay runs the masking round p again from its transcript on a server
// of its own and returns the sum it unmasks: each stage's messages are
// parsed and added (in site order: the ring sum does not depend on it),
// then the phase is ended, as the host did. The masked inputs forwarded
// beforehand come in as fs, which must hold exactly the transcript's
// (by hash): their sum is added as the first such site's input and the
// others' as zeros, which is the same ring sum. Every check of the state
// machine is made again — advert and survivor signatures, share
// commitments — so a transcript that is not a round's refuses to replay.
func Replay(p secagg.Params, t *Transcript, fs *ForwardedSum) (*secagg.Result, error) {
	if t == nil || t.Format != TranscriptFormat || t.Round != p.Round {
		return nil, fmt.Errorf("wire: not a transcript of round %q", p.Round)
	}
	for st := range t.Stages {
		if !slices.ContainsFunc(masking.stages, func(s stage) bool { return s.path == st }) {
			return nil, fmt.Errorf("wire: transcript of round %q has an unknown stage %q", p.Round, st)
		}
	}
	srv, err := secagg.NewServer(p)
	if err != nil {
		return nil, err
	}
	state := &maskRound{srv: srv}
	for _, st := range replayOrder() {
		if st.path == pathReveal && len(t.Stages[st.path]) == 0 && srv.Phase() != secagg.PhaseReveal {
			continue // not a sparse SecAgg+ round: no graph to reveal
		}
		msgs := t.Stages[st.path]
		for _, site := range slices.Sorted(maps.Keys(msgs)) {
			from, add, err := st.parse(state, msgs[site])
			if err != nil {
				return nil, err
			}
			if from != site {
				return nil, fmt.Errorf("wire: transcript of round %q: %s's %s is from %q", p.Round, site, st.what, from)
			}
			if err := add(); err != nil {
				return nil, err
			}
		}
		if st.path == stageMasked && len(t.Forwarded) > 0 {
			if err := addForwarded(srv, p, t, fs); err != nil {
				return nil, err
			}
		}
		if end := phaseEnds[st.path]; end != nil {
			if err := end(srv); err != nil {
				return nil, err
			}
		}
	}
	return srv.Finish()
}

// addForwarded adds the forwarded masked inputs' sum to srv.
func addForwarded(srv *secagg.Server, p secagg.Params, t *Transcript, fs *ForwardedSum) error {
	if fs == nil || !maps.Equal(fs.Hashes, t.Forwarded) {
		return fmt.Errorf("wire: transcript of round %q: the masked inputs forwarded here are not the ones it names", p.Round)
	}
	var zeros []byte
	for i, site := range slices.Sorted(maps.Keys(t.Forwarded)) {
		if _, inline := t.Stages[stageMasked][site]; inline {
			return fmt.Errorf("wire: transcript of round %q: %s's masked input is both forwarded and held", p.Round, site)
		}
		v := fs.Sum
		if i > 0 {
			if zeros == nil {
				zeros = make([]byte, len(fs.Sum))
			}
			v = zeros
		}
		if err := srv.AddMaskedInput(&secagg.MaskedInput{Round: p.Round, From: site, Masked: v}); err != nil {
			return err
		}
	}
	return nil
}

// Hash is the transcript's content hash (its canonical encoding's).
func (t *Transcript) Hash() (content.Ref, error) { return content.HashOf(t) }
