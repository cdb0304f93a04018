package secagg

import (
	"crypto/ecdh"
	"crypto/rand"
	"fmt"
	"slices"
	"testing"

	"github.com/scellis/scellis/diag"
)

// The consistency round against a server that deviates. These tests play
// the server themselves: they drive honest Clients with survivor sets and
// unmask requests a hostile aggregator could send, and look at everything
// the clients reveal — the server's whole view of the unmasking.

// roundTo runs a round of params p up to and including masked input, with
// the clients in drop stopping after the step given; it returns the
// harness and the server's (honest) survivor set.
func roundTo(t *testing.T, p Params, drop map[string]step) (*harness, *UnmaskRequest) {
	t.Helper()
	h, err := newHarness(t, p)
	if err != nil {
		t.Fatal(err)
	}
	for id, s := range drop {
		h.stop[id] = s
	}
	if !h.advertise() || !h.share() || !h.mask() {
		t.Fatalf("round refused before unmasking:\n%s", h.out.String())
	}
	set, err := h.server.EndMask()
	if err != nil {
		t.Fatal(err)
	}
	return h, set
}

// without returns set with v moved from the survivors to the dropped.
func without(set *UnmaskRequest, v string) *UnmaskRequest {
	return &UnmaskRequest{Round: set.Round,
		Survivors: slices.DeleteFunc(slices.Clone(set.Survivors), func(s string) bool { return s == v }),
		Dropped:   append(slices.Clone(set.Dropped), v)}
}

// signed returns set with the given signatures.
func signed(set *UnmaskRequest, sigs ...Signature) *UnmaskRequest {
	return &UnmaskRequest{Round: set.Round, Survivors: set.Survivors, Dropped: set.Dropped, Signatures: sigs}
}

// sign has each client of ids sign set, as an honest client does.
func sign(t *testing.T, h *harness, set *UnmaskRequest, ids ...string) map[string]Signature {
	t.Helper()
	out := map[string]Signature{}
	for _, id := range ids {
		sig, err := h.clients[id].SignSurvivors(set)
		if err != nil {
			t.Fatalf("%s refused to sign %v: %v", id, set.Survivors, err)
		}
		out[id] = Signature{Of: id, Sig: sig.Sig}
	}
	return out
}

// corruptSign is a corrupt site's signature: the server holds its
// identity key and signs whatever set it likes with it.
func corruptSign(h *harness, id string, set *UnmaskRequest) Signature {
	r := h.clients[id].r
	return Signature{Of: id, Sig: signSurvivors(identity(id), survivorStatement(r, set.Survivors, set.Dropped))}
}

// view is what the server learns in unmasking: every share revealed, by
// owner and secret.
type view struct {
	r     *round
	seeds map[string]map[string][]byte // owner → holder → share of b_owner
	keys  map[string]map[string][]byte // owner → holder → share of s_owner^SK
}

func newView(r *round) *view {
	return &view{r: r, seeds: map[string]map[string][]byte{}, keys: map[string]map[string][]byte{}}
}

func (v *view) add(holder string, u *Unmasking) {
	put := func(into map[string]map[string][]byte, s Share) {
		if into[s.Of] == nil {
			into[s.Of] = map[string][]byte{}
		}
		into[s.Of][holder] = s.Value
	}
	for _, s := range u.Seeds {
		put(v.seeds, s)
	}
	for _, s := range u.Keys {
		put(v.keys, s)
	}
}

// both returns the sites of which the server holds enough shares of both
// secrets to rebuild them: each would have its input exposed.
func (v *view) both() []string {
	var out []string
	for _, id := range v.r.ids {
		if len(v.seeds[id]) >= v.r.st && len(v.keys[id]) >= v.r.st {
			out = append(out, id)
		}
	}
	return out
}

