package secagg

import (
	"crypto/ecdh"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/scellis/scellis/diag"
)

// Server is the aggregator's side of a secure aggregation round. Each
// phase collects one kind of message from the clients, as they arrive, and
// ends when the driver calls its End method (after a deadline, or once
// Missing is empty):
//
//	AddAdvert…        EndAdvertise   → KeySet (to every client of U1)
//	AddReveal…        EndReveal      → GraphRevealSet (SecAgg+ on a sparse graph)
//	AddShares…        EndShare       → one ShareDelivery per client of U2
//	AddMaskedInput…   EndMask        → UnmaskRequest, unsigned (to every client of U3)
//	AddSignature…     EndConsistency → UnmaskRequest with the signatures (to every client of U4)
//	AddUnmasking…     Finish         → Result
//
// The consistency round (AddSignature, EndConsistency) is the active
// variant's of Bonawitz et al.: each survivor signs the survivor set it
// was shown, and reveals shares only once it sees enough signatures over
// that very set, so an aggregator that equivocates about dropouts is
// caught before any share leaves a client.
//
// A phase that ends with fewer than three clients, or fewer than the
// threshold, ends the round with a diagnostic and no result. Masked inputs
// are added into one accumulator as they arrive, so the server holds O(d)
// ring elements whatever the number of clients (plus O(n²) small shares).
// A Server is safe for concurrent use.
type Server struct {
	mu    sync.Mutex
	r     *round
	phase Phase
	err   error // why the round failed, once it has

	adverts    *advertSet // U1 once advertising ends
	reveals    map[string]*GraphReveal
	shares     map[string]*Shares // U2 once sharing ends (boxes dropped then)
	commits    map[string][]byte
	acc        []byte // Σ masked inputs so far, in the round's layout
	masked     map[string]bool
	survivors  []string          // U3
	dropped    []string          // U2 \ U3
	statement  []byte            // what a survivor signs for (survivors, dropped)
	sigs       map[string][]byte // U4: survivor signatures over statement
	unmaskings map[string]*Unmasking

	// opening is set on the parent's copy of a relayed sub-cohort
	// (openPartial): it takes opened shares, as a flat round's server.
	opening bool

	// testRing, when set by a test, receives the unmasked ring sum.
	testRing func([]uint64)
}

// Phase is where a server is in its round.
type Phase int

const (
	PhaseAdvertise   Phase = iota // collecting adverts
	PhaseReveal                   // collecting the graph's randomness (SecAgg+ on a sparse graph)
	PhaseShare                    // collecting encrypted shares
	PhaseMask                     // collecting masked inputs
	PhaseConsistency              // collecting signatures of the survivor set
	PhaseUnmask                   // collecting unmaskings
	PhaseDone                     // the result was produced
	PhaseFailed                   // the round ended without a result
)

var phaseNames = [...]string{"advertise", "reveal", "share", "mask", "consistency", "unmask", "done", "failed"}

func (p Phase) String() string {
	if p < 0 || int(p) >= len(phaseNames) {
		return fmt.Sprintf("Phase(%d)", int(p))
	}
	return phaseNames[p]
}

// Result is the outcome of a round: the sum of the survivors' inputs and
// nothing about any single one.
type Result struct {
	Round string
	// Sum is Σ x_u over the contributors, decoded from the ring.
	Sum []float64
	// Weight is Σ w_u over the contributors (0 on an unweighted round).
	Weight float64
	// Contributors are the clients whose inputs the sum holds (U3).
	Contributors []string
	// Dropped are the clients that shared keys but sent no input; their
	// masks were removed from the sum.
	Dropped []string
	// ErrorBound bounds |Sum_i − Σ x_u,i| due to fixed-point rounding:
	// one unit in the last place, 2^-f, per contributor. Decoding to
	// float64 adds at most half an ulp of Sum_i.
	ErrorBound float64
}

