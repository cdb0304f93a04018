package he

import (
	"fmt"
	"slices"
	"sync"

	"github.com/tuneinsight/lattigo/v5/core/rlwe"
	"github.com/tuneinsight/lattigo/v5/he/heint"
	"github.com/tuneinsight/lattigo/v5/mhe"
	"github.com/tuneinsight/lattigo/v5/ring"

	"github.com/scellis/scellis/diag"
)

// Phase is where a round stands on the aggregator.
type Phase int

// The phases, in order.
const (
	PhaseAdvertise Phase = iota // collecting adverts (U1)
	PhaseShare                  // collecting sealed key shares (U2)
	PhaseEncrypt                // collecting ciphertexts (U3), summed on arrival
	PhaseDecrypt                // collecting partial decryptions from t sites
	PhaseDone
	PhaseFailed
)

var phaseNames = [...]string{"advertise", "share", "encrypt", "decrypt", "done", "failed"}

func (p Phase) String() string { return phaseNames[p] }

// Aggregator is the reducer peer's side of a threshold-he round: it relays
// adverts and sealed key shares, adds ciphertexts as they arrive, and
// combines t partial decryptions of the sum. It holds no key material. It
// is safe for concurrent use (one mutex).
type Aggregator struct {
	mu    sync.Mutex
	r     *round
	phase Phase
	err   error

	adverts map[string]*Advert
	u1      []string
	shares  map[string]*Shares
	u2      []string
	acc     []ring.Poly // the running sum of the c0, one per ciphertext
	u3      []string    // who sent a ciphertext, in arrival order until EndEncrypt sorts it

	req     *DecryptRequest
	got     map[string][]mhe.KeySwitchShare
	failed  map[string]bool // decryptors that did not answer an attempt
	attempt int
}

// NewAggregator returns the aggregator of round p.
func NewAggregator(p Params) (*Aggregator, error) {
	r, err := newRound(p)
	if err != nil {
		return nil, err
	}
	return &Aggregator{r: r, adverts: map[string]*Advert{}, shares: map[string]*Shares{}, failed: map[string]bool{}}, nil
}

// Phase returns the current phase.
func (a *Aggregator) Phase() Phase {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.phase
}

// Missing lists the sites the current phase still waits for.
func (a *Aggregator) Missing() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var want []string
	has := func(string) bool { return false }
	switch a.phase {
	case PhaseAdvertise:
		want = a.r.ids
		has = func(s string) bool { return a.adverts[s] != nil }
	case PhaseShare:
		want = a.u1
		has = func(s string) bool { return a.shares[s] != nil }
	case PhaseEncrypt:
		want = a.u2
		has = func(s string) bool { return slices.Contains(a.u3, s) }
	case PhaseDecrypt:
		want = a.req.Decryptors
		has = func(s string) bool { return a.got[s] != nil }
	}
	var out []string
	for _, s := range want {
		if !has(s) {
			out = append(out, s)
		}
	}
	return out
}

func (a *Aggregator) expect(ph Phase, what string) error {
	if a.phase == PhaseFailed {
		return a.err
	}
	if a.phase != ph {
		return diag.New(diag.SecAggOutOfOrder, a.r.subject(), "%s during the %s phase", what, a.phase).
			WithHelp("the site is late or early; it counts as dropped out of this phase")
	}
	return nil
}

func (a *Aggregator) fail(err error) error {
	a.phase, a.err = PhaseFailed, err
	a.acc, a.shares, a.got = nil, nil, nil
	return err
}

func (a *Aggregator) floor(phase string, have int) error {
	if have < MinSites {
		return a.fail(diag.New(diag.SecAggTooFewSites, a.r.subject(), "%d sites left at %s; a round needs at least %d", have, phase, MinSites).
			WithHelp("run the round again when more sites are up"))
	}
	if have < a.r.t {
		return a.fail(diag.New(diag.SecAggBelowThreshold, a.r.subject(), "%d sites left at %s; decryption needs t = %d", have, phase, a.r.t).
			WithHelp("too many sites dropped out to decrypt the sum; the round ended without a result — run it again"))
	}
	return nil
}

// closing checks that the phase ph, called name, can end: it is the
// current phase and have sites took part in it (floor).
func (a *Aggregator) closing(ph Phase, name string, have int) error {
	if err := a.expect(ph, "end of "+name); err != nil {
		return err
	}
	return a.floor(name, have)
}

func dup(r *round, what, site string) error {
	return diag.New(diag.SecAggDuplicate, r.subject(), "a second %s from %q", what, site).WithHelp("each site sends each message once")
}

// AddAdvert takes one site's advert.
func (a *Aggregator) AddAdvert(m *Advert) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.expect(PhaseAdvertise, "an advert"); err != nil {
		return err
	}
	if err := a.r.checkAdvert(m); err != nil {
		return err
	}
	if a.adverts[m.Site] != nil {
		return dup(a.r, "advert", m.Site)
	}
	for s, o := range a.adverts {
		if string(o.BoxKey) == string(m.BoxKey) {
			return diag.New(diag.SecAggDuplicate, a.r.subject(), "%q advertises the box key of %q", m.Site, s)
		}
	}
	a.adverts[m.Site] = m
	return nil
}

