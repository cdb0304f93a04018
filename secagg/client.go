package secagg

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Client is one site's side of a secure aggregation round. It is driven by
// the messages the server relays, one method per phase, in order:
//
//	Advertise → ShareKeys(KeySet) → MaskInput(ShareDelivery, x)
//	  → SignSurvivors(UnmaskRequest) → Unmask(UnmaskRequest with signatures)
//
// A message of another round, or one that arrives in the wrong phase, is
// refused and changes nothing. A message that breaks the protocol (a bad
// signature, a duplicated advert, a request for both secrets of one site,
// too few sites left, an unmask request whose signatures do not show
// enough sites signing the set this client signed) aborts the client: it
// refuses every later call and never reveals anything more. A Client signs
// at most one survivor set and answers at most one unmask request.
// A Client is not safe for concurrent use.
type Client struct {
	r        *round
	id       string
	identity ed25519.PrivateKey
	state    clientState
	abort    error // why the client aborted, once it has

	encKey  *ecdh.PrivateKey // c_u: decrypts the shares sent to us
	maskKey *ecdh.PrivateKey // s_u: agrees the pairwise mask seeds
	// graphNonce is this client's share of the graph's randomness, and
	// committed the key set's adverts it revealed for (graphseed.go).
	graphNonce []byte
	committed  map[string]*Advert
	u1         map[string]*Advert
	pairs      map[string][]byte // s_uv, agreed with every v in U1
	boxKeys    map[string][]byte // X25519(c_u, c_v), for opening v's box
	seed       []byte            // b_u
	held       map[string]heldShares
	u2         []string
	// The survivor set this client signed (sorted), its statement, and
	// each named site's role (true: survivor).
	signedSurv, signedDrop []string
	statement              []byte
	named                  map[string]bool
	// parentBox keys the box sealing this site's unmasking to the parent
	// of a hierarchical round (Params.Parent).
	parentBox []byte
	// minSurvivors is the fewest sites whose inputs the client lets the
	// sum hold (RequireSurvivors); the round's floor max(3, t) applies too.
	minSurvivors int

	// testEncoded, when set by a test, receives the plaintext ring
	// encoding of the input, so a test can check the sum exactly.
	testEncoded func([]uint64)
	// testGraphNonce, when set by a test, is the client's graph
	// randomness instead of crypto/rand's, so a scripted round on a
	// sparse graph draws the same graph at every run.
	testGraphNonce []byte
}

type clientState int

const (
	clientNew clientState = iota
	clientAdvertised
	clientShared
	clientMasked
	clientSigned
	clientDone
	clientAborted
	clientRevealed // sent its graph randomness (graphseed.go)
	clientDrawn    // drew the graph from every site's randomness
)

var clientStateNames = [...]string{"new", "advertised", "shared", "masked", "signed", "done", "aborted", "revealed", "graph drawn"}

func (s clientState) String() string { return clientStateNames[s] }

// heldShares are the shares a client holds of one site's two secrets.
type heldShares struct {
	seed, key []byte
}

// NewClient returns the client id of the round p, holding identity, the
// Ed25519 private key whose public half p lists for id.
func NewClient(p Params, id string, identity ed25519.PrivateKey) (*Client, error) {
	r, err := newRound(p)
	if err != nil {
		return nil, err
	}
	pub, ok := r.members[id]
	if !ok {
		return nil, diag.New(diag.SecAggUnknownSite, r.subject(), "client %q is not a member of the round", id).
			WithHelp("members are %v", r.ids)
	}
	if len(identity) != ed25519.PrivateKeySize || !pub.Equal(identity.Public()) {
		return nil, diag.New(diag.SecAggBadParams, r.subject(), "identity key of client %q does not match its federation entry", id).
			WithHelp("load the key generated for this site (scellis keygen), or fix its public key in the federation file")
	}
	return &Client{r: r, id: id, identity: identity}, nil
}

// RequireSurvivors makes the client refuse, and abort, when fewer than k
// sites survive to masked input collection or to unmasking: a silo whose
// policy sets min_cohort k is never summed with fewer than k sites, whatever
// the round's threshold. Call it before Advertise.
func (c *Client) RequireSurvivors(k int) { c.minSurvivors = k }

// checkSurvivors applies the round's floor and RequireSurvivors.
func (c *Client) checkSurvivors(phase string, have int) error {
	if err := c.r.checkFloor(phase, have); err != nil {
		return err
	}
	if have < c.minSurvivors {
		return diag.New(diag.SecAggBelowThreshold, c.subject(), "%d sites left at %s; this site takes part only in sums of at least %d (its min_cohort)", have, phase, c.minSurvivors).
			WithHelp("too many sites dropped out for this site's policy; the round ends without its input — run it again")
	}
	return nil
}