// NewServer returns the server of the round p.
func NewServer(p Params) (*Server, error) {
	r, err := newRound(p)
	if err != nil {
		return nil, err
	}
	return &Server{r: r, adverts: newAdvertSet()}, nil
}

// Phase returns the server's phase.
func (s *Server) Phase() Phase {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase
}

// Err returns why the round failed, or nil.
func (s *Server) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Missing returns, sorted, the clients the current phase still waits for:
// members that have not advertised, clients of U1 that have not shared,
// of U2 that have not sent a masked input, of U3 that have not signed the
// survivor set, of U4 (the signers) that have not unmasked.
func (s *Server) Missing() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var want []string
	var have func(string) bool
	switch s.phase {
	case PhaseAdvertise:
		want, have = s.r.ids, func(id string) bool { return s.adverts.byID[id] != nil }
	case PhaseReveal:
		want, have = sortedKeys(s.adverts.byID), func(id string) bool { return s.reveals[id] != nil }
	case PhaseShare:
		want, have = sortedKeys(s.adverts.byID), func(id string) bool { return s.shares[id] != nil }
	case PhaseMask:
		want, have = sortedKeys(s.shares), func(id string) bool { return s.masked[id] }
	case PhaseConsistency:
		want, have = s.survivors, func(id string) bool { return s.sigs[id] != nil }
	case PhaseUnmask:
		want, have = sortedKeys(s.sigs), func(id string) bool { return s.unmaskings[id] != nil }
	}
	var out []string
	for _, id := range want {
		if !have(id) {
			out = append(out, id)
		}
	}
	return out
}

func (s *Server) subject() string { return s.r.subject() + ", server" }

// enter checks that the server is in phase want and that a message of
// kind is for this round.
func (s *Server) enter(kind string, want Phase, round string) error {
	if s.phase == PhaseFailed {
		return s.err
	}
	if s.phase != want {
		return diag.New(diag.SecAggOutOfOrder, s.subject(), "%s arrived in phase %q", kind, s.phase).
			WithHelp("the phase that takes it has ended; drop the message")
	}
	return s.r.checkRound(kind, round)
}

// closing checks that the server is in phase want, to end it, and that
// the n sites heard from in it (what) meet the round's floor; below it
// the round fails.
func (s *Server) closing(want Phase, what string, n int) error {
	if err := s.enter("end of "+what, want, s.r.id); err != nil {
		return err
	}
	if err := s.r.checkFloor(what, n); err != nil {
		return s.fail(err)
	}
	return nil
}

// fail ends the round without a result.
func (s *Server) fail(err error) error {
	s.phase, s.err = PhaseFailed, err
	clear(s.acc)
	s.acc = nil
	return err
}

// admit runs, in order, the checks every client message of a phase passes
// before its own: the server is in phase want and the message is of this
// round (enter); the message is well formed (validate, when there is one);
// its sender id belongs to the set the phase takes messages from (in) and
// has not sent one already (seen). Called with s.mu held.
func (s *Server) admit(kind string, want Phase, round string, validate func() error, id string, in, seen func(id string) bool) error {
	if err := s.enter(kind, want, round); err != nil {
		return err
	}
	if validate != nil {
		if err := validate(); err != nil {
			return err
		}
	}
	if !in(id) {
		return diag.New(diag.SecAggUnknownSite, s.subject(), "%s from %q, which is not expected in phase %q", kind, id, s.phase).
			WithHelp("only clients that completed the previous phase take part in this one")
	}
	if seen(id) {
		return diag.New(diag.SecAggDuplicate, s.subject(), "second %s from %q", kind, id).
			WithHelp("each client sends one per round; a resend is dropped")
	}
	return nil
}

