package secagg

import (
	"bytes"
	"cmp"
	"crypto/ecdh"
	"crypto/sha256"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Hierarchical secure aggregation (docs/secagg.md, "Hierarchical secure
// aggregation"). Each sub-cohort runs its own round — its own Params,
// threshold, three-site floor and consistency round — whose Params name
// the parent's X25519 key (Params.Parent). The sub-cohort's host, the
// child, runs an ordinary Server up to the unmasking, but the survivors
// seal their shares to the parent, so the child can neither open them nor
// Finish: it forwards the masked sum of its survivors with the sealed
// shares (Server.Relay → PartialSum). The parent (Parent) opens the shares,
// rebuilds the sub-cohort's masks exactly as a flat round's server would,
// removes them from the child's masked sum and adds the result into one
// total; it releases the total only once every sub-cohort has been added.

const (
	labelParentKey = "scellis/secagg/v1/parent-key"
	labelParentAD  = "scellis/secagg/v1/parent-ad"
	// maxSealedUnmasking bounds a sealed unmasking: at most MaxSites
	// shares (a SecAgg+ site holds shares of k+1 ≤ 255 sites), each an ID
	// and a 32-byte value, plus the envelope.
	maxSealedUnmasking = sealedSize + 512 + MaxSites*(keySize+MaxIDLength+16)
)

// relaying reports whether s is a child's server of a sub-cohort: it takes
// sealed shares and can only Relay.
func (s *Server) relaying() bool { return s.r.p.Parent != nil && !s.opening }

// sealedShares is the plaintext of a sealed unmasking.
type sealedShares struct {
	Round string  `cbor:"round"`
	From  string  `cbor:"from"`
	Seeds []Share `cbor:"seeds"`
	Keys  []Share `cbor:"keys"`
}

// parentAD binds a sealed unmasking to the round, its sender and the
// survivor set the sender signed: a child that tells the parent another
// set than the sites signed cannot have their shares opened.
func parentAD(r *round, from string, statement []byte) []byte {
	st := sha256.Sum256(statement)
	return mustEncode([]any{labelParentAD, r.session, r.id, from, st[:]})
}

// parentBoxKey keys the box from site u to the parent: HKDF of the X25519
// agreement between u's advertised encryption key c_u and the parent's key.
func parentBoxKey(shared []byte, r *round, u string) []byte {
	return deriveKey(shared, r.session, labelParentKey, u)
}

// keyToParent derives the key of the box to the parent while the client
// still holds c_u (it drops it once it has masked).
func (c *Client) keyToParent() error {
	shared, err := agree(c.encKey, c.r.p.Parent)
	if err != nil {
		return diag.New(diag.SecAggBadParams, c.subject(), "the parent key is not a usable X25519 public key").
			WithHelp("take the parent aggregator's key for this round from its plan")
	}
	c.parentBox = parentBoxKey(shared, c.r, c.id)
	clear(shared)
	return nil
}

// sealToParent replaces the shares of u, in the clear, by their sealed
// form (XChaCha20-Poly1305 under the key of keyToParent, the same box as
// the shares between sites).
func (c *Client) sealToParent(u *Unmasking) error {
	key := c.parentBox
	c.parentBox = nil
	pt := mustEncode(sealedShares{Round: u.Round, From: u.From, Seeds: u.Seeds, Keys: u.Keys})
	sealed, err := SealBox(key, parentAD(c.r, c.id, c.statement), pt)
	clear(key)
	clear(pt)
	for _, sh := range slices.Concat(u.Seeds, u.Keys) {
		clear(sh.Value)
	}
	if err != nil {
		return err
	}
	u.Seeds, u.Keys, u.Sealed = nil, nil, sealed
	return nil
}

// PartialSum is what a child forwards to the parent for its sub-cohort:
// the sum of its survivors' masked inputs (still masked by every
// survivor's self mask and by the pairwise masks of dropped sites), the
// survivor set, the adverts and seed commitments the parent needs to
// rebuild and check the masks, and the survivors' unmaskings, sealed to
// the parent.
type PartialSum struct {
	Round     string   `cbor:"round"`
	Masked    []byte   `cbor:"masked"`
	Survivors []string `cbor:"survivors"`
	Dropped   []string `cbor:"dropped"`
	// Adverts are the signed adverts of every survivor and dropped site.
	Adverts []Advert `cbor:"adverts"`
	// Commits are the survivors' seed commitments (Of: the survivor,
	// Value: its commitment).
	Commits []Share `cbor:"commits"`
	// Unmaskings are the signers' unmaskings, each with Sealed only.
	Unmaskings []Unmasking `cbor:"unmaskings"`
}

func (m *PartialSum) validate() error {
	const k = "partial sum"
	if err := checkRoundID(k, m.Round); err != nil {
		return err
	}
	if len(m.Survivors)+len(m.Dropped) > MaxSitesPlus || len(m.Unmaskings) > len(m.Survivors) ||
		len(m.Adverts) > len(m.Survivors)+len(m.Dropped) || len(m.Commits) > len(m.Survivors) {
		return malformed(k, "%d survivors, %d dropped, %d adverts, %d commitments, %d unmaskings", len(m.Survivors), len(m.Dropped), len(m.Adverts), len(m.Commits), len(m.Unmaskings))
	}
	if len(m.Masked) == 0 || len(m.Masked) > 8*(MaxDim+1) {
		return malformed(k, "masked sum of %d bytes", len(m.Masked))
	}
	for _, id := range slices.Concat(m.Survivors, m.Dropped) {
		if err := checkID(k, "site", id); err != nil {
			return err
		}
	}
	for i := range m.Adverts {
		if err := m.Adverts[i].validate(); err != nil {
			return err
		}
	}
	for _, c := range m.Commits {
		if err := checkID(k, "commitment owner", c.Of); err != nil {
			return err
		}
		if err := checkLen(k, "commitment", c.Value, keySize); err != nil {
			return err
		}
	}
	for i := range m.Unmaskings {
		if err := m.Unmaskings[i].validate(); err != nil {
			return err
		}
		if len(m.Unmaskings[i].Sealed) == 0 {
			return malformed(k, "unmasking of %q is not sealed", m.Unmaskings[i].From)
		}
	}
	return nil
}

// Marshal returns the canonical encoding of the partial sum.
func (m *PartialSum) Marshal() ([]byte, error) { return content.Encode(m) }

// ParsePartialSum parses the canonical encoding of a PartialSum.
func ParsePartialSum(b []byte) (*PartialSum, error) {
	return parse("partial sum", b, new(PartialSum))
}

// Relay ends a sub-cohort's round at the child: instead of Finish (which
// a relayed round refuses), it hands over the masked sum and what the
// parent needs to open it. It needs unmaskings from at least three
// survivors and the threshold, as Finish does. The server keeps nothing.
func (s *Server) Relay() (*PartialSum, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("relay", PhaseUnmask, s.r.id); err != nil {
		return nil, err
	}
	if !s.relaying() {
		return nil, diag.New(diag.SecAggRelayed, s.subject(), "the round names no parent; its sum is opened here").
			WithHelp("call Finish; Relay is for a sub-cohort of a hierarchical round (Params.Parent)")
	}
	if err := s.r.checkFloor("unmasking", len(s.unmaskings)); err != nil {
		return nil, s.fail(err)
	}
	ps := &PartialSum{Round: s.r.id, Masked: s.acc, Survivors: slices.Clone(s.survivors), Dropped: slices.Clone(s.dropped)}
	for _, u := range slices.Concat(s.survivors, s.dropped) {
		ps.Adverts = append(ps.Adverts, *s.adverts.byID[u])
	}
	for _, u := range s.survivors {
		ps.Commits = append(ps.Commits, Share{Of: u, Value: slices.Clone(s.commits[u])})
	}
	for _, w := range sortedKeys(s.unmaskings) {
		ps.Unmaskings = append(ps.Unmaskings, *s.unmaskings[w])
	}
	s.acc = nil
	s.phase = PhaseDone
	return ps, nil
}

// Parent is the parent's side of a hierarchical round: it takes one
// PartialSum per sub-cohort (AddPartial), opens and checks it, adds the
// sub-cohort's ring sum (its masked sum less its sites' masks) into one
// ring total, and decodes and releases the total once every sub-cohort is
// in (Finish). With two or more sub-cohorts each child has also added its
// outer mask R_i (OuterMask), so the ring sum the parent computes per
// sub-cohort is that sub-cohort's sum plus R_i, uniform on the ring to
// it; the R_i cancel in the total (docs/secagg.md, "The outer mask"). A
// Parent is safe for concurrent use.
type Parent struct {
	mu       sync.Mutex
	id       string
	key      *ecdh.PrivateKey
	rounds   map[string]*round
	order    []string
	added    map[string]bool
	lay      layout
	fracBits int
	wFrac    int
	acc      []byte // the ring total, in the sub-cohorts' one layout
	contrib  []string
	dropped  []string
	errBound float64
	done     bool

	// testOpened, when set by a test, sees every opened unmasking.
	testOpened func(*Unmasking)
	// testRing, when set by a test, sees each sub-cohort's ring sum as the
	// parent computes it (its masked sum less its sites' masks).
	testRing func(round string, ring []byte)
	// testTotal, when set by a test, receives the total on the grid.
	testTotal func([]int64)
}

// NewParent returns the parent of the hierarchical round id, holding key
// (whose public half every sub-cohort's Params.Parent names), over the
// sub-cohorts cohorts. Each sub-cohort must be a valid round (at least
// three sites, its own threshold); sites may not repeat across them; all
// must share one layout — the dimension, weighting, clip, maximum weight,
// keystream, grid (GridBits) and ring — derived for the round's total
// number of sites (Params.Sites: the sum of the sub-cohorts' members; it
// may be left 0 when there is one sub-cohort), so their sums add as ring
// words and the total provably fits.
func NewParent(id string, key *ecdh.PrivateKey, cohorts []Params) (*Parent, error) {
	subject := fmt.Sprintf("hierarchical secure aggregation round %q, parent", id)
	bad := func(format string, args ...any) *diag.Diagnostic {
		return diag.New(diag.SecAggBadParams, subject, format, args...)
	}
	if key == nil || key.Curve() != ecdh.X25519() {
		return nil, bad("no X25519 key").WithHelp("draw one per round with ecdh.X25519().GenerateKey(crypto/rand.Reader)")
	}
	if len(cohorts) == 0 {
		return nil, bad("no sub-cohort").WithHelp("list the sub-cohorts' round parameters")
	}
	p := &Parent{id: id, key: key, rounds: map[string]*round{}, added: map[string]bool{}}
	sites := map[string]string{}
	keys := map[string]string{}
	total := 0
	for _, cp := range cohorts {
		total += len(cp.Members)
	}
	var load uint64 // Σ n_i·(bound_i + 1): the total's worst magnitude
	for i, cp := range cohorts {
		r, err := newRound(cp)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(cp.Parent, key.PublicKey().Bytes()) {
			return nil, bad("sub-cohort %q does not name this parent's key", cp.Round).
				WithHelp("put the parent's public key in every sub-cohort's Params.Parent")
		}
		if p.rounds[r.id] != nil {
			return nil, bad("sub-cohort %q listed twice", r.id).WithHelp("give every sub-cohort its own round ID")
		}
		if laid := cmp.Or(cp.Sites, r.n); laid != total {
			return nil, bad("sub-cohort %q is laid out for %d sites; the round has %d over its sub-cohorts", r.id, laid, total).
				WithHelp("set every sub-cohort's Params.Sites to %d, so that all add on one ring and the total fits", total)
		}
		for _, m := range cp.Members {
			if other, dup := sites[m.ID]; dup {
				return nil, bad("site %q is in sub-cohorts %q and %q", m.ID, other, r.id).WithHelp("put each site in one sub-cohort: its input would count twice")
			}
			if other, dup := keys[string(m.Key)]; dup {
				return nil, bad("sites %q and %q share an identity key", other, m.ID).WithHelp("put each site in one sub-cohort, under one name")
			}
			sites[m.ID], keys[string(m.Key)] = r.id, m.ID
		}
		if i == 0 {
			p.lay, p.fracBits, p.wFrac = r.lay, r.fracBits, r.wFracBits
		} else if f := p.rounds[p.order[0]]; f.p.Dim != cp.Dim || f.p.Weighted != cp.Weighted || f.fracBits != r.fracBits ||
			f.p.Clip != cp.Clip || f.p.MaxWeight != cp.MaxWeight || f.wFracBits != r.wFracBits || f.ringBits != r.ringBits || f.prg != r.prg {
			return nil, bad("sub-cohort %q (dimension %d, weighted %v, clip %v, max weight %v, %d fraction bits, %d for the weight, %d-bit ring, %s) differs from %q (%d, %v, %v, %v, %d, %d, %d-bit, %s)",
				r.id, cp.Dim, cp.Weighted, cp.Clip, cp.MaxWeight, r.fracBits, r.wFracBits, r.ringBits, r.prg,
				f.id, f.p.Dim, f.p.Weighted, f.p.Clip, f.p.MaxWeight, f.fracBits, f.wFracBits, f.ringBits, f.prg).
				WithHelp("sub-cohorts add on one ring: give them the same dimension, weighting, clip, maximum weight, PRG, GridBits and Sites")
		}
		hi, lo := bits.Mul64(uint64(r.n), uint64(r.encBound)+1)
		if hi != 0 || load+lo < load || load+lo > 1<<62 {
			return nil, bad("the total over all sub-cohorts could reach 2^62 on a grid of %d fraction bits", r.fracBits).
				WithHelp("choose a coarser grid (GridBits) or a smaller clip")
		}
		load += lo
		p.rounds[r.id] = r
		p.order = append(p.order, r.id)
	}
	p.acc = make([]byte, p.lay.size())
	return p, nil
}

func (p *Parent) subject() string {
	return fmt.Sprintf("hierarchical secure aggregation round %q, parent", p.id)
}

// SubRounds returns the round IDs of the sub-cohorts, in the order given.
func (p *Parent) SubRounds() []string { return slices.Clone(p.order) }

// Missing returns the sub-cohorts whose partial sum has not been added.
func (p *Parent) Missing() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, id := range p.order {
		if !p.added[id] {
			out = append(out, id)
		}
	}
	return out
}

// AddPartial opens a child's partial sum and adds its sub-cohort's sum into
// the total. It refuses (and the total is unchanged) a partial of an
// unknown or already added sub-cohort, one whose survivors are fewer than
// three or the sub-cohort's threshold, one whose adverts do not verify
// under the sites' identity keys, whose sealed shares do not open for the
// survivor set the sites signed, or whose rebuilt secrets do not match
// their commitments and advertised keys.
func (p *Parent) AddPartial(ps *PartialSum) error {
	if ps == nil {
		return malformed("partial sum", "no message")
	}
	if err := ps.validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return diag.New(diag.SecAggOutOfOrder, p.subject(), "partial sum of %q after the total was released", ps.Round).
			WithHelp("drop the message")
	}
	r := p.rounds[ps.Round]
	if r == nil {
		return diag.New(diag.SecAggWrongRound, p.subject(), "partial sum of %q, which is not a sub-cohort of this round", ps.Round).
			WithHelp("sub-cohorts are %v", p.order)
	}
	if p.added[r.id] {
		return diag.New(diag.SecAggDuplicate, p.subject(), "second partial sum of %q", r.id).
			WithHelp("each child forwards one partial sum per round")
	}
	ring, err := p.open(r, ps)
	if err != nil {
		return err
	}
	if p.testRing != nil {
		p.testRing(r.id, slices.Clone(ring))
	}
	addVectors(p.acc, ring, p.lay)
	clear(ring)
	p.contrib = append(p.contrib, ps.Survivors...)
	p.dropped = append(p.dropped, ps.Dropped...)
	p.errBound += float64(len(ps.Survivors)) * r.errBound1
	p.added[r.id] = true
	return nil
}