// ID returns the client's ID.
func (c *Client) ID() string { return c.id }

func (c *Client) subject() string { return fmt.Sprintf("%s, client %q", c.r.subject(), c.id) }

// enter checks that the client may handle a message of phase want.
func (c *Client) enter(kind string, want clientState, round string) error {
	if c.state == clientAborted {
		return diag.New(diag.SecAggAborted, c.subject(), "%s refused: the client aborted the round: %v", kind, c.abort).
			WithHelp("start a new round")
	}
	if c.state != want {
		return diag.New(diag.SecAggOutOfOrder, c.subject(), "%s arrived in phase %q", kind, c.state).
			WithHelp("each phase's message is handled once, in order; drop the message")
	}
	return c.r.checkRound(kind, round)
}

// fromServer is a message a client checks as a whole before it acts on
// it: a key set or an unmask request.
type fromServer interface {
	roundName() string
	validate() error
}

func (m *KeySet) roundName() string        { return m.Round }
func (m *UnmaskRequest) roundName() string { return m.Round }

// receive opens each step that handles such a message: a missing message
// is malformed, one out of order or of another round is refused (enter),
// and a malformed one aborts the client.
func receive[M interface {
	*T
	fromServer
}, T any](c *Client, what string, want clientState, m M) error {
	if m == nil {
		return malformed(what, "no message")
	}
	if err := c.enter(what, want, m.roundName()); err != nil {
		return err
	}
	if err := m.validate(); err != nil {
		return c.fail(err)
	}
	return nil
}

// fail aborts the client with err and returns it.
func (c *Client) fail(err error) error {
	c.state = clientAborted
	c.abort = err
	c.wipe()
	return err
}

// wipe forgets the round's secrets (best effort: the Go runtime may hold
// copies).
func (c *Client) wipe() {
	clear(c.seed)
	for _, s := range c.pairs {
		clear(s)
	}
	for _, s := range c.boxKeys {
		clear(s)
	}
	for _, h := range c.held {
		clear(h.seed)
		clear(h.key)
	}
	clear(c.parentBox)
	c.seed, c.pairs, c.boxKeys, c.held, c.encKey, c.maskKey, c.parentBox = nil, nil, nil, nil, nil, nil, nil
	c.named = nil
}

// Advertise starts the round: it draws the client's two X25519 key pairs
// for this round and returns them signed with the identity key.
func (c *Client) Advertise() (*Advert, error) {
	if err := c.enter("advertise", clientNew, c.r.id); err != nil {
		return nil, err
	}
	var err error
	if c.encKey, err = ecdh.X25519().GenerateKey(rand.Reader); err != nil {
		return nil, err
	}
	if c.maskKey, err = ecdh.X25519().GenerateKey(rand.Reader); err != nil {
		return nil, err
	}
	a := &Advert{
		Round: c.r.id, Client: c.id, Params: slices.Clone(c.r.session),
		EncKey: c.encKey.PublicKey().Bytes(), MaskKey: c.maskKey.PublicKey().Bytes(),
	}
	if c.r.revealed() {
		if c.graphNonce, err = newGraphNonce(); err != nil {
			return nil, err
		}
		if c.testGraphNonce != nil {
			c.graphNonce = slices.Clone(c.testGraphNonce)
		}
		a.GraphCommit = graphCommit(c.r.session, c.id, c.graphNonce)
	}
	a.Sig = signAdvert(c.identity, a)
	c.state = clientAdvertised
	return a, nil
}

// advertSet accumulates checked adverts: by client, and which client
// advertised each public key.
type advertSet struct {
	byID map[string]*Advert
	keys map[string]string
}

func newAdvertSet() *advertSet {
	return &advertSet{byID: map[string]*Advert{}, keys: map[string]string{}}
}