// AddAdvert accepts a client's key advert, after checking its signature
// against the client's identity key.
func (s *Server) AddAdvert(a *Advert) error {
	if a == nil {
		return malformed("key advert", "no message")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.admit("key advert", PhaseAdvertise, a.Round, nil, a.Client, func(id string) bool { return s.r.members[id] != nil }, func(id string) bool { return s.adverts.byID[id] != nil }); err != nil {
		return err
	}
	if s.r.revealed() != (len(a.GraphCommit) > 0) {
		return malformed("key advert of "+a.Client, "a graph commitment where the round draws its graph from none, or none where it does (graphseed.go)")
	}
	return s.adverts.add(s.r, s.subject(), a, true)
}

// EndAdvertise closes advertising and returns the key set (U1) to relay to
// every client that advertised.
func (s *Server) EndAdvertise() (*KeySet, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closing(PhaseAdvertise, "advertising", len(s.adverts.byID)); err != nil {
		return nil, err
	}
	ks := &KeySet{Round: s.r.id}
	for _, id := range sortedKeys(s.adverts.byID) {
		ks.Adverts = append(ks.Adverts, *s.adverts.byID[id])
	}
	if s.r.revealed() {
		s.phase, s.reveals = PhaseReveal, map[string]*GraphReveal{}
		return ks, nil
	}
	s.phase = PhaseShare
	s.shares = map[string]*Shares{}
	return ks, nil
}

// AddShares accepts a client's encrypted shares: one box for every other
// client of U1.
func (s *Server) AddShares(m *Shares) error {
	if m == nil {
		return malformed("shares", "no message")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.admit("shares", PhaseShare, m.Round, m.validate, m.From, func(id string) bool { return s.adverts.byID[id] != nil }, func(id string) bool { return s.shares[id] != nil }); err != nil {
		return err
	}
	to := make(map[string]bool, len(m.Boxes))
	for _, b := range m.Boxes {
		if b.From != m.From || b.To == m.From || s.adverts.byID[b.To] == nil || !s.r.neighbour(m.From, b.To) || to[b.To] {
			return malformed("shares from "+m.From, "box from %q to %q is not one of the boxes the client owes", b.From, b.To)
		}
		to[b.To] = true
	}
	if owed := len(s.advertisedNeighbours(m.From)); len(to) != owed {
		return malformed("shares from "+m.From, "%d boxes for %d neighbours that advertised", len(to), owed)
	}
	c := *m
	s.shares[m.From] = &c
	return nil
}

// EndShare closes key sharing and returns, for every client of U2 (the
// clients that sent shares), the boxes addressed to it by the others.
func (s *Server) EndShare() ([]*ShareDelivery, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closing(PhaseShare, "key sharing", len(s.shares)); err != nil {
		return nil, err
	}
	u2 := sortedKeys(s.shares)
	var out []*ShareDelivery
	for _, v := range u2 {
		d := &ShareDelivery{Round: s.r.id, To: v}
		for _, u := range u2 {
			if u == v {
				continue
			}
			for _, b := range s.shares[u].Boxes {
				if b.To == v {
					d.Boxes = append(d.Boxes, b)
				}
			}
		}
		out = append(out, d)
	}
	s.commits = make(map[string][]byte, len(u2))
	for _, u := range u2 {
		s.commits[u] = s.shares[u].Commit
		s.shares[u].Boxes = nil // relayed; the server keeps no ciphertexts
	}
	s.acc = make([]byte, s.r.lay.size())
	s.masked = map[string]bool{}
	s.phase = PhaseMask
	return out, nil
}

// AddMaskedInput adds a client's masked input into the running sum. The
// message is not retained.
func (s *Server) AddMaskedInput(m *MaskedInput) error {
	if m == nil {
		return malformed("masked input", "no message")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.admit("masked input", PhaseMask, m.Round, nil, m.From, func(id string) bool { return s.shares[id] != nil }, func(id string) bool { return s.masked[id] }); err != nil {
		return err
	}
	if len(m.Masked) != s.r.lay.size() {
		return diag.New(diag.SecAggWrongLength, s.subject(), "masked input from %q has %d bytes, want %d (%d ring elements of Z_2^%d%s)", m.From, len(m.Masked), s.r.lay.size(), s.r.p.Dim, s.r.ringBits, weightNote(s.r.p.Weighted)).
			WithHelp("the client uses a different dimension or weighting; check the round's Params")
	}
	addVectors(s.acc, m.Masked, s.r.lay)
	s.masked[m.From] = true
	return nil
}

// EndMask closes input collection and returns the survivor set to send to
// every survivor (U3, the clients whose masked input arrived) for it to
// sign: the unmask request without signatures.
func (s *Server) EndMask() (*UnmaskRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closing(PhaseMask, "input collection", len(s.masked)); err != nil {
		return nil, err
	}
	s.survivors, s.dropped = nil, nil
	for _, u := range sortedKeys(s.shares) {
		if s.masked[u] {
			s.survivors = append(s.survivors, u)
		} else {
			s.dropped = append(s.dropped, u)
		}
	}
	s.statement = survivorStatement(s.r, s.survivors, s.dropped)
	s.sigs = map[string][]byte{}
	s.phase = PhaseConsistency
	return &UnmaskRequest{Round: s.r.id, Survivors: slices.Clone(s.survivors), Dropped: slices.Clone(s.dropped)}, nil
}

// AddSignature accepts a survivor's signature over the survivor set, after
// checking it under the survivor's identity key (a bad one would make
// every client refuse the unmask request).
func (s *Server) AddSignature(m *SurvivorSig) error {
	if m == nil {
		return malformed("survivor signature", "no message")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.admit("survivor signature", PhaseConsistency, m.Round, m.validate, m.From, func(id string) bool { return s.masked[id] }, func(id string) bool { return s.sigs[id] != nil }); err != nil {
		return err
	}
	if !verifySurvivors(s.r.members[m.From], s.statement, m.Sig) {
		return diag.New(diag.SecAggEquivocation, s.subject(), "the survivor signature of %q does not verify over the survivor set", m.From).
			WithHelp("the site signed another set or with another key; it is left out of the signers")
	}
	s.sigs[m.From] = slices.Clone(m.Sig)
	return nil
}

// EndConsistency closes the consistency round and returns the unmask
// request to send to every signer (U4): the survivor set with every
// signature collected. It needs signatures from at least three survivors
// and at least the threshold.
func (s *Server) EndConsistency() (*UnmaskRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.closing(PhaseConsistency, "the consistency round", len(s.sigs)); err != nil {
		return nil, err
	}
	// Every secret the server will rebuild needs the sharing threshold of
	// its holders among the signers (only they may unmask); the clients
	// check the same before revealing, so fail here, early, instead.
	for _, v := range slices.Concat(s.survivors, s.dropped) {
		if have := countSigners(s.r, v, func(h string) bool { return s.sigs[h] != nil }); have < s.r.st {
			return nil, s.fail(tooFewSigners(s.subject(), v, have, s.r.st))
		}
	}
	req := &UnmaskRequest{Round: s.r.id, Survivors: slices.Clone(s.survivors), Dropped: slices.Clone(s.dropped)}
	for _, id := range sortedKeys(s.sigs) {
		req.Signatures = append(req.Signatures, Signature{Of: id, Sig: s.sigs[id]})
	}
	s.unmaskings = map[string]*Unmasking{}
	s.phase = PhaseUnmask
	return req, nil
}

// AddUnmasking accepts a survivor's shares: of the seed of every survivor
// and of the mask key of every dropped client.
func (s *Server) AddUnmasking(m *Unmasking) error {
	if m == nil {
		return malformed("unmasking", "no message")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.admit("unmasking", PhaseUnmask, m.Round, m.validate, m.From, func(id string) bool { return s.sigs[id] != nil }, func(id string) bool { return s.unmaskings[id] != nil }); err != nil {
		return err
	}
	held := func(ids []string) []string { // of ids, those whose shares m.From holds
		return slices.DeleteFunc(slices.Clone(ids), func(v string) bool { return v != m.From && !s.r.neighbour(m.From, v) })
	}
	if s.relaying() {
		// A child relays shares sealed to the parent; the parent checks
		// them once opened (openPartial).
		if len(m.Sealed) == 0 {
			return malformed("unmasking from "+m.From, "shares in the clear in a relayed sub-cohort; they must be sealed to the parent")
		}
	} else if len(m.Sealed) != 0 {
		return malformed("unmasking from "+m.From, "sealed shares in a round without a parent")
	} else if !sameIDs(m.Seeds, held(s.survivors)) || !sameIDs(m.Keys, held(s.dropped)) {
		return malformed("unmasking from "+m.From, "shares do not match the request (seeds of the survivors, keys of the dropped)")
	}
	c := *m
	s.unmaskings[m.From] = &c
	return nil
}

func weightNote(weighted bool) string {
	if weighted {
		return ", then the weight in Z_2^64"
	}
	return ""
}

// advertisedNeighbours returns u's neighbours that advertised (U1).
func (s *Server) advertisedNeighbours(u string) []string {
	var out []string
	for _, v := range s.r.nbrs[u] {
		if s.adverts.byID[v] != nil {
			out = append(out, v)
		}
	}
	return out
}

// sameIDs reports whether shares are of exactly ids, in order.
func sameIDs(shares []Share, ids []string) bool {
	if len(shares) != len(ids) {
		return false
	}
	for i, sh := range shares {
		if sh.Of != ids[i] {
			return false
		}
	}
	return true
}

// Finish reconstructs the survivors' seeds and the dropped clients' mask
// keys from the unmaskings, removes every mask from the accumulated sum and
// returns it. It needs unmaskings from at least three survivors and at
// least the threshold; every reconstructed secret is checked (a seed
// against its commitment, a mask key against its advertised public key)
// before the sum is released.
func (s *Server) Finish() (*Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("finish", PhaseUnmask, s.r.id); err != nil {
		return nil, err
	}
	if s.relaying() {
		return nil, diag.New(diag.SecAggRelayed, s.subject(), "the round is a sub-cohort of a hierarchical round; its shares are sealed to the parent").
			WithHelp("forward the masked sum with Relay; only the parent can open it (CombinePartials)")
	}
	if err := s.r.checkFloor("unmasking", len(s.unmaskings)); err != nil {
		return nil, s.fail(err)
	}
	if err := s.unmask(s.acc); err != nil {
		return nil, s.fail(err)
	}
	l := s.r.lay
	if s.testRing != nil {
		ring := make([]uint64, s.r.dim)
		for i := range s.r.p.Dim {
			ring[i] = uint64(coordAt(s.acc, l, i))
		}
		if l.weight {
			ring[s.r.p.Dim] = uint64(weightAt(s.acc, l))
		}
		s.testRing(ring)
	}
	res := &Result{
		Round:        s.r.id,
		Sum:          make([]float64, s.r.p.Dim),
		Contributors: slices.Clone(s.survivors),
		Dropped:      slices.Clone(s.dropped),
		ErrorBound:   float64(len(s.survivors)) * s.r.errBound1,
	}
	for i := range res.Sum {
		res.Sum[i] = math.Ldexp(float64(coordAt(s.acc, l, i)), -s.r.fracBits)
	}
	if l.weight {
		res.Weight = math.Ldexp(float64(weightAt(s.acc, l)), -s.r.wFracBits)
	}
	clear(s.acc)
	s.acc = nil
	s.phase = PhaseDone
	return res, nil
}

// unmask removes every mask from acc: it reconstructs and checks all the
// secrets first, so that it either fails before touching acc or succeeds.
// Each secret is interpolated from every share received from its holders
// (the owner's neighbours, and the owner itself for its seed); fewer than
// the sharing threshold ends the round.
func (s *Server) unmask(acc []byte) error {
	lagrange := map[string][]byte{} // by the holders' x coordinates
	// Index every share by its owner, with the holder's x coordinate,
	// holders in sorted order (AddUnmasking checked who holds what).
	type held struct {
		xs []byte
		ys [][]byte
	}
	seeds, keys := map[string]*held{}, map[string]*held{}
	index := func(into map[string]*held, w string, sh Share) {
		h := into[sh.Of]
		if h == nil {
			h = &held{}
			into[sh.Of] = h
		}
		h.xs, h.ys = append(h.xs, s.r.holderX[sh.Of][w]), append(h.ys, sh.Value)
	}
	for _, w := range sortedKeys(s.unmaskings) {
		for _, sh := range s.unmaskings[w].Seeds {
			index(seeds, w, sh)
		}
		for _, sh := range s.unmaskings[w].Keys {
			index(keys, w, sh)
		}
	}
	shares := func(in map[string]*held, owner string) ([]byte, [][]byte) {
		if h := in[owner]; h != nil {
			return h.xs, h.ys
		}
		return nil, nil
	}
	combine := func(xs []byte, ys [][]byte) ([]byte, error) {
		ls, ok := lagrange[string(xs)]
		if !ok {
			var err error
			if ls, err = lagrangeAtZero(xs); err != nil {
				panic("secagg: holders' Shamir coordinates are not distinct: " + err.Error())
			}
			lagrange[string(xs)] = ls
		}
		return combineWith(ls, ys)
	}
	inconsistent := func(what, u string) error {
		return diag.New(diag.SecAggInconsistent, s.subject(), "reconstructed %s of %q does not match its commitment", what, u).
			WithHelp("a survivor returned a corrupted share; the round ends without a result — run it again")
	}
	tooFew := func(what, u string, have int) error {
		return diag.New(diag.SecAggBelowThreshold, s.subject(), "%d shares of the %s of %q came back; it is shared %d-of-neighbourhood", have, what, u, s.r.st).
			WithHelp("too many of its neighbours dropped out; the round ends without a result — run it again")
	}
	// Self-mask seeds of the survivors.
	var masks []mask
	defer func() {
		for _, mk := range masks {
			clear(mk.key)
		}
	}()
	for _, u := range s.survivors {
		xs, ys := shares(seeds, u)
		if len(xs) < s.r.st {
			return tooFew("self-mask seed", u, len(xs))
		}
		seed, err := combine(xs, ys)
		if err != nil {
			return inconsistent("self-mask seed", u)
		}
		ok := equalSecret(seedCommit(s.r.session, u, seed), s.commits[u])
		if ok {
			masks = append(masks, mask{selfMaskKey(seed, s.r.session, u), -1})
		}
		clear(seed)
		if !ok {
			return inconsistent("self-mask seed", u)
		}
	}
	// Pairwise mask keys between each dropped client and each surviving
	// neighbour.
	for _, v := range s.dropped {
		xs, ys := shares(keys, v)
		if len(xs) < s.r.st {
			return tooFew("mask key", v, len(xs))
		}
		sk, err := combine(xs, ys)
		if err != nil {
			return inconsistent("mask key", v)
		}
		priv, err := ecdh.X25519().NewPrivateKey(sk)
		clear(sk)
		if err != nil || !equalSecret(priv.PublicKey().Bytes(), s.adverts.byID[v].MaskKey) {
			return inconsistent("mask key", v)
		}
		for _, u := range s.survivors {
			if !s.r.neighbour(u, v) {
				continue
			}
			shared, err := agree(priv, s.adverts.byID[u].MaskKey)
			if err != nil {
				return inconsistent("mask key", v)
			}
			// u added Δ_uv·PRG(s_uv); take it away.
			masks = append(masks, mask{pairMaskKey(shared, s.r.session, u, v), -pairSign(u, v)})
			clear(shared)
		}
	}
	applyMasks(s.r.prg, acc, s.r.lay, masks, nil)
	return nil
}
