package secagg

import (
	"crypto/ed25519"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
)

// Tests for every refusal the protocol makes. Each checks the diagnostic
// code, so a refusal for the wrong reason fails.

func wantCode(t *testing.T, err error, code diag.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want refusal %s (%s)", code, diag.Title(code))
	}
	if got := codeOf(err); got != code {
		t.Fatalf("refused with %v; want %s (%s)", err, code, diag.Title(code))
	}
}

// roundAt runs a round of n clients (threshold t, dim d) up to and
// including step last.
func roundAt(t *testing.T, n, thr, d int, last step) *harness {
	t.Helper()
	h, err := newHarness(t, testParams("r1", n, thr, d, 10))
	if err != nil {
		t.Fatal(err)
	}
	steps := []func() bool{h.advertise, h.share, h.mask, h.unmask}
	for s := stepAdvertise; s <= last; s++ {
		if !steps[s-1]() {
			t.Fatalf("step %s refused:\n%s", s, h.out.String())
		}
	}
	return h
}

func TestRefuseFewerThanThreeSites(t *testing.T) {
	for _, n := range []int{0, 1, 2} {
		p := testParams("r1", n, 0, 4, 1)
		_, err := NewServer(p)
		wantCode(t, err, diag.SecAggTooFewSites)
		if n > 0 {
			_, err = NewClient(p, "c1", identity("c1"))
			wantCode(t, err, diag.SecAggTooFewSites)
		}
	}
	// Three members, one of them never advertises: the server ends the
	// round at the key set, and a client also refuses a key set of two.
	h := roundAt(t, 3, 0, 2, stepStart)
	for _, id := range []string{"c1", "c2"} {
		a, _ := h.clients[id].Advertise()
		if err := h.server.AddAdvert(a); err != nil {
			t.Fatal(err)
		}
	}
	_, err := h.server.EndAdvertise()
	wantCode(t, err, diag.SecAggTooFewSites)
	if h.server.Phase() != PhaseFailed {
		t.Fatalf("phase %v after refusal, want failed", h.server.Phase())
	}
	// Every later call returns the same refusal.
	_, err = h.server.EndShare()
	wantCode(t, err, diag.SecAggTooFewSites)

	h = roundAt(t, 3, 0, 2, stepAdvertise)
	ks, _ := h.server.EndAdvertise()
	ks.Adverts = ks.Adverts[:2]
	_, err = h.clients["c1"].ShareKeys(ks)
	wantCode(t, err, diag.SecAggTooFewSites)
}

func TestRefuseBadThreshold(t *testing.T) {
	for _, c := range []struct{ n, t int }{{4, 2}, {4, 5}, {5, 2}, {6, 3}, {3, -1}} {
		_, err := NewServer(testParams("r1", c.n, c.t, 4, 1))
		wantCode(t, err, diag.SecAggBadThreshold)
	}
	for _, c := range []struct{ n, t int }{{3, 2}, {4, 3}, {5, 3}, {6, 4}, {6, 6}} {
		if _, err := NewServer(testParams("r1", c.n, c.t, 4, 1)); err != nil {
			t.Errorf("n=%d t=%d refused: %v", c.n, c.t, err)
		}
	}
}

func TestRefuseFewerSurvivorsThanThreshold(t *testing.T) {
	// Server side: 6 of 7 share, 4 send inputs, threshold 5.
	h := roundAt(t, 7, 5, 2, stepShare)
	dels, err := h.server.EndShare()
	if err != nil {
		t.Fatal(err)
	}
	if err := maskAll(h.server, h.clients, dels[:4], func(id string) []float64 { return h.inputs[id] }); err != nil {
		t.Fatal(err)
	}
	_, err = h.server.EndMask()
	wantCode(t, err, diag.SecAggBelowThreshold)

	// Client side: an unmask request naming fewer survivors than t.
	h = roundAt(t, 7, 5, 2, stepMask)
	req, err := h.server.EndMask()
	if err != nil {
		t.Fatal(err)
	}
	bad := &UnmaskRequest{Round: req.Round, Survivors: req.Survivors[:4], Dropped: append(slices.Clone(req.Dropped), req.Survivors[4:]...)}
	_, err = h.clients["c1"].SignSurvivors(bad)
	wantCode(t, err, diag.SecAggBelowThreshold)

	// Too few unmaskings: Finish refuses, with no sum.
	h = roundAt(t, 5, 4, 2, stepMask)
	req, _ = h.server.EndMask()
	if req, err = consistency(h.server, h.clients, req); err != nil {
		t.Fatal(err)
	}
	if err := unmaskAll(h.server, h.clients, req.Survivors[:3], req, nil); err != nil {
		t.Fatal(err)
	}
	finishRefused(t, h.server, diag.SecAggBelowThreshold)
}