// EndAdvertise closes advertising and returns the key set U1.
func (a *Aggregator) EndAdvertise() (*KeySet, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.closing(PhaseAdvertise, "advertising", len(a.adverts)); err != nil {
		return nil, err
	}
	ks := &KeySet{Round: a.r.p.Round}
	for _, s := range a.r.ids {
		if m := a.adverts[s]; m != nil {
			a.u1 = append(a.u1, s)
			ks.Adverts = append(ks.Adverts, *m)
		}
	}
	a.phase = PhaseShare
	return ks, nil
}

// AddShares takes one site's sealed key shares.
func (a *Aggregator) AddShares(m *Shares) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.expect(PhaseShare, "shares"); err != nil {
		return err
	}
	r := a.r
	if err := r.checkRound(m.Round); err != nil {
		return err
	}
	if !slices.Contains(a.u1, m.From) {
		return diag.New(diag.SecAggUnknownSite, r.subject(), "shares from %q, which did not advertise", m.From)
	}
	if a.shares[m.From] != nil {
		return dup(r, "shares", m.From)
	}
	to := map[string]bool{}
	for _, b := range m.Boxes {
		if b.To == m.From || !slices.Contains(a.u1, b.To) || to[b.To] || len(b.Sealed) != r.sealedSize() {
			return malformed("shares", "from %q: a box to %q that is not one sealed share to another site of U1", m.From, b.To)
		}
		to[b.To] = true
	}
	if len(to) != len(a.u1)-1 {
		return malformed("shares", "from %q: %d boxes for %d other sites", m.From, len(to), len(a.u1)-1)
	}
	a.shares[m.From] = m
	return nil
}

// EndShare closes key sharing (U2: the sites whose shares arrived) and
// returns one delivery per site of U2.
func (a *Aggregator) EndShare() ([]*Delivery, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.closing(PhaseShare, "key sharing", len(a.shares)); err != nil {
		return nil, err
	}
	for _, s := range a.u1 {
		if a.shares[s] != nil {
			a.u2 = append(a.u2, s)
		}
	}
	out := make([]*Delivery, 0, len(a.u2))
	for _, v := range a.u2 {
		d := &Delivery{Round: a.r.p.Round, To: v}
		for _, u := range a.u2 {
			m := a.shares[u]
			e := Dealt{From: u}
			for _, b := range m.Boxes {
				if b.To == v {
					e.Box = b.Sealed
				}
			}
			d.From = append(d.From, e)
		}
		out = append(out, d)
	}
	a.shares = nil
	a.acc = make([]ring.Poly, a.r.cts)
	a.phase = PhaseEncrypt
	return out, nil
}

