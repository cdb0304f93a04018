package he

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"slices"

	"github.com/tuneinsight/lattigo/v5/core/rlwe"
	"github.com/tuneinsight/lattigo/v5/he/heint"
	"github.com/tuneinsight/lattigo/v5/mhe"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg"
)

// Party is one site's side of a threshold-he round. It is not safe for
// concurrent use. Call, in order: Advertise, Share, Encrypt, Decrypt
// (Decrypt again only for a later attempt on the same sum). Any protocol
// violation aborts the party: every later call returns SC6017.
type Party struct {
	r    *round
	site string
	id   ed25519.PrivateKey
	need int // survivors this site insists on (max(floor, RequireSurvivors))

	box     *ecdh.PrivateKey
	boxKeys map[string][]byte // U1's advertised box keys
	sk      *rlwe.SecretKey   // its own key, until it has encrypted
	own     mhe.ShamirSecretShare
	u2      []string
	// held are the Shamir shares, at this site's point, of the keys of
	// U2 (its own included): a decryption combines those of the sum's
	// contributors, whose keys the sum is encrypted under.
	held map[string]mhe.ShamirSecretShare
	step int
	// opened is the digest of the one sum (its contributors) this site
	// decrypts in the round; answered the attempts it answered.
	opened   []byte
	answered map[int]bool
	aborted  error
}

// NewParty returns the party of site (a member whose key is id's public key).
func NewParty(p Params, site string, id ed25519.PrivateKey) (*Party, error) {
	r, err := newRound(p)
	if err != nil {
		return nil, err
	}
	pub, ok := r.keys[site]
	if !ok || len(id) != ed25519.PrivateKeySize || subtle.ConstantTimeCompare(pub, id.Public().(ed25519.PublicKey)) != 1 {
		return nil, diag.New(diag.SecAggUnknownSite, r.subject(), "%q with this identity key is not a member of the round", site).
			WithHelp("the round was planned without this site; it sends nothing")
	}
	return &Party{r: r, site: site, id: id, need: r.floor, answered: map[int]bool{}}, nil
}

// RequireSurvivors makes the party refuse to encrypt or decrypt when fewer
// than k sites remain (a silo passes its policy's min_cohort).
func (c *Party) RequireSurvivors(k int) { c.need = max(c.r.floor, k) }

func (c *Party) subject() string { return c.r.subject() }

func (c *Party) abort(err error) error {
	if c.aborted == nil {
		c.aborted = err
		c.wipe()
	}
	return err
}

func (c *Party) wipe() {
	if c.sk != nil {
		zero(c.sk.Value.Q.Coeffs)
	}
	c.sk, c.box = nil, nil
	zero(c.own.Q.Coeffs)
	c.own = mhe.ShamirSecretShare{}
	for _, sh := range c.held {
		zero(sh.Q.Coeffs)
	}
	c.held = nil
}

func (c *Party) order(step int, what string) error {
	if c.aborted != nil {
		return diag.New(diag.SecAggAborted, c.subject(), "the site aborted the round earlier: %v", c.aborted).
			WithHelp("a site that saw a protocol violation takes no further part in the round")
	}
	if c.step != step {
		return diag.New(diag.SecAggOutOfOrder, c.subject(), "%s out of order", what).WithHelp("drive the party in order: Advertise, Share, Encrypt, Decrypt")
	}
	return nil
}

// Advertise draws the site's box key and returns its signed advert.
func (c *Party) Advertise() (*Advert, error) {
	if err := c.order(0, "advertise"); err != nil {
		return nil, err
	}
	var err error
	if c.box, err = ecdh.X25519().GenerateKey(rand.Reader); err != nil {
		return nil, err
	}
	a := &Advert{Round: c.r.p.Round, Site: c.site, Params: slices.Clone(c.r.session), BoxKey: c.box.PublicKey().Bytes()}
	a.Sig = signAdvert(c.id, a)
	c.step = 1
	return a, nil
}