// add checks one advert against the round and the adverts already in the
// set — for these params, from a member, signed by its identity, not twice,
// no key reused — and adds it. With verify false the signature is not
// checked: a SecAgg+ client checks only the adverts of its neighbours
// (whose keys it uses), so its cost does not grow with n.
func (set *advertSet) add(r *round, subject string, a *Advert, verify bool) error {
	if err := a.validate(); err != nil {
		return err
	}
	if err := r.checkRound("key advert of "+a.Client, a.Round); err != nil {
		return err
	}
	if !equalSecret(a.Params, r.session) {
		return diag.New(diag.SecAggParamsMismatch, subject, "advert of %q was made for different round parameters", a.Client).
			WithHelp("every site of a round must use the same Params (members, threshold, dimension, clip, weighting, PRG)")
	}
	pub, ok := r.members[a.Client]
	if !ok {
		return diag.New(diag.SecAggUnknownSite, subject, "advert from %q, which is not a member of the round", a.Client).
			WithHelp("only sites listed in the round's members may take part")
	}
	if _, dup := set.byID[a.Client]; dup {
		return diag.New(diag.SecAggDuplicate, subject, "two adverts for client %q", a.Client).
			WithHelp("a client advertises once per round; a second advert is a replay or a faulty relay")
	}
	if verify && !verifyAdvert(pub, a) {
		return diag.New(diag.SecAggBadSignature, subject, "advert of %q does not verify under its identity key", a.Client).
			WithHelp("the advert was tampered with or signed with another key; check the site's key in the federation file")
	}
	if bytes.Equal(a.EncKey, a.MaskKey) {
		return diag.New(diag.SecAggDuplicate, subject, "advert of %q uses one key for encryption and masking", a.Client).
			WithHelp("keys are drawn fresh per purpose, per client and per round")
	}
	for _, k := range [][]byte{a.EncKey, a.MaskKey} {
		if other, dup := set.keys[string(k)]; dup {
			return diag.New(diag.SecAggDuplicate, subject, "advert of %q reuses a public key already advertised by %q", a.Client, other).
				WithHelp("keys are drawn fresh per client and per round; a reused key is a replay")
		}
	}
	c := *a
	set.byID[a.Client] = &c
	set.keys[string(a.EncKey)] = a.Client
	set.keys[string(a.MaskKey)] = a.Client
	return nil
}

// ShareKeys handles the server's relay of the adverts (U1): it checks them,
// draws the self-mask seed b_u, Shamir-shares b_u and the mask private key
// t-of-|U1| and returns each other client's pair of shares encrypted for it
// alone.
func (c *Client) ShareKeys(ks *KeySet) (*Shares, error) {
	want := clientAdvertised
	if c.r.revealed() {
		want = clientDrawn // Reveal and DrawGraph first
	}
	if err := receive(c, "key set", want, ks); err != nil {
		return nil, err
	}
	if c.r.revealed() && !c.sameKeySet(ks) {
		return nil, c.fail(diag.New(diag.SecAggGraphReveal, c.subject(), "the key set differs from the one this client revealed its graph randomness for").
			WithHelp("the server must relay one key set; the round ends without a sum"))
	}
	set := newAdvertSet()
	for i := range ks.Adverts {
		a := &ks.Adverts[i]
		if err := set.add(c.r, c.subject(), a, a.Client == c.id || c.r.neighbour(c.id, a.Client)); err != nil {
			return nil, c.fail(err)
		}
	}
	u1 := set.byID
	mine, ok := u1[c.id]
	if !ok || !equalSecret(mine.EncKey, c.encKey.PublicKey().Bytes()) || !equalSecret(mine.MaskKey, c.maskKey.PublicKey().Bytes()) {
		return nil, c.fail(diag.New(diag.SecAggUnknownSite, c.subject(), "key set does not hold this client's advert").
			WithHelp("the server must relay every advert it accepted, this client's included"))
	}
	if err := c.r.checkFloor("key sharing", len(u1)); err != nil {
		return nil, c.fail(err)
	}
	// The holders of this client's shares: itself and its neighbours on
	// the masking graph (every other site, pairwise) that advertised.
	var ids []string
	for _, v := range sortedKeys(u1) {
		if v == c.id || c.r.neighbour(c.id, v) {
			ids = append(ids, v)
		}
	}
	if len(ids) < c.r.st {
		return nil, c.fail(diag.New(diag.SecAggBelowThreshold, c.subject(), "%d of this site's %d neighbours advertised; its secrets are shared %d-of-neighbourhood", len(ids)-1, c.r.k, c.r.st).
			WithHelp("too many of its neighbours dropped out for its masks to be removable; the round ends without its input — run it again"))
	}

	// Agree every pairwise secret now, so a bad key surfaces before any
	// share leaves the client.
	c.pairs = make(map[string][]byte, len(ids))
	c.boxKeys = make(map[string][]byte, len(ids))
	for _, v := range ids {
		if v == c.id {
			continue
		}
		ek, err1 := agree(c.encKey, u1[v].EncKey)
		mk, err2 := agree(c.maskKey, u1[v].MaskKey)
		if err1 != nil || err2 != nil {
			return nil, c.fail(malformed("key advert of "+v, "a public key is not a usable X25519 key"))
		}
		c.boxKeys[v], c.pairs[v] = ek, mk
	}

	c.seed = make([]byte, keySize)
	if _, err := rand.Read(c.seed); err != nil {
		return nil, c.fail(err)
	}
	xs := make([]byte, len(ids))
	for i, v := range ids {
		xs[i] = c.r.holderX[c.id][v]
	}
	seedShares, err := shamirSplit(rand.Reader, c.seed, c.r.st, xs)
	if err != nil {
		return nil, c.fail(err)
	}
	keyShares, err := shamirSplit(rand.Reader, c.maskKey.Bytes(), c.r.st, xs)
	if err != nil {
		return nil, c.fail(err)
	}
	out := &Shares{Round: c.r.id, From: c.id, Commit: seedCommit(c.r.session, c.id, c.seed)}
	c.held = make(map[string]heldShares, len(ids))
	for i, v := range ids {
		if v == c.id {
			c.held[v] = heldShares{seed: seedShares[i], key: keyShares[i]}
			continue
		}
		pt := mustEncode(sharePayload{Round: c.r.id, From: c.id, To: v, Seed: seedShares[i], Key: keyShares[i]})
		sealed, err := SealBox(shareKey(c.boxKeys[v], c.r.session, c.id, v), shareAD(c.r, c.id, v), pt)
		clear(pt)
		clear(seedShares[i])
		clear(keyShares[i])
		if err != nil {
			return nil, c.fail(err)
		}
		out.Boxes = append(out.Boxes, Box{From: c.id, To: v, Sealed: sealed})
	}
	c.u1 = u1
	c.state = clientShared
	return out, nil
}