// rebuild interpolates a secret from the shares the server holds.
func (v *view) rebuild(t *testing.T, shares map[string][]byte, owner string) []byte {
	t.Helper()
	var xs []byte
	var ys [][]byte
	for _, h := range sortedKeys(shares) {
		xs, ys = append(xs, v.r.holderX[owner][h]), append(ys, shares[h])
	}
	s, err := shamirCombine(xs, ys)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestEquivocationCaught: the server shows c1 and c3 a survivor set in
// which c2 dropped out (they would reveal shares of c2's mask key) and
// c2, c4, c5 the true one (they reveal shares of c2's self-mask seed).
// With no corrupt site it cannot show c1 or c3 three signatures over
// their set: with a signature made over the other set c1 refuses (SC6018),
// with only the two it has c3 refuses (SC6004). The others' set is
// consistent, so they unmask. The server ends with no share of c2's mask
// key, so with neither secret of any site in full.
func TestEquivocationCaught(t *testing.T) {
	h, set := roundTo(t, testParams("r1", 5, 3, 2, 1), nil)
	fake := without(set, "c2")
	onFake := sign(t, h, fake, "c1", "c3")
	onTrue := sign(t, h, set, "c2", "c4", "c5")
	v := newView(h.clients["c1"].r)

	u, err := h.clients["c1"].Unmask(signed(fake, onFake["c1"], onFake["c3"], Signature{Of: "c4", Sig: onTrue["c4"].Sig}))
	wantCode(t, err, diag.SecAggEquivocation)
	if u != nil {
		t.Fatal("c1 revealed shares on a forged proof")
	}
	_, err = h.clients["c1"].Unmask(signed(fake, onFake["c1"], onFake["c3"]))
	wantCode(t, err, diag.SecAggAborted)
	u, err = h.clients["c3"].Unmask(signed(fake, onFake["c1"], onFake["c3"]))
	wantCode(t, err, diag.SecAggBelowThreshold)
	if u != nil {
		t.Fatal("c3 revealed shares with two signatures of three")
	}
	for _, id := range []string{"c2", "c4", "c5"} {
		u, err := h.clients[id].Unmask(signed(set, onTrue["c2"], onTrue["c4"], onTrue["c5"]))
		if err != nil {
			t.Fatalf("%s refused a consistent request: %v", id, err)
		}
		v.add(id, u)
	}
	if len(v.keys["c2"]) != 0 {
		t.Errorf("the server holds %d shares of c2's mask key", len(v.keys["c2"]))
	}
	if b := v.both(); len(b) != 0 {
		t.Errorf("the server can rebuild both secrets of %v", b)
	}
}

// TestConsistencyBound shows the bound docs/secagg.md states: the check
// protects every honest site while fewer than 2t − n sites collude with
// the server. With n = 5 and t = 3, one corrupt site (c5, whose identity
// key the server holds) signs both sets, so each set has three signatures:
// c1 and c3 reveal shares of c2's mask key, c2 and c4 of its seed, c5
// hands over its own, and the server rebuilds both secrets of c2 — its
// input is exposed. With t = 4 the same attack finds three signatures of
// four and every site refuses.
func TestConsistencyBound(t *testing.T) {
	for _, c := range []struct {
		thr    int
		breaks bool
	}{{3, true}, {4, false}} {
		t.Run(fmt.Sprintf("t=%d", c.thr), func(t *testing.T) {
			h, set := roundTo(t, testParams("r1", 5, c.thr, 2, 1), nil)
			fake := without(set, "c2")
			onFake := sign(t, h, fake, "c1", "c3")
			onTrue := sign(t, h, set, "c2", "c4")
			r := h.clients["c1"].r
			v := newView(r)
			// The corrupt site's shares of c2's secrets, as it holds them.
			v.add("c5", &Unmasking{Seeds: []Share{{Of: "c2", Value: h.clients["c5"].held["c2"].seed}}})
			v.add("c5", &Unmasking{Keys: []Share{{Of: "c2", Value: h.clients["c5"].held["c2"].key}}})
			var refused int
			for id, req := range map[string]*UnmaskRequest{
				"c1": signed(fake, onFake["c1"], onFake["c3"], corruptSign(h, "c5", fake)),
				"c3": signed(fake, onFake["c1"], onFake["c3"], corruptSign(h, "c5", fake)),
				"c2": signed(set, onTrue["c2"], onTrue["c4"], corruptSign(h, "c5", set)),
				"c4": signed(set, onTrue["c2"], onTrue["c4"], corruptSign(h, "c5", set)),
			} {
				u, err := h.clients[id].Unmask(req)
				if err != nil {
					wantCode(t, err, diag.SecAggBelowThreshold)
					refused++
					continue
				}
				v.add(id, u)
			}
			if !c.breaks {
				if refused != 4 || len(v.both()) != 0 {
					t.Fatalf("t=%d: %d of 4 sites refused; the server can rebuild both secrets of %v", c.thr, refused, v.both())
				}
				return
			}
			if got := v.both(); !slices.Equal(got, []string{"c2"}) {
				t.Fatalf("with one colluder at t = %d the attack should expose c2; the server holds both secrets of %v", c.thr, got)
			}
			seed := v.rebuild(t, v.seeds["c2"], "c2")
			if !equalSecret(seedCommit(r.session, "c2", seed), h.server.commits["c2"]) {
				t.Fatal("the rebuilt seed of c2 does not match its commitment")
			}
			sk, err := ecdh.X25519().NewPrivateKey(v.rebuild(t, v.keys["c2"], "c2"))
			if err != nil || !equalSecret(sk.PublicKey().Bytes(), h.server.adverts.byID["c2"].MaskKey) {
				t.Fatal("the rebuilt mask key of c2 does not match its advert")
			}
		})
	}
}

// TestUnmaskRequestRefusals: the unmask requests a hostile server could
// send after an honest consistency round (c5 dropped before masking, so
// it is named dropped), under pairwise masking and SecAgg+; the target
// client refuses each before revealing anything and stays aborted.
func TestUnmaskRequestRefusals(t *testing.T) {
	pairwise := testParams("r1", 5, 3, 2, 1)
	plus := testParams("r1", 10, 0, 2, 1)
	plus.Protocol = SecAggPlus
	for _, p := range []Params{pairwise, plus} {
		n := len(p.Members)
		dropped := fmt.Sprintf("c%d", n)
		proto, k, _, err := p.Degree()
		if err != nil || (proto == SecAggPlus && k >= n-1) {
			t.Fatalf("%s: degree %d of %d sites (%v): want a sparse graph", proto, k, n, err)
		}
		// The same round under another ID: its signatures are replays here.
		other := p
		other.Round = "r2"
		h2, set2 := roundTo(t, other, map[string]step{dropped: stepShare})
		replayed := sign(t, h2, set2, set2.Survivors...)
		// nb is a neighbour of c1 that signs: c1 relies on its signature.
		// (Each round draws its own graph: nb is c1's in the round h runs.)
		nbOf := func(h *harness) string {
			for _, v := range h.clients["c1"].r.nbrs["c1"] {
				if v != dropped {
					return v
				}
			}
			t.Fatal("c1 has no neighbour that signs")
			return ""
		}

		cases := []struct {
			name string
			edit func(h *harness, set, req *UnmaskRequest) *UnmaskRequest
			code diag.Code
		}{
			{"forged signature", func(h *harness, _, req *UnmaskRequest) *UnmaskRequest {
				nb := nbOf(h)
				out := signed(req, slices.Clone(req.Signatures)...)
				forged := make([]byte, 64)
				rand.Read(forged)
				for i, s := range out.Signatures {
					if s.Of == nb {
						out.Signatures[i] = Signature{Of: nb, Sig: forged}
					}
				}
				return out
			}, diag.SecAggEquivocation},
			{"signature of another round", func(h *harness, _, req *UnmaskRequest) *UnmaskRequest {
				nb := nbOf(h)
				out := signed(req, slices.Clone(req.Signatures)...)
				for i, s := range out.Signatures {
					if s.Of == nb {
						out.Signatures[i] = replayed[nb]
					}
				}
				return out
			}, diag.SecAggEquivocation},
			{"signer outside the survivors", func(h *harness, set, req *UnmaskRequest) *UnmaskRequest {
				return signed(req, append(slices.Clone(req.Signatures), corruptSign(h, dropped, set))...)
			}, diag.SecAggEquivocation},
			{"signer listed twice", func(_ *harness, _, req *UnmaskRequest) *UnmaskRequest {
				return signed(req, append(slices.Clone(req.Signatures), req.Signatures[1])...)
			}, diag.SecAggEquivocation},
			{"another set", func(_ *harness, set, req *UnmaskRequest) *UnmaskRequest {
				return signed(without(set, "c2"), req.Signatures...)
			}, diag.SecAggEquivocation},
			{"own signature left out", func(_ *harness, _, req *UnmaskRequest) *UnmaskRequest {
				return signed(req, slices.DeleteFunc(slices.Clone(req.Signatures), func(s Signature) bool { return s.Of == "c1" })...)
			}, diag.SecAggEquivocation},
			{"fewer signatures than the threshold", func(h *harness, _, req *UnmaskRequest) *UnmaskRequest {
				// Drop signers of c1's own holders (pairwise: every site)
				// until one fewer than the sharing threshold is left.
				r := h.clients["c1"].r
				keep := slices.Clone(req.Signatures)
				holders := func() int {
					return countSigners(r, "c1", func(id string) bool {
						return slices.ContainsFunc(keep, func(s Signature) bool { return s.Of == id })
					})
				}
				for holders() >= r.st {
					i := slices.IndexFunc(keep, func(s Signature) bool { _, holder := r.holderX["c1"][s.Of]; return holder && s.Of != "c1" })
					keep = slices.Delete(keep, i, i+1)
				}
				return signed(req, keep...)
			}, diag.SecAggBelowThreshold},
		}
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/%s", proto, c.name), func(t *testing.T) {
				h, set := roundTo(t, p, map[string]step{dropped: stepShare})
				req, err := consistency(h.server, h.clients, set)
				if err != nil {
					t.Fatal(err)
				}
				u, err := h.clients["c1"].Unmask(c.edit(h, set, req))
				wantCode(t, err, c.code)
				if u != nil {
					t.Fatal("revealed shares on a bad proof")
				}
				_, err = h.clients["c1"].Unmask(req)
				wantCode(t, err, diag.SecAggAborted)
				// The honest request, with the survivors listed in
				// another order, is answered by every other signer.
				shuffled := signed(req, req.Signatures...)
				shuffled.Survivors = slices.Clone(req.Survivors)
				slices.Reverse(shuffled.Survivors)
				if _, err := h.clients["c2"].Unmask(shuffled); err != nil {
					t.Fatalf("c2 refused the honest request: %v", err)
				}
			})
		}
	}
}