// Share checks the relayed adverts (U1), draws the site's secret key,
// and returns it Shamir-shared t-of-|U1|, one sealed share per other site
// of U1.
func (c *Party) Share(ks *KeySet) (*Shares, error) {
	if err := c.order(1, "share"); err != nil {
		return nil, err
	}
	r := c.r
	if err := r.checkRound(ks.Round); err != nil {
		return nil, c.abort(err)
	}
	c.boxKeys = map[string][]byte{}
	for i := range ks.Adverts {
		a := &ks.Adverts[i]
		if err := r.checkAdvert(a); err != nil {
			return nil, c.abort(err)
		}
		if _, dup := c.boxKeys[a.Site]; dup {
			return nil, c.abort(diag.New(diag.SecAggDuplicate, c.subject(), "two adverts of %q relayed", a.Site))
		}
		c.boxKeys[a.Site] = a.BoxKey
	}
	if own, ok := c.boxKeys[c.site]; !ok || !bytes.Equal(own, c.box.PublicKey().Bytes()) {
		return nil, c.abort(diag.New(diag.SecAggBadSignature, c.subject(), "the key set lacks this site's own advert or alters it").
			WithHelp("the aggregator relayed another key set than the one it received"))
	}
	if len(c.boxKeys) < c.need {
		return nil, c.abort(diag.New(diag.SecAggBelowThreshold, c.subject(), "%d sites advertised; this site needs at least %d", len(c.boxKeys), c.need).
			WithHelp("the round goes on without this site; run it again when more sites are up"))
	}
	params := r.s.params
	c.sk = rlwe.NewKeyGenerator(params).GenSecretKeyNew() // lattigo's PRNG keyed from crypto/rand
	out := &Shares{Round: r.p.Round, From: c.site}

	thr := mhe.NewThresholdizer(params)
	poly, err := thr.GenShamirPolynomial(r.t, c.sk)
	if err != nil {
		return nil, c.abort(err)
	}
	defer func() {
		for i := range poly.Value {
			zero(poly.Value[i].Q.Coeffs)
		}
	}()
	sites := make([]string, 0, len(c.boxKeys))
	for s := range c.boxKeys {
		sites = append(sites, s)
	}
	slices.Sort(sites)
	for _, v := range sites {
		sh := thr.AllocateThresholdSecretShare()
		thr.GenShamirSecretShare(mhe.ShamirPublicPoint(r.points[v]), poly, &sh)
		if v == c.site {
			c.own = sh
			continue
		}
		b, err := sh.MarshalBinary()
		if err != nil {
			return nil, c.abort(err)
		}
		key, err := boxKey(c.box, c.boxKeys[v], r.session, c.site, v)
		if err != nil {
			return nil, c.abort(err)
		}
		sealed, err := secagg.SealBox(key, boxAD(r.session, r.p.Round, c.site, v), b)
		clear(b)
		if err != nil {
			return nil, c.abort(err)
		}
		out.Boxes = append(out.Boxes, Box{To: v, Sealed: sealed})
	}
	c.step = 2
	return out, nil
}

func zero(cs [][]uint64) {
	for _, c := range cs {
		clear(c)
	}
}

// CheckInput reports whether Encrypt would accept y (length and bound).
func (c *Party) CheckInput(y []int64) error {
	if len(y) != c.r.p.Dim {
		return diag.New(diag.SecAggWrongLength, c.subject(), "input of %d values; the round sums %d", len(y), c.r.p.Dim).
			WithHelp("the site and the round disagree on the model's size")
	}
	b := c.r.p.Bound
	for i, v := range y {
		if v > b || v < -b {
			return diag.New(diag.SecAggOutOfRange, c.subject(), "encoded value %d is outside ±%d", i, b).
				WithHelp("clip the update, or use a coarser grid, before encrypting")
		}
	}
	return nil
}