// MaskInput handles the server's relay of the shares sent to this client
// (whose senders, with this client, are U2) and returns the input masked:
//
//	y_u = encode(x ‖ weight) + PRG(b_u) + Σ_{v ∈ U2, v ≠ u} Δ_uv·PRG(s_uv)
//
// x must have the round's dimension with every |x_i| ≤ Clip; weight must be
// 0 on an unweighted round and in [0, MaxWeight] on a weighted one. A bad
// input is refused without aborting, so the caller can fix it and retry.
func (c *Client) MaskInput(d *ShareDelivery, x []float64, weight float64) (*MaskedInput, error) {
	return c.mask(nil, d, x, nil, weight)
}

// MaskInputTo is MaskInput writing the masked vector into buf when its
// capacity holds it (MaskedVectorSize bytes), so that a site masking
// round after round reuses one buffer instead of allocating, and the
// allocator zeroing, 8·Dim bytes a round. The returned input's Masked is
// then buf[:MaskedVectorSize()]: buf must not be changed until the input
// is sent (or marshalled). buf's contents do not matter; every byte is
// overwritten. A buf too small (nil included) is ignored.
func (c *Client) MaskInputTo(buf []byte, d *ShareDelivery, x []float64, weight float64) (*MaskedInput, error) {
	return c.mask(buf, d, x, nil, weight)
}

// MaskedVectorSize is the length in bytes of the masked vector this
// client's round sends: the capacity MaskInputTo and MaskEncodedTo need
// to reuse a buffer.
func (c *Client) MaskedVectorSize() int { return c.r.lay.size() }

// MaskEncoded is MaskInput for an input the site has put on the round's
// grid itself: y_i is the integer standing for y_i·2^-f (f = FracBits),
// with |y_i| ≤ EncodedBound. A site that adds differential-privacy noise
// on the integers (dp.GridGaussian) sends them this way, so no
// floating-point step follows the noise. The weight is encoded as in
// MaskInput.
func (c *Client) MaskEncoded(d *ShareDelivery, y []int64, weight float64) (*MaskedInput, error) {
	return c.MaskEncodedTo(nil, d, y, weight)
}

// MaskEncodedTo is MaskEncoded writing into buf, as MaskInputTo.
func (c *Client) MaskEncodedTo(buf []byte, d *ShareDelivery, y []int64, weight float64) (*MaskedInput, error) {
	if y == nil {
		y = []int64{}
	}
	return c.mask(buf, d, nil, y, weight)
}