func TestRefuseBothSecretsOfOnePeer(t *testing.T) {
	h := roundAt(t, 5, 3, 2, stepMask)
	req, err := h.server.EndMask()
	if err != nil {
		t.Fatal(err)
	}
	// c2 named survivor and dropped: the client must not reveal its seed
	// and its mask key.
	evil := &UnmaskRequest{Round: req.Round, Survivors: req.Survivors, Dropped: []string{"c2"}}
	sig, err := h.clients["c1"].SignSurvivors(evil)
	wantCode(t, err, diag.SecAggBothSecrets)
	if sig != nil {
		t.Fatal("client signed a request for both secrets")
	}
	// Aborted for good: even an honest request is refused now.
	_, err = h.clients["c1"].SignSurvivors(req)
	wantCode(t, err, diag.SecAggAborted)

	// Both secrets asked in two requests: the client answers one only.
	for _, id := range req.Survivors[1:] {
		sig, err := h.clients[id].SignSurvivors(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.server.AddSignature(sig); err != nil {
			t.Fatal(err)
		}
	}
	if req, err = h.server.EndConsistency(); err != nil {
		t.Fatal(err)
	}
	u, err := h.clients["c3"].Unmask(req)
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Seeds) != 5 || len(u.Keys) != 0 {
		t.Fatalf("answer holds %d seed and %d key shares", len(u.Seeds), len(u.Keys))
	}
	second := &UnmaskRequest{Round: req.Round, Survivors: []string{"c1", "c3", "c4", "c5"}, Dropped: []string{"c2"}}
	_, err = h.clients["c3"].SignSurvivors(second)
	wantCode(t, err, diag.SecAggOutOfOrder)
	_, err = h.clients["c3"].Unmask(second)
	wantCode(t, err, diag.SecAggOutOfOrder)
}

func TestRefuseBadSignature(t *testing.T) {
	h := roundAt(t, 4, 0, 2, stepStart)
	a, _ := h.clients["c1"].Advertise()

	flipped := *a
	flipped.Sig = slices.Clone(a.Sig)
	flipped.Sig[10] ^= 0x40
	wantCode(t, h.server.AddAdvert(&flipped), diag.SecAggBadSignature)

	unsigned := *a
	unsigned.Sig = nil
	wantCode(t, h.server.AddAdvert(&unsigned), diag.SecAggBadSignature)

	// Signed by the right key but without the advert purpose (pure
	// Ed25519, as before domain separation): refused.
	plain := *a
	plain.Sig = ed25519.Sign(identity("c1"), a.signedBytes())
	wantCode(t, h.server.AddAdvert(&plain), diag.SecAggBadSignature)

	// Signed by another member's identity.
	forged := *a
	forged.Sig = signAdvert(identity("c2"), &forged)
	wantCode(t, h.server.AddAdvert(&forged), diag.SecAggBadSignature)

	// A swapped key under the original signature.
	swapped := *a
	swapped.MaskKey = slices.Clone(a.EncKey)
	swapped.EncKey = slices.Clone(a.MaskKey)
	wantCode(t, h.server.AddAdvert(&swapped), diag.SecAggBadSignature)

	if err := h.server.AddAdvert(a); err != nil {
		t.Fatalf("genuine advert refused after forgeries: %v", err)
	}

	// Client side: a key set with a mis-signed advert aborts the client.
	h = roundAt(t, 4, 0, 2, stepAdvertise)
	ks, _ := h.server.EndAdvertise()
	ks.Adverts[2].Sig = slices.Clone(ks.Adverts[2].Sig)
	ks.Adverts[2].Sig[0] ^= 1
	_, err := h.clients["c1"].ShareKeys(ks)
	wantCode(t, err, diag.SecAggBadSignature)
	_, err = h.clients["c1"].ShareKeys(ks)
	wantCode(t, err, diag.SecAggAborted)
}