// Encrypt checks the delivery (U2, the boxes sent to this site), keeps
// the Shamir shares it carries, and returns y packed (Params.Lanes values
// per coefficient) and encrypted under the site's own secret key, with
// the round's public polynomials as c1 (lattigo's secret-key encryptor
// drawing its uniform element from the CRS: rlwe.Encryptor.WithPRNG).
// The key is wiped afterwards: only the shares remain.
func (c *Party) Encrypt(d *Delivery, y []int64) (*Ciphertext, error) {
	if err := c.order(2, "encrypt"); err != nil {
		return nil, err
	}
	if err := c.CheckInput(y); err != nil {
		return nil, err // the input is the caller's, not a protocol violation
	}
	r := c.r
	if err := r.checkRound(d.Round); err != nil {
		return nil, c.abort(err)
	}
	if d.To != c.site {
		return nil, c.abort(diag.New(diag.SecAggUnknownSite, c.subject(), "a delivery addressed to %q", d.To))
	}
	c.held = map[string]mhe.ShamirSecretShare{}
	for _, e := range d.From {
		_, known := c.boxKeys[e.From]
		if _, dup := c.held[e.From]; !known || dup {
			return nil, c.abort(diag.New(diag.SecAggUnknownSite, c.subject(), "the delivery names %q, not once a site of the key set", e.From))
		}
		if e.From == c.site {
			if len(e.Box) != 0 {
				return nil, c.abort(malformed("delivery", "a box from this site to itself"))
			}
			c.held[e.From] = c.own
			continue
		}
		key, err := boxKey(c.box, c.boxKeys[e.From], r.session, e.From, c.site)
		if err != nil {
			return nil, c.abort(err)
		}
		b, err := secagg.OpenBox(key, boxAD(r.session, r.p.Round, e.From, c.site), e.Box)
		if err != nil || len(b) != r.s.skSize {
			return nil, c.abort(diag.New(diag.SecAggDecrypt, c.subject(), "the key share from %q fails authentication", e.From).
				WithHelp("the share was altered in transit or sealed for another round"))
		}
		var sh mhe.ShamirSecretShare
		err = sh.UnmarshalBinary(b)
		clear(b)
		if err != nil || sh.Q.N() != r.s.params.N() || sh.LevelQ() != r.s.params.MaxLevel() || sh.LevelP() != -1 {
			return nil, c.abort(malformed("key share", "from %q: not a share of the round's ring (%v)", e.From, err))
		}
		c.held[e.From] = sh
	}
	if _, ok := c.held[c.site]; !ok {
		return nil, c.abort(diag.New(diag.SecAggUnknownSite, c.subject(), "the delivery leaves this site out of the key").
			WithHelp("the aggregator dropped this site's shares; it takes no further part"))
	}
	if len(c.held) < c.need {
		return nil, c.abort(diag.New(diag.SecAggBelowThreshold, c.subject(), "%d sites shared keys; this site needs at least %d", len(c.held), c.need).
			WithHelp("the round goes on without this site"))
	}
	c.u2 = make([]string, 0, len(c.held))
	for s := range c.held {
		c.u2 = append(c.u2, s)
	}
	slices.Sort(c.u2)

	params := r.s.params
	enc := rlwe.NewEncryptor(params, c.sk).WithPRNG(r.crs()) // noise from lattigo's PRNG keyed from crypto/rand; c1 from the CRS
	ecd := heint.NewEncoder(params)
	pt := r.newPlaintext()
	packed := make([]int64, r.s.slots)
	out := &Ciphertext{Round: r.p.Round, From: c.site, C0: make([][]byte, r.cts)}
	for k := range r.cts {
		r.pack(packed, y, k)
		if err := ecd.Encode(packed, pt); err != nil {
			return nil, c.abort(err)
		}
		ct := r.newCiphertext()
		if err := enc.Encrypt(pt, ct); err != nil {
			return nil, c.abort(err)
		}
		params.RingQ().Reduce(ct.Value[0], ct.Value[0])
		c0, err := ct.Value[0].MarshalBinary()
		if err != nil {
			return nil, c.abort(err)
		}
		out.C0[k] = c0
	}
	clear(packed)
	zero(pt.Value.Coeffs)
	zero(c.sk.Value.Q.Coeffs) // the shares replace the key
	c.sk = nil
	c.step = 3
	return out, nil
}

