package secagg

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// The graph's randomness (issue 34). A SecAgg+ round on a sparse graph
// draws its Harary graph from a seed no party chooses alone, by commit and
// reveal:
//
//	client → server   Advert         carries GraphCommit = H(session, client, nonce)
//	server → clients  KeySet         fixes U1 and every commitment
//	client → server   GraphReveal    the nonce (Client.Reveal)
//	server → clients  GraphRevealSet every U1 site's nonce (Server.EndReveal)
//
// The seed is H(session, every U1 site's ID and nonce, sorted by ID); every
// client checks each nonce against the commitment of the key set it was
// sent, and that no U1 site is missing (Client.DrawGraph). The aggregator
// fixes U1 and every commitment before it learns any nonce, and each honest
// site's nonce is fresh from crypto/rand, so it cannot predict the graph of
// a round ID it picks, nor steer it by choosing which adverts to keep; a
// forged commitment binds it as much as a real one. What is left to it is
// to end a round whose graph it dislikes (a missing reveal ends the round,
// since dropping a site at this point would let it choose) and open
// another: each try costs a failed round every site sees.
//
// A pairwise round, and a SecAgg+ round too small for a sparse graph, mask
// every pair: there is no graph to draw, and no reveal. The sub-cohorts of
// a hierarchical round (Params.Parent) still draw theirs from the session
// digest: the parent, which opens their sums, sees no reveal.

const labelGraphCommit = "scellis/secagg/v3/graph-commit"
const labelGraphSeed = "scellis/secagg/v3/graph-seed"

// graphNonceSize is the bytes of a site's graph randomness.
const graphNonceSize = 32

// GraphReveal opens a client's graph commitment (Advert.GraphCommit).
type GraphReveal struct {
	Round string `cbor:"round"`
	From  string `cbor:"from"`
	Nonce []byte `cbor:"nonce"`
}

// GraphRevealSet is the server's relay of every U1 site's reveal, sorted by
// site.
type GraphRevealSet struct {
	Round   string        `cbor:"round"`
	Reveals []GraphReveal `cbor:"reveals"`
}

func (m *GraphReveal) validate() error {
	const k = "graph reveal"
	if err := checkRoundID(k, m.Round); err != nil {
		return err
	}
	if err := checkID(k, "client", m.From); err != nil {
		return err
	}
	return checkLen(k, "nonce", m.Nonce, graphNonceSize)
}

func (m *GraphRevealSet) validate() error {
	const k = "graph reveal set"
	if err := checkRoundID(k, m.Round); err != nil {
		return err
	}
	if len(m.Reveals) > MaxSitesPlus {
		return malformed(k, "%d reveals, at most %d", len(m.Reveals), MaxSitesPlus)
	}
	for i := range m.Reveals {
		if err := m.Reveals[i].validate(); err != nil {
			return err
		}
		if i > 0 && m.Reveals[i].From <= m.Reveals[i-1].From {
			return malformed(k, "reveals not sorted by site, or one site twice (%q)", m.Reveals[i].From)
		}
	}
	return nil
}

func (m *GraphRevealSet) roundName() string { return m.Round }

// Marshal returns the canonical encoding of the reveal.
func (m *GraphReveal) Marshal() ([]byte, error) { return content.Encode(m) }

// Marshal returns the canonical encoding of the reveal set.
func (m *GraphRevealSet) Marshal() ([]byte, error) { return content.Encode(m) }

// ParseGraphReveal parses the canonical encoding of a GraphReveal.
func ParseGraphReveal(b []byte) (*GraphReveal, error) {
	return parse("graph reveal", b, new(GraphReveal))
}

// ParseGraphRevealSet parses the canonical encoding of a GraphRevealSet.
func ParseGraphRevealSet(b []byte) (*GraphRevealSet, error) {
	return parse("graph reveal set", b, new(GraphRevealSet))
}

// graphCommit is the commitment to client's nonce in the round of session.
func graphCommit(session []byte, client string, nonce []byte) []byte {
	sum := sha256.Sum256(mustEncode([]any{labelGraphCommit, session, client, nonce}))
	return sum[:]
}

// graphSeed is the seed of the round's graph: every U1 site's nonce,
// sorted by site (reveals are).
func graphSeed(session []byte, reveals []GraphReveal) []byte {
	parts := []any{labelGraphSeed, session}
	for _, r := range reveals {
		parts = append(parts, r.From, r.Nonce)
	}
	sum := sha256.Sum256(mustEncode(parts))
	return sum[:]
}

// revealed reports whether the round draws its graph by commit and reveal.
func (r *round) revealed() bool { return r.sparse() && r.p.Parent == nil }

// sparse reports whether the round masks over a sparse graph.
func (r *round) sparse() bool { return r.k < r.n-1 }

// newGraphNonce draws a site's graph randomness.
func newGraphNonce() ([]byte, error) {
	b := make([]byte, graphNonceSize)
	_, err := rand.Read(b)
	return b, err
}