// TestServerRefusesForeignSignature: an honest server checks each survivor
// signature on arrival — one made over another set, or by a site that is
// not a survivor, is refused and the site is not counted among the
// signers; with too few signers it ends the round before anyone unmasks.
func TestServerRefusesForeignSignature(t *testing.T) {
	h, set := roundTo(t, testParams("r1", 6, 4, 2, 1), map[string]step{"c6": stepShare})
	fake := without(set, "c2")
	onFake := sign(t, h, fake, "c1")
	wantCode(t, h.server.AddSignature(&SurvivorSig{Round: "r1", From: "c1", Sig: onFake["c1"].Sig}), diag.SecAggEquivocation)
	wantCode(t, h.server.AddSignature(&SurvivorSig{Round: "r1", From: "c6", Sig: corruptSign(h, "c6", set).Sig}), diag.SecAggUnknownSite)
	for id, sg := range sign(t, h, set, "c2", "c3", "c4") {
		if err := h.server.AddSignature(&SurvivorSig{Round: "r1", From: id, Sig: sg.Sig}); err != nil {
			t.Fatal(err)
		}
	}
	if m := h.server.Missing(); !slices.Equal(m, []string{"c1", "c5"}) {
		t.Fatalf("server waits for the signatures of %v, want c1 c5", m)
	}
	_, err := h.server.EndConsistency()
	wantCode(t, err, diag.SecAggBelowThreshold)
}