// mask is MaskInputTo (enc nil) and MaskEncodedTo (x nil).
func (c *Client) mask(buf []byte, d *ShareDelivery, x []float64, enc []int64, weight float64) (*MaskedInput, error) {
	if d == nil {
		return nil, malformed("share delivery", "no message")
	}
	if err := c.enter("share delivery", clientShared, d.Round); err != nil {
		return nil, err
	}
	if enc != nil {
		if err := c.checkEncoded(enc, weight); err != nil {
			return nil, err
		}
	} else if err := c.checkInput(x, weight); err != nil {
		return nil, err
	}
	if err := d.validate(); err != nil {
		return nil, c.fail(err)
	}
	if d.To != c.id {
		return nil, diag.New(diag.SecAggUnknownSite, c.subject(), "share delivery is addressed to %q", d.To).
			WithHelp("the delivery was misrouted; deliver each client its own")
	}
	u2 := []string{c.id}
	for _, b := range d.Boxes {
		if _, ok := c.u1[b.From]; !ok || b.From == c.id || b.To != c.id || !c.r.neighbour(c.id, b.From) {
			return nil, c.fail(diag.New(diag.SecAggUnknownSite, c.subject(), "delivery holds a box from %q to %q", b.From, b.To).
				WithHelp("a delivery may only hold boxes to this client from other clients of the key set"))
		}
		if _, dup := c.held[b.From]; dup {
			return nil, c.fail(diag.New(diag.SecAggDuplicate, c.subject(), "delivery holds two boxes from %q", b.From).
				WithHelp("the relay is faulty or tampered with"))
		}
		h, err := c.open(b)
		if err != nil {
			return nil, c.fail(err)
		}
		c.held[b.From] = h
		u2 = append(u2, b.From)
	}
	if c.r.proto == SecAggPlus && c.r.k < c.r.n-1 {
		// A SecAgg+ client sees only its neighbourhood here; the whole
		// round's count is checked at unmasking.
		if len(u2) < c.r.st {
			return nil, c.fail(diag.New(diag.SecAggBelowThreshold, c.subject(), "%d of this site's neighbourhood shared keys; its secrets are shared %d-of-neighbourhood", len(u2), c.r.st).
				WithHelp("too many of its neighbours dropped out for its masks to be removable; the round ends without its input — run it again"))
		}
	} else if err := c.checkSurvivors("masked input collection", len(u2)); err != nil {
		return nil, c.fail(err)
	}
	slices.Sort(u2)
	c.u2 = u2
	y, err := c.maskedVector(buf, x, enc, weight, u2)
	if err != nil {
		return nil, c.fail(err)
	}
	if c.r.p.Parent != nil {
		// The key that seals this site's unmasking to the parent needs
		// c_u, which is dropped below.
		if err := c.keyToParent(); err != nil {
			return nil, c.fail(err)
		}
	}
	// The pairwise secrets and the seed are in the shares now; the client
	// needs only the shares it holds.
	clear(c.seed)
	for _, s := range c.pairs {
		clear(s)
	}
	for _, s := range c.boxKeys {
		clear(s)
	}
	c.seed, c.pairs, c.boxKeys, c.encKey, c.maskKey = nil, nil, nil, nil, nil
	c.state = clientMasked
	return &MaskedInput{Round: c.r.id, From: c.id, Masked: y}, nil
}

// CheckEncoded reports whether MaskEncoded would accept y and weight.
func (c *Client) CheckEncoded(y []int64, weight float64) error { return c.checkEncoded(y, weight) }

func (c *Client) checkEncoded(y []int64, weight float64) error {
	if len(y) != c.r.p.Dim {
		return diag.New(diag.SecAggWrongLength, c.subject(), "input has %d values, the round aggregates %d", len(y), c.r.p.Dim).
			WithHelp("send a vector of the round's dimension")
	}
	b := c.r.encBound
	for i, v := range y {
		if v > b || v < -b {
			return diag.New(diag.SecAggOutOfRange, c.subject(), "encoded input value %d is %d, outside [-%d, %d] (clip %v on a grid of 2^%d)", i, v, b, b, c.r.p.Clip, c.r.fracBits).
				WithHelp("clip the update and keep the noise within the round's headroom before aggregating")
		}
	}
	return c.checkWeight(weight)
}

// CheckInput reports whether MaskInput would accept x and weight (length,
// range, finiteness, weighting), without changing the client's state. A
// driver calls it before the round starts, so that a bad input is refused
// before anything leaves the site.
func (c *Client) CheckInput(x []float64, weight float64) error { return c.checkInput(x, weight) }

// checkInput refuses an input of the wrong length or out of range.
func (c *Client) checkInput(x []float64, weight float64) error {
	if len(x) != c.r.p.Dim {
		return diag.New(diag.SecAggWrongLength, c.subject(), "input has %d values, the round aggregates %d", len(x), c.r.p.Dim).
			WithHelp("send a vector of the round's dimension")
	}
	for i, v := range x {
		if !inRange(v, c.r.p.Clip) {
			return diag.New(diag.SecAggOutOfRange, c.subject(), "input value %d is %v, outside [-%v, %v]", i, v, c.r.p.Clip, c.r.p.Clip).
				WithHelp("clip the update to the round's clip range (and check for NaN or Inf) before aggregating")
		}
	}
	return c.checkWeight(weight)
}