// AddCiphertext adds one site's encrypted input into the running sum; the
// ciphertext itself is not kept.
func (a *Aggregator) AddCiphertext(m *Ciphertext) error {
	r := a.r
	if err := r.checkRound(m.Round); err != nil {
		return err
	}
	if len(m.C0) != r.cts {
		return malformed("ciphertext", "from %q: %d ciphertexts, want %d", m.From, len(m.C0), r.cts)
	}
	// Decode outside the lock: it is the expensive part.
	cts := make([]ring.Poly, r.cts)
	for k, b := range m.C0 {
		c0, err := r.unmarshalPoly("ciphertext", b)
		if err != nil {
			return err
		}
		cts[k] = c0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.expect(PhaseEncrypt, "a ciphertext"); err != nil {
		return err
	}
	if !slices.Contains(a.u2, m.From) {
		return diag.New(diag.SecAggUnknownSite, r.subject(), "a ciphertext from %q, which did not share keys", m.From)
	}
	if slices.Contains(a.u3, m.From) {
		return dup(r, "ciphertext", m.From)
	}
	rq := r.s.params.RingQ()
	for k, c0 := range cts {
		if a.acc[k].Coeffs == nil {
			a.acc[k] = c0
			continue
		}
		rq.Add(a.acc[k], c0, a.acc[k])
	}
	a.u3 = append(a.u3, m.From)
	return nil
}

// EndEncrypt closes input collection (U3) and returns the first decrypt
// request: t decryptors among U3.
func (a *Aggregator) EndEncrypt() (*DecryptRequest, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.closing(PhaseEncrypt, "input collection", len(a.u3)); err != nil {
		return nil, err
	}
	slices.Sort(a.u3)
	a.phase = PhaseDecrypt
	return a.newRequest()
}

// newRequest names t decryptors among the contributors that have not
// failed an attempt, those that answered the last attempt first.
func (a *Aggregator) newRequest() (*DecryptRequest, error) {
	var pick []string
	if a.req != nil {
		for _, s := range a.req.Decryptors {
			if a.got[s] != nil {
				pick = append(pick, s)
			}
		}
	}
	for _, s := range a.u3 {
		if len(pick) < a.r.t && !a.failed[s] && !slices.Contains(pick, s) {
			pick = append(pick, s)
		}
	}
	if len(pick) < a.r.t {
		return nil, a.fail(diag.New(diag.SecAggBelowThreshold, a.r.subject(), "%d contributors can still decrypt; t = %d are needed (no answer from %v)",
			len(pick), a.r.t, a.failedList()).
			WithHelp("too many sites dropped out after encrypting; the round ended without a result — run it again"))
	}
	slices.Sort(pick)
	req := &DecryptRequest{Round: a.r.p.Round, Attempt: a.attempt, Contributors: slices.Clone(a.u3), Decryptors: pick}
	a.req, a.got = req, map[string][]mhe.KeySwitchShare{}
	return req, nil
}

func (a *Aggregator) failedList() []string {
	var out []string
	for s := range a.failed {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// AddDecryptShare takes one decryptor's partial decryption.
func (a *Aggregator) AddDecryptShare(m *DecryptShare) error {
	r := a.r
	if err := r.checkRound(m.Round); err != nil {
		return err
	}
	if len(m.Shares) != r.cts {
		return malformed("decrypt share", "from %q: %d shares, want %d", m.From, len(m.Shares), r.cts)
	}
	shares := make([]mhe.KeySwitchShare, r.cts)
	for k, b := range m.Shares {
		p, err := r.unmarshalShare(b)
		if err != nil {
			return err
		}
		shares[k] = mhe.KeySwitchShare{Value: p}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.expect(PhaseDecrypt, "a partial decryption"); err != nil {
		return err
	}
	if m.Attempt != a.req.Attempt {
		return diag.New(diag.SecAggOutOfOrder, r.subject(), "a partial decryption of attempt %d from %q during attempt %d", m.Attempt, m.From, a.req.Attempt).
			WithHelp("the site answered too late; a new attempt was started without it")
	}
	if !slices.Contains(a.req.Decryptors, m.From) {
		return diag.New(diag.SecAggUnknownSite, r.subject(), "a partial decryption from %q, not a decryptor of attempt %d", m.From, m.Attempt)
	}
	if a.got[m.From] != nil {
		return dup(r, "partial decryption", m.From)
	}
	a.got[m.From] = shares
	return nil
}

// EndDecrypt closes a decryption attempt. With every decryptor's answer it
// combines them and returns the sum. Otherwise the decryptors that did
// not answer are set aside and a new request follows, naming t other
// contributors; when fewer than t remain, the round fails (SC6004).
func (a *Aggregator) EndDecrypt() (*Result, *DecryptRequest, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.expect(PhaseDecrypt, "end of decryption"); err != nil {
		return nil, nil, err
	}
	if len(a.got) < len(a.req.Decryptors) {
		for _, s := range a.req.Decryptors {
			if a.got[s] == nil {
				a.failed[s] = true
			}
		}
		a.attempt++
		req, err := a.newRequest()
		return nil, req, err
	}
	res, err := a.combine()
	if err != nil {
		return nil, nil, a.fail(err)
	}
	a.phase = PhaseDone
	a.acc, a.got = nil, nil
	return res, nil, nil
}

func (a *Aggregator) combine() (*Result, error) {
	r := a.r
	params := r.s.params
	cks, err := mhe.NewKeySwitchProtocol(params, r.s.smudge)
	if err != nil {
		return nil, err
	}
	dec := rlwe.NewDecryptor(params, rlwe.NewSecretKey(params)) // the zero key: the shares switched the sum to it
	ecd := heint.NewEncoder(params)
	pt := r.newPlaintext()
	vals := make([]int64, r.s.slots)
	sum := make([]int64, r.p.Dim)
	for k, a1 := range r.uniform() {
		ct := r.ciphertext(a.acc[k], a1)
		agg := cks.AllocateShare(params.MaxLevel())
		for _, s := range a.req.Decryptors {
			if err := cks.AggregateShares(agg, a.got[s][k], &agg); err != nil {
				return nil, err
			}
		}
		out := r.newCiphertext()
		cks.KeySwitch(ct, agg, out)
		dec.Decrypt(out, pt)
		pt.IsBatched = false
		if err := ecd.Decode(pt, vals); err != nil {
			return nil, err
		}
		if err := r.unpack(sum, vals, k); err != nil {
			return nil, err
		}
	}
	res := &Result{Round: r.p.Round, Sum: sum, Contributors: slices.Clone(a.u3), Decryptors: slices.Clone(a.req.Decryptors)}
	for _, s := range a.u2 {
		if !slices.Contains(a.u3, s) {
			res.Dropped = append(res.Dropped, s)
		}
	}
	return res, nil
}

// String describes the aggregator's phase, for logs.
func (a *Aggregator) String() string {
	return fmt.Sprintf("%s: %s", a.r.subject(), a.Phase())
}