func TestRefuseDuplicates(t *testing.T) {
	h := roundAt(t, 4, 0, 2, stepAdvertise)
	a, _ := h.clients["c1"].Advertise() // a second Advertise is out of order
	if a != nil {
		t.Fatal("client advertised twice")
	}
	ks, _ := h.server.EndAdvertise()

	dup := &KeySet{Round: ks.Round, Adverts: append(slices.Clone(ks.Adverts), ks.Adverts[1])}
	_, err := h.clients["c1"].ShareKeys(dup)
	wantCode(t, err, diag.SecAggDuplicate)

	// The server refuses a second advert from one client.
	h2 := roundAt(t, 4, 0, 2, stepStart)
	a, _ = h2.clients["c1"].Advertise()
	if err := h2.server.AddAdvert(a); err != nil {
		t.Fatal(err)
	}
	wantCode(t, h2.server.AddAdvert(a), diag.SecAggDuplicate)

	// A second masked input from one client is refused, not added twice.
	h3 := roundAt(t, 4, 0, 2, stepShare)
	dels, _ := h3.server.EndShare()
	m, err := h3.clients[dels[0].To].MaskInput(dels[0], h3.inputs[dels[0].To], 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := h3.server.AddMaskedInput(m); err != nil {
		t.Fatal(err)
	}
	wantCode(t, h3.server.AddMaskedInput(m), diag.SecAggDuplicate)
}

func TestRefuseReusedKeys(t *testing.T) {
	// c2's advert carrying c1's public keys, properly signed by c2: a
	// replay of another client's keys.
	h := roundAt(t, 4, 0, 2, stepStart)
	a1, _ := h.clients["c1"].Advertise()
	a2, _ := h.clients["c2"].Advertise()
	if err := h.server.AddAdvert(a1); err != nil {
		t.Fatal(err)
	}
	a2.EncKey = slices.Clone(a1.EncKey)
	a2.Sig = signAdvert(identity("c2"), a2)
	wantCode(t, h.server.AddAdvert(a2), diag.SecAggDuplicate)
}

func TestRefuseReplayFromAnotherRound(t *testing.T) {
	old := roundAt(t, 4, 0, 3, stepMask)
	// The same members in round r2.
	h2, err := newHarness(t, testParams("r2", 4, 0, 3, 10))
	if err != nil {
		t.Fatal(err)
	}

	// An advert of round r1 fed to the server of r2.
	a, _ := h2.clients["c1"].Advertise()
	oldAdvert := old.ks.Adverts[0]
	wantCode(t, h2.server.AddAdvert(&oldAdvert), diag.SecAggWrongRound)
	// Relabelled as r2, it was made for other params…
	relabelled := oldAdvert
	relabelled.Round = "r2"
	wantCode(t, h2.server.AddAdvert(&relabelled), diag.SecAggParamsMismatch)
	// …and with the params digest swapped too, its signature breaks.
	relabelled.Params = slices.Clone(a.Params)
	wantCode(t, h2.server.AddAdvert(&relabelled), diag.SecAggBadSignature)

	// A key set of r1 sent to a client of r2.
	_, err = h2.clients["c1"].ShareKeys(old.ks)
	wantCode(t, err, diag.SecAggWrongRound)

	// A masked input and an unmask request of r1 in round r2.
	for _, id := range h2.ids[1:] {
		a, _ := h2.clients[id].Advertise()
		if err := h2.server.AddAdvert(a); err != nil {
			t.Fatal(err)
		}
	}
	if err := h2.server.AddAdvert(a); err != nil {
		t.Fatal(err)
	}
	h2.share()
	h2.mask()
	oldReq, _ := old.server.EndMask()
	req2, err := h2.server.EndMask()
	if err != nil {
		t.Fatal(err)
	}
	_, err = h2.clients["c1"].SignSurvivors(oldReq)
	wantCode(t, err, diag.SecAggWrongRound)
	// The replay did not abort the client: the round's own request works.
	if _, err := h2.clients["c1"].SignSurvivors(req2); err != nil {
		t.Fatalf("client refused its round's request after a replay: %v", err)
	}

	h3 := roundAt(t, 4, 0, 3, stepShare)
	h3.server.EndShare()
	m := &MaskedInput{Round: "r0", From: "c1", Masked: make([]byte, 24)}
	wantCode(t, h3.server.AddMaskedInput(m), diag.SecAggWrongRound)
}

func TestRefuseWrongLength(t *testing.T) {
	h := roundAt(t, 4, 0, 3, stepShare)
	dels, _ := h.server.EndShare()
	d := dels[0]
	c := h.clients[d.To]
	for _, x := range [][]float64{nil, {1, 2}, {1, 2, 3, 4}} {
		_, err := c.MaskInput(d, x, 0)
		wantCode(t, err, diag.SecAggWrongLength)
	}
	// A bad input does not abort: the right one goes through.
	m, err := c.MaskInput(d, []float64{1, 2, 3}, 0)
	if err != nil {
		t.Fatalf("good input after bad ones: %v", err)
	}
	short := &MaskedInput{Round: m.Round, From: m.From, Masked: m.Masked[:16]}
	wantCode(t, h.server.AddMaskedInput(short), diag.SecAggWrongLength)
	if err := h.server.AddMaskedInput(m); err != nil {
		t.Fatal(err)
	}
}

func TestRefuseOutOfRange(t *testing.T) {
	h := roundAt(t, 4, 0, 3, stepShare)
	dels, _ := h.server.EndShare()
	c := h.clients[dels[0].To]
	for _, x := range [][]float64{{10.001, 0, 0}, {0, -11, 0}, {0, 0, math.NaN()}, {math.Inf(1), 0, 0}} {
		_, err := c.MaskInput(dels[0], x, 0)
		wantCode(t, err, diag.SecAggOutOfRange)
	}
	_, err := c.MaskInput(dels[0], []float64{10, -10, 0}, 1)
	wantCode(t, err, diag.SecAggOutOfRange) // weight on an unweighted round
	if _, err := c.MaskInput(dels[0], []float64{10, -10, 0}, 0); err != nil {
		t.Fatalf("values at the clip bound refused: %v", err)
	}

	p := testParams("w", 4, 0, 1, 1)
	p.Weighted, p.MaxWeight = true, 100
	hw, err := newHarness(t, p)
	if err != nil {
		t.Fatal(err)
	}
	hw.advertise()
	hw.share()
	dels, _ = hw.server.EndShare()
	c = hw.clients[dels[0].To]
	for _, w := range []float64{-1, 100.5, math.NaN(), math.Inf(1)} {
		_, err := c.MaskInput(dels[0], []float64{0}, w)
		wantCode(t, err, diag.SecAggOutOfRange)
	}
}

func TestRefuseBadParams(t *testing.T) {
	base := func() Params { return testParams("r1", 4, 0, 4, 1) }
	cases := map[string]func(*Params){
		"no round":          func(p *Params) { p.Round = "" },
		"zero dim":          func(p *Params) { p.Dim = 0 },
		"huge dim":          func(p *Params) { p.Dim = MaxDim + 1 },
		"zero clip":         func(p *Params) { p.Clip = 0 },
		"nan clip":          func(p *Params) { p.Clip = math.NaN() },
		"inf clip":          func(p *Params) { p.Clip = math.Inf(1) },
		"clip overflows":    func(p *Params) { p.Clip = 0x1p61 },
		"weighted no max":   func(p *Params) { p.Weighted = true },
		"max unweighted":    func(p *Params) { p.MaxWeight = 5 },
		"unknown prg":       func(p *Params) { p.PRG = "rc4" },
		"duplicate member":  func(p *Params) { p.Members[1].ID = p.Members[0].ID },
		"short key":         func(p *Params) { p.Members[2].Key = p.Members[2].Key[:31] },
		"empty member ID":   func(p *Params) { p.Members[0].ID = "" },
		"too many pairwise": func(p *Params) { *p = testParams("r1", 256, 0, 4, 1); p.Protocol = Pairwise },
		"unknown protocol":  func(p *Params) { p.Protocol = "secagg++" },
		"invalid UTF-8 ID":  func(p *Params) { p.Members[0].ID = "\xff" },
		"over-long roundID": func(p *Params) { p.Round = string(make([]byte, 300)) },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			p := base()
			mutate(&p)
			_, err := NewServer(p)
			wantCode(t, err, diag.SecAggBadParams)
		})
	}
	// A client whose key is not the one the federation lists, or not a member.
	_, err := NewClient(base(), "c1", identity("c2"))
	wantCode(t, err, diag.SecAggBadParams)
	_, err = NewClient(base(), "c9", identity("c9"))
	wantCode(t, err, diag.SecAggUnknownSite)
}

