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
	sk      *rlwe.SecretKey
	pkShare []byte
	own     mhe.ShamirSecretShare // the share of its own key at its own point
	u2      []string
	tsk     mhe.ShamirSecretShare // its t-of-|U2| share of the collective key
	step    int
	// opened is the digest of the one ciphertext (contributors and c1)
	// this site decrypts in the round; answered the attempts it answered.
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
	c.tsk, c.own = mhe.ShamirSecretShare{}, mhe.ShamirSecretShare{}
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
// and returns its signed public-key share and its secret key
// Shamir-shared t-of-|U1|, one sealed share per other site of U1.
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
	ckg := mhe.NewPublicKeyGenProtocol(params)
	crp := ckg.SampleCRP(r.crs())
	share := ckg.AllocateShare()
	ckg.GenShare(c.sk, crp, &share)
	pkb, err := share.MarshalBinary()
	if err != nil {
		return nil, c.abort(err)
	}
	c.pkShare = pkb
	out := &Shares{Round: r.p.Round, From: c.site, PKShare: pkb,
		PKSig: signPK(c.id, r.session, c.site, pkb)}

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

// Encrypt checks the delivery (U2, the signed public-key shares, the boxes
// sent to this site), forms the collective public key and this site's
// threshold share of the collective secret key, and returns y encrypted
// under the collective key.
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
	params := r.s.params
	ckg := mhe.NewPublicKeyGenProtocol(params)
	agg := ckg.AllocateShare()
	thr := mhe.NewThresholdizer(params)
	c.tsk = thr.AllocateThresholdSecretShare()
	seen := map[string]bool{}
	for _, e := range d.From {
		if _, ok := c.boxKeys[e.From]; !ok || seen[e.From] {
			return nil, c.abort(diag.New(diag.SecAggUnknownSite, c.subject(), "the delivery names %q, not once a site of the key set", e.From))
		}
		seen[e.From] = true
		if err := r.checkPKShare(e.From, e.PKShare, e.PKSig); err != nil {
			return nil, c.abort(err)
		}
		var sh mhe.PublicKeyGenShare
		if err := sh.UnmarshalBinary(e.PKShare); err != nil {
			return nil, c.abort(malformed("public-key share", "from %q: %v", e.From, err))
		}
		ckg.AggregateShares(agg, sh, &agg)
		if e.From == c.site {
			if !bytes.Equal(e.PKShare, c.pkShare) {
				return nil, c.abort(diag.New(diag.SecAggBadSignature, c.subject(), "the delivery alters this site's own public-key share"))
			}
			thr.AggregateShares(c.tsk, c.own, &c.tsk)
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
		var sh2 mhe.ShamirSecretShare
		err = sh2.UnmarshalBinary(b)
		clear(b)
		if err != nil {
			return nil, c.abort(malformed("key share", "from %q: %v", e.From, err))
		}
		if err := thr.AggregateShares(c.tsk, sh2, &c.tsk); err != nil {
			return nil, c.abort(malformed("key share", "from %q: %v", e.From, err))
		}
	}
	if !seen[c.site] {
		return nil, c.abort(diag.New(diag.SecAggUnknownSite, c.subject(), "the delivery leaves this site out of the key").
			WithHelp("the aggregator dropped this site's shares; it takes no further part"))
	}
	if len(seen) < c.need {
		return nil, c.abort(diag.New(diag.SecAggBelowThreshold, c.subject(), "%d sites shared keys; this site needs at least %d", len(seen), c.need).
			WithHelp("the round goes on without this site"))
	}
	c.u2 = make([]string, 0, len(seen))
	for s := range seen {
		c.u2 = append(c.u2, s)
	}
	slices.Sort(c.u2)
	zero(c.sk.Value.Q.Coeffs) // the threshold share replaces the key and its own share
	c.sk, c.own = nil, mhe.ShamirSecretShare{}

	pk := rlwe.NewPublicKey(params)
	ckg.GenPublicKey(agg, ckg.SampleCRP(r.crs()), pk)
	enc := rlwe.NewEncryptor(params, pk) // its PRNG is keyed from crypto/rand
	ecd := heint.NewEncoder(params)
	pt := r.newPlaintext()
	out := &Ciphertext{Round: r.p.Round, From: c.site, Cts: make([]CT, r.cts)}
	n := r.s.slots
	for k := range r.cts {
		chunk := y[k*n : min((k+1)*n, len(y))]
		if err := ecd.Encode(chunk, pt); err != nil {
			return nil, c.abort(err)
		}
		ct := r.newCiphertext()
		if err := enc.Encrypt(pt, ct); err != nil {
			return nil, c.abort(err)
		}
		params.RingQ().Reduce(ct.Value[0], ct.Value[0])
		params.RingQ().Reduce(ct.Value[1], ct.Value[1])
		c0, err := ct.Value[0].MarshalBinary()
		if err != nil {
			return nil, c.abort(err)
		}
		c1, err := ct.Value[1].MarshalBinary()
		if err != nil {
			return nil, c.abort(err)
		}
		out.Cts[k] = CT{C0: c0, C1: c1}
	}
	zero(pt.Value.Coeffs)
	c.step = 3
	return out, nil
}

// Decrypt returns this site's partial decryption of the sum the request
// names, with smudging noise. It refuses (and aborts) a request of fewer
// contributors than max(3, t, RequireSurvivors), one that leaves this site
// out of the contributors or of the decryptors, decryptors that are not
// exactly t sites of U2, an attempt it answered already, and — the "never
// both secrets" analogue — any ciphertext other than the first it was
// asked to open in the round (SC6010).
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
	if len(req.C1) != r.cts {
		return refuse("%d ciphertexts to decrypt; the round has %d", len(req.C1), r.cts)
	}
	h := sha256.New()
	h.Write(mustEncode(req.Contributors))
	for _, b := range req.C1 {
		h.Write(b)
	}
	dg := h.Sum(nil)
	if c.opened != nil && !bytes.Equal(c.opened, dg) {
		return refuse("a second, different ciphertext to decrypt in one round")
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
	add := rlwe.NewSecretKey(params)
	if err := cmb.GenAdditiveShare(active, own, c.tsk, add); err != nil {
		return nil, c.abort(err)
	}
	defer zero(add.Value.Q.Coeffs)
	cks, err := mhe.NewKeySwitchProtocol(params, r.s.smudge)
	if err != nil {
		return nil, c.abort(err)
	}
	zeroKey := rlwe.NewSecretKey(params)
	out := &DecryptShare{Round: r.p.Round, From: c.site, Attempt: req.Attempt, Shares: make([][]byte, r.cts)}
	for k, b := range req.C1 {
		c1, err := r.unmarshalPoly("ciphertext to decrypt", b)
		if err != nil {
			return nil, c.abort(err)
		}
		ct := r.ciphertext(r.s.params.RingQ().NewPoly(), c1)
		sh := cks.AllocateShare(params.MaxLevel())
		cks.GenShare(add, zeroKey, ct, &sh)
		params.RingQ().Reduce(sh.Value, sh.Value) // GenShare reduces lazily: send canonical residues
		if out.Shares[k], err = sh.Value.MarshalBinary(); err != nil {
			return nil, c.abort(err)
		}
	}
	c.opened = dg
	c.answered[req.Attempt] = true
	return out, nil
}

func signPK(id ed25519.PrivateKey, session []byte, from string, share []byte) []byte {
	return signBytes(id, pkSignedBytes(session, from, share))
}