// open checks a partial sum and returns the sub-cohort's ring sum: its
// masked sum less its sites' self masks and its dropped sites' pairwise
// masks — still under the child's outer mask, which only the total
// cancels, so it is never decoded on its own. It builds the server state a
// flat round would hold at its unmasking and reuses that server's checks
// and reconstruction.
func (p *Parent) open(r *round, ps *PartialSum) ([]byte, error) {
	subject := fmt.Sprintf("%s, sub-cohort %q", p.subject(), r.id)
	refuse := func(format string, args ...any) error {
		return diag.New(diag.SecAggMalformed, subject, format, args...).
			WithHelp("the child forwarded an inconsistent partial sum; the round ends without a result — check the child")
	}
	if len(ps.Masked) != r.lay.size() {
		return nil, diag.New(diag.SecAggWrongLength, subject, "masked sum of %d bytes, want %d", len(ps.Masked), r.lay.size()).
			WithHelp("the child runs other round parameters")
	}
	named := map[string]bool{}
	for _, id := range slices.Concat(ps.Survivors, ps.Dropped) {
		if r.members[id] == nil || named[id] {
			return nil, refuse("site %q is not a member or is named twice", id)
		}
		named[id] = true
	}
	if err := r.checkFloor("the sub-cohort's unmasking", len(ps.Survivors)); err != nil {
		return nil, err
	}
	if err := r.checkFloor("the sub-cohort's unmasking", len(ps.Unmaskings)); err != nil {
		return nil, err
	}
	set := newAdvertSet()
	for i := range ps.Adverts {
		if !named[ps.Adverts[i].Client] {
			return nil, refuse("advert of %q, which is neither survivor nor dropped", ps.Adverts[i].Client)
		}
		if err := set.add(r, subject, &ps.Adverts[i], true); err != nil {
			return nil, err
		}
	}
	if len(set.byID) != len(named) {
		return nil, refuse("%d adverts for %d sites", len(set.byID), len(named))
	}
	s := &Server{r: r, adverts: set, phase: PhaseUnmask, opening: true,
		survivors: sortedCopy(ps.Survivors), dropped: sortedCopy(ps.Dropped),
		commits: map[string][]byte{}, sigs: map[string][]byte{}, unmaskings: map[string]*Unmasking{}}
	for _, c := range ps.Commits {
		if !slices.Contains(s.survivors, c.Of) || s.commits[c.Of] != nil {
			return nil, refuse("commitment of %q", c.Of)
		}
		s.commits[c.Of] = c.Value
	}
	if len(s.commits) != len(s.survivors) {
		return nil, refuse("%d commitments for %d survivors", len(s.commits), len(s.survivors))
	}
	for _, u := range s.survivors {
		s.sigs[u] = []byte{1} // any survivor may unmask; AddUnmasking checks each once
	}
	statement := survivorStatement(r, s.survivors, s.dropped)
	defer func() { // the opened shares, once the masks are rebuilt
		for _, u := range s.unmaskings {
			for _, sh := range slices.Concat(u.Seeds, u.Keys) {
				clear(sh.Value)
			}
		}
	}()
	for i := range ps.Unmaskings {
		u, err := p.unseal(r, subject, set, statement, &ps.Unmaskings[i])
		if err != nil {
			return nil, err
		}
		if p.testOpened != nil {
			p.testOpened(u)
		}
		if err := s.AddUnmasking(u); err != nil {
			return nil, err
		}
	}
	acc := slices.Clone(ps.Masked)
	if err := s.unmask(acc); err != nil {
		clear(acc)
		return nil, err
	}
	return acc, nil
}