func TestRefuseParamsMismatch(t *testing.T) {
	p := testParams("r1", 4, 0, 4, 1)
	other := p
	other.Dim = 5
	s, _ := NewServer(p)
	c, err := NewClient(other, "c1", identity("c1"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := c.Advertise()
	wantCode(t, s.AddAdvert(a), diag.SecAggParamsMismatch)
}

func TestRefuseTamperedBox(t *testing.T) {
	h := roundAt(t, 4, 0, 2, stepShare)
	dels, _ := h.server.EndShare()
	d := dels[0]
	d.Boxes[1].Sealed = slices.Clone(d.Boxes[1].Sealed)
	d.Boxes[1].Sealed[30] ^= 1
	_, err := h.clients[d.To].MaskInput(d, h.inputs[d.To], 0)
	wantCode(t, err, diag.SecAggDecrypt)

	// A box moved from its pair to another recipient does not open either.
	h = roundAt(t, 4, 0, 2, stepShare)
	dels, _ = h.server.EndShare()
	moved := dels[1].Boxes[0] // c1 → c2
	moved.To = dels[2].To     // relabelled c1 → c3
	d = dels[2]
	for i := range d.Boxes {
		if d.Boxes[i].From == moved.From {
			d.Boxes[i] = moved
		}
	}
	_, err = h.clients[d.To].MaskInput(d, h.inputs[d.To], 0)
	wantCode(t, err, diag.SecAggDecrypt)
}

func TestRefuseInconsistentShares(t *testing.T) {
	for _, kind := range []string{"seed", "key"} {
		h := roundAt(t, 5, 3, 2, stepShare)
		dels, _ := h.server.EndShare()
		// c5 drops after sharing.
		if err := maskAll(h.server, h.clients, dels[:4], func(id string) []float64 { return h.inputs[id] }); err != nil {
			t.Fatal(err)
		}
		req, _ := h.server.EndMask()
		req, err := consistency(h.server, h.clients, req)
		if err != nil {
			t.Fatal(err)
		}
		corrupt := func(i int, u *Unmasking) {
			if i == 0 {
				sh := u.Seeds
				if kind == "key" {
					sh = u.Keys
				}
				sh[0].Value[0] ^= 1
			}
		}
		if err := unmaskAll(h.server, h.clients, req.Survivors, req, corrupt); err != nil {
			t.Fatal(err)
		}
		finishRefused(t, h.server, diag.SecAggInconsistent)
	}
}

func TestRefuseOutOfOrder(t *testing.T) {
	h := roundAt(t, 4, 0, 2, stepStart)
	c := h.clients["c1"]
	_, err := c.MaskInput(&ShareDelivery{Round: "r1", To: "c1"}, []float64{0, 0}, 0)
	wantCode(t, err, diag.SecAggOutOfOrder)
	_, err = c.Unmask(&UnmaskRequest{Round: "r1"})
	wantCode(t, err, diag.SecAggOutOfOrder)
	_, err = h.server.EndMask()
	wantCode(t, err, diag.SecAggOutOfOrder)
	wantCode(t, h.server.AddMaskedInput(&MaskedInput{Round: "r1", From: "c1", Masked: make([]byte, 16)}), diag.SecAggOutOfOrder)
	// None of that aborted anything: the round runs.
	if !h.run() {
		t.Fatalf("round refused after out-of-order messages:\n%s", h.out.String())
	}
}

func TestRefuseUnknownSites(t *testing.T) {
	outsider := &Advert{Round: "r1", Client: "mallory", Params: make([]byte, 32), EncKey: make([]byte, 32), MaskKey: make([]byte, 32), Sig: make([]byte, 64)}
	h := roundAt(t, 4, 0, 2, stepStart)
	wantCode(t, h.server.AddAdvert(outsider), diag.SecAggUnknownSite)

	// A client that did not share is not taken at the masking step.
	h = roundAt(t, 5, 0, 2, stepAdvertise)
	h.stop["c5"] = stepAdvertise
	h.share()
	h.server.EndShare()
	wantCode(t, h.server.AddMaskedInput(&MaskedInput{Round: "r1", From: "c5", Masked: make([]byte, 16)}), diag.SecAggUnknownSite)

	// An unmask request that names a site outside U2, or leaves one out.
	h = roundAt(t, 5, 0, 2, stepMask)
	req, _ := h.server.EndMask()
	_, err := h.clients["c1"].SignSurvivors(&UnmaskRequest{Round: "r1", Survivors: req.Survivors, Dropped: []string{"c9"}})
	wantCode(t, err, diag.SecAggUnknownSite)
	_, err = h.clients["c2"].SignSurvivors(&UnmaskRequest{Round: "r1", Survivors: req.Survivors[:4]})
	wantCode(t, err, diag.SecAggUnknownSite)
	// Named dropped although it sent its input.
	_, err = h.clients["c3"].SignSurvivors(&UnmaskRequest{Round: "r1", Survivors: []string{"c1", "c2", "c4", "c5"}, Dropped: []string{"c3"}})
	wantCode(t, err, diag.SecAggUnknownSite)
}

// A client whose site requires at least k survivors (its min_cohort)
// refuses to unmask a sum of fewer, even when the round's threshold allows
// it; EffectiveThreshold tells the site the threshold before it joins.
func TestRefuseFewerSurvivorsThanRequired(t *testing.T) {
	if tt, err := testParams("r1", 7, 0, 2, 1).EffectiveThreshold(); err != nil || tt != 4 {
		t.Fatalf("default threshold of 7 sites: %d %v, want 4", tt, err)
	}
	h := roundAt(t, 7, 4, 2, stepMask)
	req, err := h.server.EndMask()
	if err != nil {
		t.Fatal(err)
	}
	// Five survive: enough for t = 4, not for a site that requires 6.
	five := &UnmaskRequest{Round: req.Round, Survivors: req.Survivors[:5], Dropped: append(slices.Clone(req.Dropped), req.Survivors[5:]...)}
	c := h.clients[five.Survivors[0]]
	c.RequireSurvivors(6)
	_, err = c.SignSurvivors(five)
	wantCode(t, err, diag.SecAggBelowThreshold)
	if !strings.Contains(err.Error(), "at least 6 (its min_cohort)") {
		t.Fatalf("refusal does not name the site's floor: %v", err)
	}
	// A site that requires five answers the same request.
	c = h.clients[five.Survivors[1]]
	c.RequireSurvivors(5)
	if _, err := c.SignSurvivors(five); err != nil {
		t.Fatalf("five survivors refused by a site requiring five: %v", err)
	}
}

// In a SecAgg+ round a site shares only with its neighbours: the server
// refuses shares that leave one out or add a box to a site off the
// graph, and a client aborts on a delivery holding a box from a site
// that is not its neighbour.
func TestRefuseBoxesOffTheGraph(t *testing.T) {
	p := testParams("plus", 12, 0, 2, 1)
	p.Protocol = SecAggPlus
	h, err := newHarness(t, p)
	if err != nil {
		t.Fatal(err)
	}
	if !h.advertise() {
		t.Fatal(h.out.String())
	}
	ks, err := h.server.EndAdvertise()
	if err != nil {
		t.Fatal(err)
	}
	if err := revealAll(h.server, h.clients, h.ids, ks); err != nil {
		t.Fatal(err)
	}
	r := h.server.r
	var far string // a site that is not c1's neighbour
	for _, id := range h.ids {
		if id != "c1" && !r.neighbour("c1", id) {
			far = id
			break
		}
	}
	if far == "" || len(r.nbrs["c1"]) != r.k {
		t.Fatalf("c1 has neighbours %v of %d sites: no sparse graph", r.nbrs["c1"], r.n)
	}
	sh, err := h.clients["c1"].ShareKeys(ks)
	if err != nil {
		t.Fatal(err)
	}
	if len(sh.Boxes) != r.k {
		t.Fatalf("c1 sent %d boxes, want one per neighbour (%d)", len(sh.Boxes), r.k)
	}
	extra := *sh
	extra.Boxes = append(slices.Clone(sh.Boxes), Box{From: "c1", To: far, Sealed: sh.Boxes[0].Sealed})
	wantCode(t, h.server.AddShares(&extra), diag.SecAggMalformed)
	short := *sh
	short.Boxes = sh.Boxes[1:]
	wantCode(t, h.server.AddShares(&short), diag.SecAggMalformed)
	swapped := *sh // as many boxes as owed, one of them off the graph
	swapped.Boxes = append([]Box{{From: "c1", To: far, Sealed: sh.Boxes[0].Sealed}}, sh.Boxes[1:]...)
	wantCode(t, h.server.AddShares(&swapped), diag.SecAggMalformed)
	if err := h.server.AddShares(sh); err != nil {
		t.Fatal(err)
	}
	// The far site's box, relayed to c1 as if it were a neighbour's.
	fsh, err := h.clients[far].ShareKeys(ks)
	if err != nil {
		t.Fatal(err)
	}
	d := &ShareDelivery{Round: p.Round, To: "c1", Boxes: []Box{{From: far, To: "c1", Sealed: fsh.Boxes[0].Sealed}}}
	_, err = h.clients["c1"].MaskInput(d, h.inputs["c1"], 0)
	wantCode(t, err, diag.SecAggUnknownSite)
}
