package secagg

import (
	"crypto/sha256"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
)

// sparseRound advertises every client of a 12-site SecAgg+ round on a
// sparse graph, each with the graph nonce nonce(id), and ends advertising.
func sparseRound(t *testing.T, round string, nonce func(id string) []byte) (*harness, *KeySet) {
	t.Helper()
	p := testParams(round, 12, 0, 2, 1)
	p.Protocol = SecAggPlus
	h, err := newHarness(t, p)
	if err != nil {
		t.Fatal(err)
	}
	if !h.server.r.revealed() {
		t.Fatalf("a 12-site SecAgg+ round of degree %d: no sparse graph to draw", h.server.r.k)
	}
	for _, id := range h.ids {
		h.clients[id].testGraphNonce = nonce(id)
	}
	if !h.advertise() {
		t.Fatal(h.out.String())
	}
	ks, err := h.server.EndAdvertise()
	if err != nil {
		t.Fatal(err)
	}
	return h, ks
}

func fixedNonce(id string) []byte {
	n := sha256.Sum256([]byte("nonce " + id))
	return n[:]
}

// The aggregator cannot choose a SecAgg+ round's graph (issue 34): the
// graph is drawn from every advertised site's randomness, committed in
// its advert before the aggregator fixes the key set and revealed only
// after. The same round ID and members with one site's randomness changed
// give another graph, so picking a round ID no longer picks the graph;
// server and clients draw the same one; a reveal that does not open its
// commitment, a missing reveal, and a reveal set with one nonce swapped
// or one site left out are refused (SC6021); a client refuses to share
// keys under another key set than the one it revealed for.
func TestAggregatorCannotChooseTheGraph(t *testing.T) {
	draw := func(nonce func(string) []byte) (*harness, map[string][]string) {
		h, ks := sparseRound(t, "g", nonce)
		if err := revealAll(h.server, h.clients, h.ids, ks); err != nil {
			t.Fatal(err)
		}
		for _, id := range h.ids {
			if !slices.Equal(h.clients[id].r.nbrs[id], h.server.r.nbrs[id]) {
				t.Fatalf("%s draws neighbours %v, the server %v", id, h.clients[id].r.nbrs[id], h.server.r.nbrs[id])
			}
		}
		return h, h.server.r.nbrs
	}
	_, g1 := draw(fixedNonce)
	_, again := draw(fixedNonce)
	_, g2 := draw(func(id string) []byte {
		if id == "c7" {
			return fixedNonce("another " + id)
		}
		return fixedNonce(id)
	})
	same := func(a, b map[string][]string) bool {
		for id := range a {
			if !slices.Equal(a[id], b[id]) {
				return false
			}
		}
		return true
	}
	if !same(g1, again) {
		t.Fatal("the same reveals drew two graphs")
	}
	if same(g1, g2) {
		t.Fatal("one site's randomness changed and the graph did not: it does not depend on every site")
	}

	// The server refuses a reveal that does not open its commitment.
	h, ks := sparseRound(t, "g", fixedNonce)
	rv, err := h.clients["c1"].Reveal(ks)
	if err != nil {
		t.Fatal(err)
	}
	forged := *rv
	forged.Nonce = fixedNonce("chosen by the aggregator")
	wantCode(t, h.server.AddReveal(&forged), diag.SecAggGraphReveal)
	if err := h.server.AddReveal(rv); err != nil {
		t.Fatal(err)
	}
	// A site that advertised and did not reveal ends the round: leaving it
	// out would let the server choose among graphs.
	_, err = h.server.EndReveal()
	wantCode(t, err, diag.SecAggGraphReveal)

	// A client refuses a reveal set with a nonce the server swapped, or
	// with a site left out.
	for name, edit := range map[string]func(rs *GraphRevealSet){
		"swapped nonce": func(rs *GraphRevealSet) { rs.Reveals[3].Nonce = fixedNonce("chosen") },
		"site left out": func(rs *GraphRevealSet) { rs.Reveals = slices.Delete(rs.Reveals, 3, 4) },
	} {
		h, ks := sparseRound(t, "g", fixedNonce)
		rs := &GraphRevealSet{Round: "g"}
		for _, id := range h.ids {
			rv, err := h.clients[id].Reveal(ks)
			if err != nil {
				t.Fatal(err)
			}
			rs.Reveals = append(rs.Reveals, *rv)
		}
		slices.SortFunc(rs.Reveals, func(a, b GraphReveal) int { return strings.Compare(a.From, b.From) })
		edit(rs)
		err := h.clients["c1"].DrawGraph(rs)
		if err == nil {
			t.Fatalf("%s: c1 drew a graph", name)
		}
		wantCode(t, err, diag.SecAggGraphReveal)
	}

	// A client shares keys only under the key set it revealed for.
	h, ks = sparseRound(t, "g", fixedNonce)
	if err := revealAll(h.server, h.clients, h.ids, ks); err != nil {
		t.Fatal(err)
	}
	other := &KeySet{Round: ks.Round, Adverts: slices.Clone(ks.Adverts[:len(ks.Adverts)-1])}
	_, err = h.clients["c1"].ShareKeys(other)
	wantCode(t, err, diag.SecAggGraphReveal)

	// An advert without a commitment is refused in such a round.
	p := testParams("g3", 12, 0, 2, 1)
	p.Protocol = SecAggPlus
	s, err := NewServer(p)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(p, "c1", identity("c1"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Advertise()
	if err != nil {
		t.Fatal(err)
	}
	a.GraphCommit = nil
	a.Sig = signAdvert(identity("c1"), a)
	wantCode(t, s.AddAdvert(a), diag.SecAggMalformed)
}
