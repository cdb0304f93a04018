package aggregator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/wire"
)

// Forwarded masked inputs. A recorded round would hold every site's
// masked input until its sum is open, and the peer that checks it would
// receive and hold them all again. Instead the leader's host forwards
// each masked input to the round's checker as it accepts it (the mask
// phase, while the other sites still train and send), and the checker
// adds it into a sum of its own (secagg.Accumulator), keeping one vector
// per round; the transcript names the forwarded inputs by hash, and
// carries only those a forward failed for. The checker then replays the
// round with its own sum of the inputs (wire.Replay): the accumulation is
// recomputed too, and neither node holds more than the accumulator.

// crossCheckMaskedPath is where the checker takes a forwarded masked
// input (aggregators only).
const crossCheckMaskedPath = api.CrossCheckMaskedPath

// forwardedInput is one forwarded masked input: the round, by its bundle,
// and the site's masked input as the host accepted it.
type forwardedInput struct {
	Run    content.Ref `cbor:"run"`
	Round  int         `cbor:"round"`
	Bundle content.Ref `cbor:"bundle"`
	Site   string      `cbor:"site"`
	Masked []byte      `cbor:"masked"`
}

// shadowKeep is how long a checker keeps the sum of a round's forwarded
// inputs for the round's cross-check (a round abandoned by its leader
// never asks).
const shadowKeep = 30 * time.Minute

// shadowSums are a checker's sums of forwarded inputs, by round bundle.
// A compromised leader must not be able to fill a checker's memory with
// them: a sum is made only for a run of the replicated log, one round per
// run at a time (a run's rounds are sequential; a newer round's first
// forward drops the older one's sum), and only for a round the leader
// would record (crossCheckMaxTranscript); at most crossCheckReads bodies
// of forwards and cross-check requests are read into memory at once.
type shadowSums struct {
	mu    sync.Mutex
	m     map[content.Ref]*shadowSum
	reads chan struct{}
}

type shadowSum struct {
	run    content.Ref
	acc    *secagg.Accumulator
	mu     sync.Mutex
	hashes map[string]content.Ref
	at     time.Time
}

// crossCheckReads is how many forwarded inputs and cross-check requests
// a checker reads into memory at once; more wait their turn.
const crossCheckReads = 4

// readBody reads a forwarded input's or a cross-check request's body, at
// most crossCheckMax bytes, waiting its turn among crossCheckReads.
func (s *shadowSums) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	s.mu.Lock()
	if s.reads == nil {
		s.reads = make(chan struct{}, crossCheckReads)
	}
	reads := s.reads
	s.mu.Unlock()
	select {
	case reads <- struct{}{}:
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	defer func() { <-reads }()
	return io.ReadAll(http.MaxBytesReader(w, r.Body, crossCheckMax))
}

// open returns the sum of round bundle ref (b, of run) here, made if it
// is new. A round too large to record is refused; the run's older rounds'
// sums, and sums older than shadowKeep, are dropped.
func (s *shadowSums) open(run, ref content.Ref, b *fl.RoundBundle) (*shadowSum, error) {
	p := b.SecAgg
	if p.Dim < 0 || p.Dim > secagg.MaxDim || int64(len(p.Members))*int64(p.Dim+1)*8 > crossCheckMaxTranscript {
		return nil, fmt.Errorf("round bundle %s: its masked inputs (%d sites of %d values) are over the %d MiB a cross-checked round may hold", ref.Short(), len(p.Members), p.Dim, crossCheckMaxTranscript>>20)
	}
	// Made before anything is dropped: a bundle whose parameters do not
	// make a round leaves the run's sum as it was.
	acc, err := secagg.NewAccumulator(p)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sh, ok := s.m[ref]; ok {
		return sh, nil // made meanwhile by another site's forward
	}
	if s.m == nil {
		s.m = map[content.Ref]*shadowSum{}
	}
	for k, v := range s.m {
		if v.run == run || time.Since(v.at) > shadowKeep {
			delete(s.m, k)
		}
	}
	sh := &shadowSum{run: run, acc: acc, hashes: map[string]content.Ref{}, at: time.Now()}
	s.m[ref] = sh
	return sh, nil
}

// checkerOf is the peer that checks this node's rounds first: the first
// other aggregator of the federation file.
func (n *Node) checkerOf() (identity.Member, bool) {
	for _, m := range n.fed.ByRole(identity.Aggregator) {
		if m.Name != n.Self.Name {
			return m, true
		}
	}
	return identity.Member{}, false
}