// checkReveals checks rs against the commitments of u1 (by site): one
// reveal per U1 site, no other, each opening its site's commitment.
func checkReveals(r *round, subject string, u1 map[string]*Advert, reveals []GraphReveal) error {
	bad := func(format string, args ...any) error {
		return diag.New(diag.SecAggGraphReveal, subject, format, args...).
			WithHelp("the graph is drawn from the randomness of every site that advertised; the round ends without a sum — run it again under a new round ID")
	}
	if len(reveals) != len(u1) {
		return bad("%d reveals for the %d sites that advertised", len(reveals), len(u1))
	}
	for _, rv := range reveals {
		a := u1[rv.From]
		if a == nil {
			return bad("a reveal from %q, which did not advertise", rv.From)
		}
		if rv.Round != r.id {
			return bad("the reveal of %q is of round %q", rv.From, rv.Round)
		}
		if !bytes.Equal(graphCommit(r.session, rv.From, rv.Nonce), a.GraphCommit) {
			return bad("the reveal of %q does not open its commitment", rv.From)
		}
	}
	return nil
}

// Reveals reports whether the client's round has a reveal phase: call
// Reveal and DrawGraph between the key set and ShareKeys.
func (c *Client) Reveals() bool { return c.r.revealed() }

// Reveal handles the key set in a round with a reveal phase: it checks the
// set as ShareKeys would what it can before the graph is drawn (shape,
// membership, this client's own advert and every site's commitment), keeps
// it, and returns this client's nonce.
func (c *Client) Reveal(ks *KeySet) (*GraphReveal, error) {
	if err := receive(c, "key set", clientAdvertised, ks); err != nil {
		return nil, err
	}
	set := newAdvertSet()
	for i := range ks.Adverts {
		a := &ks.Adverts[i]
		if err := set.add(c.r, c.subject(), a, a.Client == c.id); err != nil {
			return nil, c.fail(err)
		}
		if len(a.GraphCommit) != sha256.Size {
			return nil, c.fail(malformed("key set", "advert of %q carries no graph commitment", a.Client))
		}
	}
	mine := set.byID[c.id]
	if mine == nil || !bytes.Equal(mine.GraphCommit, graphCommit(c.r.session, c.id, c.graphNonce)) {
		return nil, c.fail(diag.New(diag.SecAggUnknownSite, c.subject(), "key set does not hold this client's advert").
			WithHelp("the server must relay every advert it accepted, this client's included"))
	}
	if err := c.r.checkFloor("key sharing", len(set.byID)); err != nil {
		return nil, c.fail(err)
	}
	c.committed = set.byID
	c.state = clientRevealed
	return &GraphReveal{Round: c.r.id, From: c.id, Nonce: slices.Clone(c.graphNonce)}, nil
}

// DrawGraph draws the round's graph from the reveal set, after checking
// that it holds one reveal for every site of the key set, each opening its
// commitment, this client's own included.
func (c *Client) DrawGraph(rs *GraphRevealSet) error {
	if rs == nil {
		return malformed("graph reveal set", "no message")
	}
	if err := c.enter("graph reveal set", clientRevealed, rs.Round); err != nil {
		return err
	}
	if err := rs.validate(); err != nil {
		return c.fail(err)
	}
	if err := checkReveals(c.r, c.subject(), c.committed, rs.Reveals); err != nil {
		return c.fail(err)
	}
	c.r.drawGraph(graphSeed(c.r.session, rs.Reveals))
	c.state = clientDrawn
	return nil
}

// sameKeySet reports whether ks names the sites and commitments the client
// revealed for.
func (c *Client) sameKeySet(ks *KeySet) bool {
	if len(ks.Adverts) != len(c.committed) {
		return false
	}
	for i := range ks.Adverts {
		a := c.committed[ks.Adverts[i].Client]
		if a == nil || !bytes.Equal(a.GraphCommit, ks.Adverts[i].GraphCommit) {
			return false
		}
	}
	return true
}

// AddReveal accepts a client's graph randomness: a site of U1, once, whose
// nonce opens the commitment of its advert.
func (s *Server) AddReveal(m *GraphReveal) error {
	if m == nil {
		return malformed("graph reveal", "no message")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.admit("graph reveal", PhaseReveal, m.Round, m.validate, m.From, func(id string) bool { return s.adverts.byID[id] != nil }, func(id string) bool { return s.reveals[id] != nil }); err != nil {
		return err
	}
	if !bytes.Equal(graphCommit(s.r.session, m.From, m.Nonce), s.adverts.byID[m.From].GraphCommit) {
		return diag.New(diag.SecAggGraphReveal, s.subject(), "the reveal of %q does not open its commitment", m.From).
			WithHelp("the site's reveal was altered or made for another advert; drop it")
	}
	c := *m
	s.reveals[m.From] = &c
	return nil
}

// EndReveal closes the reveal phase: every site of U1 must have revealed
// (a site left out would let the server choose the graph), and the graph
// is drawn. It returns the reveal set to relay to every client of U1.
func (s *Server) EndReveal() (*GraphRevealSet, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("end of the reveal phase", PhaseReveal, s.r.id); err != nil {
		return nil, err
	}
	rs := &GraphRevealSet{Round: s.r.id}
	for _, id := range sortedKeys(s.adverts.byID) {
		rv := s.reveals[id]
		if rv == nil {
			return nil, s.fail(diag.New(diag.SecAggGraphReveal, s.subject(), "%q advertised but did not reveal its graph randomness", id).
				WithHelp("the graph is drawn from the randomness of every site that advertised; the round ends without a sum — run it again under a new round ID"))
		}
		rs.Reveals = append(rs.Reveals, *rv)
	}
	s.r.drawGraph(graphSeed(s.r.session, rs.Reveals))
	s.phase = PhaseShare
	s.shares = map[string]*Shares{}
	return rs, nil
}