// checkWeight refuses a weight outside the round's range.
func (c *Client) checkWeight(weight float64) error {
	if !c.r.p.Weighted {
		if weight != 0 {
			return diag.New(diag.SecAggOutOfRange, c.subject(), "weight %v given on an unweighted round", weight).
				WithHelp("pass weight 0, or make the round weighted")
		}
	} else if !inRange(weight, c.r.p.MaxWeight) || weight < 0 {
		return diag.New(diag.SecAggOutOfRange, c.subject(), "weight %v, outside [0, %v]", weight, c.r.p.MaxWeight).
			WithHelp("weights are non-negative and at most the round's max weight")
	}
	return nil
}

// maskedVector encodes x (or takes enc, already on the grid) and the
// weight in the ring and adds the client's masks for the survivors u2, in
// one pass over the output (the masked input's bytes), on all cores. The
// output is buf[:size] when buf has the capacity, else a new slice: every
// byte of it is written, so buf's old contents never matter and a reused
// buffer costs no zeroing.
func (c *Client) maskedVector(buf []byte, x []float64, enc []int64, weight float64, u2 []string) ([]byte, error) {
	l := c.r.lay
	var out []byte
	if cap(buf) >= l.size() {
		out = buf[:l.size()]
	} else {
		out = make([]byte, l.size())
	}
	rd, err := newRounder(c.r.prg)
	if err != nil {
		return nil, err
	}
	defer rd.wipe()
	var rec []uint64
	if c.testEncoded != nil {
		rec = make([]uint64, c.r.dim)
	}
	woff, scale := l.weightOff(), c.r.scale
	fill := func(sc *scratch, vec []byte, lo, hi, width int, m uint64, src *[maskBatch][]byte, k int) {
		tile := vec[lo:hi]
		if lo >= woff {
			w := encodeValue(weight, c.r.wScale, rd.at(c.r.p.Dim))
			le.PutUint64(tile, w)
			sumWords(tile, m, src, k)
			if rec != nil {
				rec[c.r.p.Dim] = w
			}
			return
		}
		i, cnt := lo/width, (hi-lo)/width
		if enc != nil {
			coordsAddTile(tile, width, enc[i:i+cnt], m, src, k) // two's complement: the ring image of enc
			if rec != nil {
				for j, v := range enc[i : i+cnt] {
					rec[i+j] = uint64(v)
				}
			}
			return
		}
		draws := sc.takeDraws(rd, i, cnt)
		encodeAddTile(tile, width, x[i:i+cnt], scale, draws, m, src, k)
		if rec != nil {
			// A test's record of the plaintext: take the masks off the
			// tile, read it, put them back.
			subWords(tile, m, src, k)
			for j := range cnt {
				rec[i+j] = uint64(coordAt(vec, l, i+j))
			}
			sumWords(tile, m, src, k)
		}
	}
	masks := make([]mask, 0, len(u2))
	defer func() {
		for _, mk := range masks {
			clear(mk.key)
		}
	}()
	masks = append(masks, mask{selfMaskKey(c.seed, c.r.session, c.id), +1})
	for _, v := range u2 {
		if v != c.id {
			masks = append(masks, mask{pairMaskKey(c.pairs[v], c.r.session, c.id, v), pairSign(c.id, v)})
		}
	}
	applyMasks(c.r.prg, out, l, masks, fill)
	if c.testEncoded != nil {
		c.testEncoded(rec)
	}
	return out, nil
}

// open decrypts a box sent to this client and checks what it holds.
func (c *Client) open(b Box) (heldShares, error) {
	key := shareKey(c.boxKeys[b.From], c.r.session, b.From, c.id)
	pt, err := OpenBox(key, shareAD(c.r, b.From, c.id), b.Sealed)
	clear(key)
	if err != nil {
		return heldShares{}, diag.New(diag.SecAggDecrypt, c.subject(), "box from %q does not authenticate", b.From).
			WithHelp("the box was corrupted or tampered with in transit, or its sender is faulty")
	}
	defer clear(pt)
	var p sharePayload
	if err := content.Decode(pt, &p); err != nil || p.Round != c.r.id || p.From != b.From || p.To != c.id ||
		len(p.Seed) != keySize || len(p.Key) != keySize {
		return heldShares{}, diag.New(diag.SecAggDecrypt, c.subject(), "box from %q holds no valid shares for this round", b.From).
			WithHelp("the sender is faulty")
	}
	return heldShares{seed: p.Seed, key: p.Key}, nil
}