// unseal opens one sealed unmasking with the parent's key and the sender's
// advertised encryption key, bound to the survivor set the sender signed.
func (p *Parent) unseal(r *round, subject string, set *advertSet, statement []byte, m *Unmasking) (*Unmasking, error) {
	a := set.byID[m.From]
	if a == nil {
		return nil, diag.New(diag.SecAggUnknownSite, subject, "sealed unmasking from %q, which has no advert in the partial sum", m.From).
			WithHelp("the child forwarded an inconsistent partial sum")
	}
	shared, err := agree(p.key, a.EncKey)
	if err != nil {
		return nil, diag.New(diag.SecAggDecrypt, subject, "the advertised key of %q is not a usable X25519 key", m.From).
			WithHelp("the site is faulty")
	}
	key := parentBoxKey(shared, r, m.From)
	clear(shared)
	pt, err := OpenBox(key, parentAD(r, m.From, statement), m.Sealed)
	clear(key)
	if err != nil {
		return nil, diag.New(diag.SecAggDecrypt, subject, "the sealed shares of %q do not open for the survivor set the child forwarded", m.From).
			WithHelp("the child altered them, or forwarded another survivor set than the sites signed; the round ends without a result")
	}
	defer clear(pt)
	var sh sealedShares
	if err := content.Decode(pt, &sh); err != nil || sh.Round != r.id || sh.From != m.From {
		return nil, diag.New(diag.SecAggDecrypt, subject, "the sealed shares of %q hold no valid unmasking for this round", m.From).
			WithHelp("the site is faulty")
	}
	return &Unmasking{Round: sh.Round, From: sh.From, Seeds: sh.Seeds, Keys: sh.Keys}, nil
}