// forwarder forwards the round's masked inputs to checker. Once a
// forward failed, the round's later inputs are held at once (the
// transcript carries them): a checker that is down or cut off costs a
// round one forward's deadline at most, not one per site.
func (rr *roundRun) forwarder(checker identity.Member) wire.Forwarder {
	n := rr.n
	var failed atomic.Bool
	return func(site string, body []byte) (err error) {
		if failed.Load() {
			return errors.New("an earlier forward of the round failed")
		}
		defer func() {
			if err != nil {
				failed.Store(true)
			}
		}()
		b, err := content.Encode(&forwardedInput{Run: rr.st.ID, Round: rr.r, Bundle: rr.bref, Site: site, Masked: body})
		if err != nil {
			return err
		}
		life := n.early.life
		if life == nil {
			life = context.Background()
		}
		ctx, cancel := context.WithTimeout(life, 10*time.Second)
		defer cancel()
		_, err = n.peerClient.PostCBORTo(ctx, "https://"+checker.Address, crossCheckMaskedPath, b)
		return err
	}
}

// serveForwarded adds a forwarded masked input to its round's sum here.
func (n *Node) serveForwarded(w http.ResponseWriter, r *http.Request) {
	if !n.aggregatorOnly(w, r, crossCheckMaskedPath) {
		return
	}
	raw, err := n.shadows.readBody(w, r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	var in forwardedInput
	if err := content.Decode(raw, &in); err != nil {
		http.Error(w, fmt.Sprintf("not a forwarded masked input: %v", err), http.StatusBadRequest)
		return
	}
	sh, err := n.shadow(r.Context(), in)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	m, err := secagg.ParseMaskedInput(in.Masked)
	if err == nil && m.From != in.Site {
		err = fmt.Errorf("the masked input of %q is from %q", in.Site, m.From)
	}
	if err == nil {
		err = sh.add(in.Site, m, content.Hash(in.Masked))
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// add adds site's masked input m (whose bytes hash to h) once. The same
// input again — a forward retried after its answer was lost — is taken as
// done, not refused: refused, the leader would hold the input in the
// transcript as well, and the replay would find it both forwarded and
// held.
func (sh *shadowSum) add(site string, m *secagg.MaskedInput, h content.Ref) error {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if had, ok := sh.hashes[site]; ok {
		if had == h {
			return nil
		}
		return fmt.Errorf("a second, different masked input of %q", site)
	}
	if err := sh.acc.Add(m); err != nil {
		return err
	}
	sh.hashes[site] = h
	return nil
}

// shadow is the sum of the forwarded inputs of in's round, made at its
// first input from the round's bundle (stored on two nodes before the
// round opened).
func (n *Node) shadow(ctx context.Context, in forwardedInput) (*shadowSum, error) {
	s := &n.shadows
	s.mu.Lock()
	sh, ok := s.m[in.Bundle]
	s.mu.Unlock()
	if ok {
		return sh, nil
	}
	// The bundle is read without the lock: a slow read of one round's
	// must not hold up the forwards of another.
	bb, err := n.fetchBlob(ctx, in.Bundle)
	if err != nil {
		return nil, err
	}
	var b fl.RoundBundle
	if err := content.Decode(bb, &b); err != nil || b.Run != in.Run || b.Round != in.Round {
		return nil, fmt.Errorf("bundle %s is not round %d of run %s (%v)", in.Bundle.Short(), in.Round, in.Run.Short(), err)
	}
	if _, err := n.fsm.machine().Run(in.Run); err != nil {
		return nil, fmt.Errorf("run %s: %w", in.Run.Short(), err)
	}
	return s.open(in.Run, in.Bundle, &b)
}

// takeShadow takes the forwarded inputs' sum of a round, by its bundle,
// for its replay.
func (n *Node) takeShadow(bundle content.Ref) (*wire.ForwardedSum, bool) {
	s := &n.shadows
	s.mu.Lock()
	sh, ok := s.m[bundle]
	delete(s.m, bundle)
	s.mu.Unlock()
	if !ok {
		return nil, false
	}
	sum, _ := sh.acc.Sum()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return &wire.ForwardedSum{Sum: sum, Hashes: sh.hashes}, true
}

// aggregatorOnly refuses a caller that is not an aggregator (SC7108, as
// every endpoint refuses a role).
func (n *Node) aggregatorOnly(w http.ResponseWriter, r *http.Request, path string) bool {
	m, ok := n.fed.PeerFromRequest(r)
	if !ok {
		http.Error(w, "not a federation member", http.StatusUnauthorized)
		return false
	}
	i := slices.IndexFunc(api.Endpoints(), func(e api.Endpoint) bool { return e.Path == path })
	if e := api.Endpoints()[i]; !e.Allows(m.Role) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		diag.RenderJSON(w, diag.List{api.Forbidden(m, e)})
		return false
	}
	return true
}