// SignSurvivors is the consistency round: it checks the server's survivor
// set (the unsigned UnmaskRequest) and returns this client's signature
// over it. It refuses, and aborts, if a site is named both survivor and
// dropped (both of its secrets would let the server unmask its input), if
// the lists do not match the clients that shared keys, if this client is
// named dropped, or if fewer than three or fewer than the threshold (or
// than RequireSurvivors) survive. A client signs one survivor set per
// round: it reveals shares later only for the set it signed.
func (c *Client) SignSurvivors(req *UnmaskRequest) (*SurvivorSig, error) {
	if err := receive(c, "survivor set", clientMasked, req); err != nil {
		return nil, err
	}
	if len(req.Signatures) != 0 {
		return nil, c.fail(malformed("survivor set", "the set to sign already carries %d signatures", len(req.Signatures)))
	}
	named, err := c.checkSet(req)
	if err != nil {
		return nil, c.fail(err)
	}
	c.named = named
	c.signedSurv, c.signedDrop = sortedCopy(req.Survivors), sortedCopy(req.Dropped)
	c.statement = survivorStatement(c.r, req.Survivors, req.Dropped)
	c.state = clientSigned
	return &SurvivorSig{Round: c.r.id, From: c.id, Sig: signSurvivors(c.identity, c.statement)}, nil
}

// checkSet applies the checks of a survivor set that need no signature and
// returns each named site's role (true: survivor).
func (c *Client) checkSet(req *UnmaskRequest) (map[string]bool, error) {
	named := make(map[string]bool, len(req.Survivors)+len(req.Dropped))
	for _, v := range req.Survivors {
		if named[v] {
			return nil, diag.New(diag.SecAggDuplicate, c.subject(), "unmask request names survivor %q twice", v).
				WithHelp("the server is faulty")
		}
		named[v] = true
	}
	for _, v := range req.Dropped {
		if named[v] {
			if slices.Contains(req.Survivors, v) {
				return nil, diag.New(diag.SecAggBothSecrets, c.subject(), "unmask request names %q both as survivor and as dropped", v).
					WithHelp("revealing both the self-mask seed and the mask key of one site would expose its input; the round is aborted")
			}
			return nil, diag.New(diag.SecAggDuplicate, c.subject(), "unmask request names dropped client %q twice", v).
				WithHelp("the server is faulty")
		}
		named[v] = false
	}
	for v := range named {
		_, held := c.held[v]
		_, advertised := c.u1[v]
		if !held && (c.r.neighbour(c.id, v) || !advertised) {
			return nil, diag.New(diag.SecAggUnknownSite, c.subject(), "unmask request names %q, which did not share keys with this client", v).
				WithHelp("survivors and dropped clients must come from the clients that shared keys")
		}
	}
	for _, v := range c.u2 {
		if _, ok := named[v]; !ok {
			return nil, diag.New(diag.SecAggUnknownSite, c.subject(), "unmask request leaves out %q", v).
				WithHelp("every client that shared keys is either a survivor or dropped")
		}
	}
	if !named[c.id] {
		return nil, diag.New(diag.SecAggUnknownSite, c.subject(), "unmask request names this client as dropped, but it sent its masked input").
			WithHelp("the server is faulty")
	}
	if err := c.checkSurvivors("unmasking", len(req.Survivors)); err != nil {
		return nil, err
	}
	return named, nil
}

// Unmask answers the server's unmask request — the survivor set this
// client signed, with the signatures the server collected — with, for
// every survivor, this client's share of that survivor's self-mask seed,
// and for every dropped client its share of that client's mask key. Before
// revealing anything it checks the consistency proof (checkSignatures):
// the same set as it signed, signers among the survivors, every signature
// it relies on valid under the signer's identity key, and enough of them.
// On any mismatch it aborts with SC6018 and reveals nothing. A client
// answers one unmask request per round.
func (c *Client) Unmask(req *UnmaskRequest) (*Unmasking, error) {
	if err := receive(c, "unmask request", clientSigned, req); err != nil {
		return nil, err
	}
	if err := c.checkSignatures(req); err != nil {
		return nil, c.fail(err)
	}
	out := &Unmasking{Round: c.r.id, From: c.id}
	for _, v := range sortedKeys(c.named) {
		if _, held := c.held[v]; !held {
			continue // not a neighbour: this client holds nothing of it
		}
		if c.named[v] {
			out.Seeds = append(out.Seeds, Share{Of: v, Value: slices.Clone(c.held[v].seed)})
		} else {
			out.Keys = append(out.Keys, Share{Of: v, Value: slices.Clone(c.held[v].key)})
		}
	}
	if c.r.p.Parent != nil {
		if err := c.sealToParent(out); err != nil {
			return nil, c.fail(err)
		}
	}
	c.state = clientDone
	c.wipe()
	return out, nil
}