// Finish releases the sum over every sub-cohort. It refuses while a
// sub-cohort is missing: a sub-cohort whose child failed makes the round
// fail (the tree re-delegates it; a sum over fewer sub-cohorts is never
// released).
func (p *Parent) Finish() (*Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return nil, diag.New(diag.SecAggOutOfOrder, p.subject(), "the total was already released").WithHelp("a round is summed once")
	}
	var missing []string
	for _, id := range p.order {
		if !p.added[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return nil, diag.New(diag.SecAggBelowThreshold, p.subject(), "no partial sum from sub-cohorts %v", missing).
			WithHelp("every sub-cohort must meet its floor; the round ends without a result — run it again")
	}
	res := &Result{Round: p.id, Sum: make([]float64, p.lay.vals),
		Contributors: sortedCopy(p.contrib), Dropped: sortedCopy(p.dropped), ErrorBound: p.errBound}
	total := make([]int64, p.lay.vals)
	for i := range total {
		total[i] = coordAt(p.acc, p.lay, i)
		res.Sum[i] = math.Ldexp(float64(total[i]), -p.fracBits)
	}
	if p.lay.weight {
		res.Weight = math.Ldexp(float64(weightAt(p.acc, p.lay)), -p.wFrac)
	}
	if p.testTotal != nil {
		p.testTotal(slices.Clone(total))
	}
	clear(total)
	clear(p.acc)
	p.done = true
	return res, nil
}