// Decrypt returns this site's partial decryption of the sum the request
// names, with smudging noise. It refuses (and aborts) a request of fewer
// contributors than max(3, t, RequireSurvivors), one that leaves this site
// out of the contributors or of the decryptors, decryptors that are not
// exactly t sites of U2, an attempt it answered already, and — the "never
// both secrets" analogue — any sum other than the first it was asked to
// open in the round (SC6010): a sum is named by its contributors, whose
// keys the decryptors combine, so no request can open one site's input.
func (c *Party) Decrypt(req *DecryptRequest) (*DecryptShare, error) {
	if c.aborted != nil || c.step < 3 {
		if err := c.order(3, "decrypt"); err != nil {
			return nil, err
		}
	}
	r := c.r
	if err := r.checkRound(req.Round); err != nil {
		return nil, c.abort(err)
	}
	refuse := func(format string, args ...any) (*DecryptShare, error) {
		return nil, c.abort(diag.New(diag.SecAggBothSecrets, c.subject(), format, args...).
			WithHelp("the aggregator asked for a decryption the protocol does not allow; this site takes no further part in the round"))
	}
	if c.answered[req.Attempt] {
		return refuse("decryption attempt %d was answered already", req.Attempt)
	}
	inU2 := func(s string) bool { _, ok := slices.BinarySearch(c.u2, s); return ok }
	if !slices.IsSorted(req.Contributors) || len(slices.Compact(slices.Clone(req.Contributors))) != len(req.Contributors) {
		return refuse("the contributors are not a sorted set")
	}
	for _, s := range req.Contributors {
		if !inU2(s) {
			return refuse("contributor %q did not share keys", s)
		}
	}
	if !slices.Contains(req.Contributors, c.site) {
		return refuse("the request leaves this site's own ciphertext out of the sum")
	}
	if len(req.Contributors) < c.need {
		return nil, c.abort(diag.New(diag.SecAggBelowThreshold, c.subject(), "the sum holds %d sites; this site decrypts only sums of at least %d", len(req.Contributors), c.need).
			WithHelp("the round ends without a result; run it again when more sites are up"))
	}
	if len(req.Decryptors) != r.t || len(slices.Compact(slices.Sorted(slices.Values(req.Decryptors)))) != r.t {
		return refuse("%d decryptors named; the round decrypts with exactly t = %d distinct sites", len(req.Decryptors), r.t)
	}
	for _, s := range req.Decryptors {
		if !slices.Contains(req.Contributors, s) {
			return refuse("decryptor %q is not a contributor", s)
		}
	}
	if !slices.Contains(req.Decryptors, c.site) {
		return refuse("this site is not among the decryptors")
	}
	dg := sha256.Sum256(mustEncode(req.Contributors))
	if c.opened != nil && !bytes.Equal(c.opened, dg[:]) {
		return refuse("a second, different sum to decrypt in one round")
	}
	params := r.s.params
	points := make([]mhe.ShamirPublicPoint, len(c.u2))
	for i, s := range c.u2 {
		points[i] = mhe.ShamirPublicPoint(r.points[s])
	}
	own := mhe.ShamirPublicPoint(r.points[c.site])
	cmb := mhe.NewCombiner(*params.GetRLWEParameters(), own, points, r.t)
	active := make([]mhe.ShamirPublicPoint, len(req.Decryptors))
	for i, s := range req.Decryptors {
		active[i] = mhe.ShamirPublicPoint(r.points[s])
	}
	// The share of the contributors' summed key Σ s_i at this site's point.
	thr := mhe.NewThresholdizer(params)
	tsk := thr.AllocateThresholdSecretShare()
	defer zero(tsk.Q.Coeffs)
	for _, s := range req.Contributors {
		if err := thr.AggregateShares(tsk, c.held[s], &tsk); err != nil {
			return nil, c.abort(err)
		}
	}
	add := rlwe.NewSecretKey(params)
	if err := cmb.GenAdditiveShare(active, own, tsk, add); err != nil {
		return nil, c.abort(err)
	}
	defer zero(add.Value.Q.Coeffs)
	cks, err := mhe.NewKeySwitchProtocol(params, r.s.smudge)
	if err != nil {
		return nil, c.abort(err)
	}
	zeroKey := rlwe.NewSecretKey(params)
	out := &DecryptShare{Round: r.p.Round, From: c.site, Attempt: req.Attempt, Shares: make([][]byte, r.cts)}
	for k, a := range r.uniform() {
		ct := r.ciphertext(params.RingQ().NewPoly(), a)
		sh := cks.AllocateShare(params.MaxLevel())
		cks.GenShare(add, zeroKey, ct, &sh)
		params.RingQ().Reduce(sh.Value, sh.Value) // GenShare reduces lazily
		out.Shares[k] = r.marshalShare(sh.Value)
	}
	c.opened = dg[:]
	c.answered[req.Attempt] = true
	return out, nil
}