// checkSignatures is the client's side of the consistency check: the
// request names exactly the set this client signed; every signer is a
// survivor of that set, listed once; and for every site whose share this
// client reveals, at least the sharing threshold of that site's holders
// (pairwise: t of all members; SecAgg+: st of the site and its
// neighbours) signed the set, each signature checked under the signer's
// identity key. Honest sites sign one set per round, so a server that
// showed different sites different sets cannot show t signatures for two
// sets unless corrupt sites sign both (docs/secagg.md, "The consistency
// round", has the bound). Under SecAgg+ only the signatures of those
// holders are verified — at most 2k+1 sites on the Harary graph — so the
// cost does not grow with n; the others are only counted.
func (c *Client) checkSignatures(req *UnmaskRequest) error {
	bad := func(format string, args ...any) error {
		return diag.New(diag.SecAggEquivocation, c.subject(), format, args...).
			WithHelp("the aggregator showed this site another survivor set than the others signed, or relayed forged, replayed or too few signatures; this site revealed nothing — the round ends without a result; check the aggregator before running it again")
	}
	if !slices.Equal(sortedCopy(req.Survivors), c.signedSurv) || !slices.Equal(sortedCopy(req.Dropped), c.signedDrop) {
		return bad("the unmask request names other survivors or dropped sites than the set this site signed")
	}
	if len(req.Signatures) < c.r.floor {
		return diag.New(diag.SecAggBelowThreshold, c.subject(), "the unmask request carries %d signatures of the survivor set; at least %d sites must sign it", len(req.Signatures), c.r.floor).
			WithHelp("too few survivors signed the set (they dropped out, or the aggregator withheld their signatures); this site revealed nothing — the round ends without a result")
	}
	// The holders whose signatures count: of every site whose share this
	// client reveals (itself included, for its own seed).
	need := map[string]bool{}
	for _, v := range sortedKeys(c.held) {
		if _, ok := c.named[v]; ok {
			for h := range c.r.holderX[v] {
				need[h] = true
			}
		}
	}
	valid := make(map[string]bool, len(req.Signatures))
	seen := make(map[string]bool, len(req.Signatures))
	for _, sg := range req.Signatures {
		if seen[sg.Of] {
			return bad("the unmask request lists two signatures of %q", sg.Of)
		}
		seen[sg.Of] = true
		if !c.named[sg.Of] {
			return bad("the unmask request carries a signature of %q, which is not a survivor of the set", sg.Of)
		}
		if !need[sg.Of] {
			continue
		}
		if !verifySurvivors(c.r.members[sg.Of], c.statement, sg.Sig) {
			return bad("the signature of %q does not verify over the survivor set this site signed (forged, made for another set, or replayed from another round)", sg.Of)
		}
		valid[sg.Of] = true
	}
	if !valid[c.id] {
		return bad("the unmask request does not carry this site's own signature of the set")
	}
	for _, v := range sortedKeys(c.held) {
		if _, ok := c.named[v]; !ok {
			continue
		}
		if have := countSigners(c.r, v, func(h string) bool { return valid[h] }); have < c.r.st {
			return tooFewSigners(c.subject(), v, have, c.r.st)
		}
	}
	return nil
}

// countSigners counts the holders of v's shares that signed.
func countSigners(r *round, v string, signed func(string) bool) int {
	n := 0
	for h := range r.holderX[v] {
		if signed(h) {
			n++
		}
	}
	return n
}

// tooFewSigners is the refusal when fewer than the sharing threshold of
// v's holders signed the survivor set: the server could not rebuild v's
// secret from them, and a site that revealed its share anyway would rely
// on a set that too few of v's holders vouch for.
func tooFewSigners(subject, v string, have, st int) error {
	return diag.New(diag.SecAggBelowThreshold, subject, "%d holders of the shares of %q signed the survivor set; it is shared %d-of-neighbourhood", have, v, st).
		WithHelp("too many of its holders dropped out before signing (or the aggregator withheld their signatures); the round ends without a result and no share is revealed — run it again")
}

// agree is X25519 between our private key and a peer's advertised key.
func agree(priv *ecdh.PrivateKey, peer []byte) ([]byte, error) {
	pub, err := ecdh.X25519().NewPublicKey(peer)
	if err != nil {
		return nil, err
	}
	return priv.ECDH(pub)
}

// shareKey keys the box from → to; it differs per direction.
func shareKey(shared, session []byte, from, to string) []byte {
	return deriveKey(shared, session, labelShareKey, from, to)
}

// shareAD binds a box to the round and both identities.
func shareAD(r *round, from, to string) []byte {
	return mustEncode([]any{labelShareAD, r.session, r.id, from, to})
}

// seedCommit commits to a self-mask seed: SHA-256 of the canonical encoding
// of the label, the session, the client and the seed.
func seedCommit(session []byte, u string, seed []byte) []byte {
	sum := sha256.Sum256(mustEncode([]any{labelCommit, session, u, seed}))
	return sum[:]
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
