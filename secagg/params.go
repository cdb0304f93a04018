package secagg

import (
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/scellis/scellis/diag"
)

// Member is one site allowed in a round: its client ID and its long-term
// Ed25519 identity public key (from the federation file).
type Member struct {
	ID  string            `cbor:"id"`
	Key ed25519.PublicKey `cbor:"key"`
}

// Params are the round's public parameters. Every client and the server of
// a round must hold equal Params; their digest is bound into every signature,
// key derivation and encryption of the round, so a site with different
// Params cannot take part by accident.
type Params struct {
	// Round names the round (for example a content.Ref of the round spec).
	// It travels in every message; messages of another round are refused.
	Round string `cbor:"round"`
	// Members lists the sites allowed to take part (at least 3, at most
	// 255), each with its Ed25519 identity key. Order does not matter.
	Members []Member `cbor:"members"`
	// Threshold t is how many sites must survive to the end: a client's
	// secrets are Shamir-shared t-of-n. Zero means ⌊n/2⌋+1, the least
	// valid threshold (see ActiveThreshold for the one rounds use); an
	// explicit value must exceed n/2 and be at most n.
	Threshold int `cbor:"threshold"`
	// Dim is the length of each input vector.
	Dim int `cbor:"dim"`
	// Clip bounds every input value: |x_i| ≤ Clip, else the input is
	// refused (clipping is the caller's job, under DP).
	Clip float64 `cbor:"clip"`
	// Weighted appends each site's weight as one more coordinate, so the
	// result carries the total weight (for weighted means, pass w·x and w).
	Weighted bool `cbor:"weighted"`
	// MaxWeight bounds a weight: 0 ≤ w ≤ MaxWeight. Required when Weighted.
	MaxWeight float64 `cbor:"max_weight"`
	// PRG is the mask keystream; empty means AESCTR. Coordinators pick it
	// with DefaultPRG.
	PRG PRG `cbor:"prg"`
	// GridBits, when > 0, fixes the fraction bits f of the values' grid
	// instead of deriving the largest that fits: sites that put their
	// input on the grid themselves (MaskEncoded: differential-privacy
	// noise added on the integers) need a grid coarse enough for their
	// noise, chosen before the round (dp.GridFracBits). It must still
	// satisfy n·(Clip·2^f + 1) ≤ 2^62.
	GridBits int `cbor:"grid_bits,omitempty"`
	// Protocol is how inputs are masked: Pairwise (every pair of sites)
	// or SecAggPlus (k = O(log n) neighbours on a random Harary graph).
	// Empty means DefaultProtocol(len(Members)).
	Protocol Protocol `cbor:"protocol,omitempty"`
	// Parent, when set, makes the round a sub-cohort of a hierarchical
	// round (docs/secagg.md, "Hierarchical secure aggregation"): the
	// 32-byte X25519 public key of the parent aggregator. Sites seal their
	// unmasking shares to it, so the host running this round (the child)
	// only relays: it forwards the masked sum (Server.Relay) and cannot
	// open it. The key must reach the sites by the same path as the rest
	// of the params (the parent's plan), never from the child.
	Parent []byte `cbor:"parent,omitempty"`
	// Sites, when > 0, is the number of sites the round's sum belongs
	// to when that is more than its own members: the total over every
	// sub-cohort of a hierarchical round. The grid (when GridBits is 0),
	// the weight's grid and the ring are then derived for Sites sites
	// instead of len(Members), so every sub-cohort has one layout, their
	// masked sums add as ring words and the total provably fits: the
	// parent decodes only the total (docs/secagg.md, "The outer mask").
	// It must be at least len(Members).
	Sites int `cbor:"sites,omitempty"`
}

// ActiveThreshold returns ⌊2n/3⌋+1 (at most n), the pairwise threshold
// that keeps a round private against an aggregator that equivocates about
// dropouts while colluding with fewer than n/3 sites: the consistency round
// stops a coalition of fewer than 2t − n sites, and 2t − n > n/3 here
// (Bonawitz et al. 2017, the active-adversary setting). Scellis rounds use
// it by default and silos require it (policy secagg_threshold). A zero
// Params.Threshold still means the least valid threshold, ⌊n/2⌋+1, which
// stops an aggregator acting alone only.
func ActiveThreshold(n int) int { return min(n, 2*n/3+1) }

// DefaultPlusAbove is the cohort size above which DefaultProtocol picks
// SecAggPlus: see docs/secagg.md, "SecAgg+", for the trade-off.
const DefaultPlusAbove = 100

// DefaultProtocol returns the protocol a round of n sites runs when its
// Params leave Protocol empty: Pairwise up to DefaultPlusAbove sites,
// SecAggPlus above (and always above MaxSites, where pairwise cannot run).
func DefaultProtocol(n int) Protocol {
	if n > DefaultPlusAbove {
		return SecAggPlus
	}
	return Pairwise
}

// Limits on parameters and identifiers.
const (
	MinSites    = 3       // a round needs at least three sites besides the aggregator
	MaxSites    = 255     // pairwise: Shamir over GF(2^8) has 255 non-zero x coordinates
	MaxDim      = 1 << 27 // 1 GiB of masked input per site
	MaxIDLength = 128     // bytes in a client ID
	maxRoundLen = 256     // bytes in a round ID
	// maxSitesTotal bounds Params.Sites: a hierarchical round's sites
	// over all its sub-cohorts.
	maxSitesTotal = 1 << 24
)

// round is the validated, derived form of Params that clients and the
// server work from.
type round struct {
	p         Params
	id        string
	n, t      int
	dim       int     // ring coordinates: Dim, plus one when Weighted
	fracBits  int     // f for the values
	wFracBits int     // f for the weight coordinate
	scale     float64 // 2^fracBits
	wScale    float64 // 2^wFracBits
	prg       PRG     // resolved keystream
	session   []byte  // SHA-256 of the canonical encoding of the params
	members   map[string]ed25519.PublicKey
	xs        map[string]byte // Shamir x coordinate of each member: 1 + rank by ID
	ids       []string        // member IDs, sorted
	floor     int             // max(MinSites, t): survivors needed at every phase
	errBound1 float64         // per-site fixed-point rounding bound on a value
	encBound  int64           // ⌊Clip·2^f⌋: the bound on an encoded value
	ringBits  int             // 32 or 64: the ring of the value coordinates
	lay       layout          // the vector's bytes, in the ring and on the wire

	proto Protocol
	// k is the degree of the masking graph (n−1 for pairwise) and st the
	// Shamir threshold of a site's secrets among its holders (t for
	// pairwise; SecAgg+'s neighbourhood threshold).
	k, st int
	// nbrs are every member's neighbours on the masking graph, sorted
	// (every other member for pairwise).
	nbrs map[string][]string
	// holderX is the Shamir x coordinate of each holder of each owner's
	// shares: 1 + rank in the sorted owner-and-neighbours list (for
	// pairwise, 1 + rank among all members, for every owner).
	holderX map[string]map[string]byte
}

// paramsWire is what the session digest covers: the params plus what is
// derived from them, so two sites that derive differently disagree loudly.
type paramsWire struct {
	Domain    string   `cbor:"domain"`
	Round     string   `cbor:"round"`
	Members   []Member `cbor:"members"`
	Threshold int      `cbor:"threshold"`
	Dim       int      `cbor:"dim"`
	Clip      float64  `cbor:"clip"`
	Weighted  bool     `cbor:"weighted"`
	MaxWeight float64  `cbor:"max_weight"`
	FracBits  int      `cbor:"frac_bits"`
	WFracBits int      `cbor:"weight_frac_bits"`
	PRG       PRG      `cbor:"prg"`
	RingBits  int      `cbor:"ring_bits"`
	Protocol  Protocol `cbor:"protocol"`
	Degree    int      `cbor:"degree"`
	ShareT    int      `cbor:"share_threshold"`
	Parent    []byte   `cbor:"parent,omitempty"`
	Sites     int      `cbor:"sites,omitempty"`
}

func validID(s string) bool {
	return s != "" && len(s) <= MaxIDLength && utf8.ValidString(s)
}

// newRound validates p and derives everything a party needs.
func newRound(p Params) (*round, error) {
	bad := func(format string, args ...any) *diag.Diagnostic {
		return diag.New(diag.SecAggBadParams, "secure aggregation round "+fmt.Sprintf("%q", p.Round), format, args...)
	}
	if p.Round == "" || len(p.Round) > maxRoundLen || !utf8.ValidString(p.Round) {
		return nil, bad("round ID must be 1 to %d bytes of UTF-8", maxRoundLen).WithHelp("name the round, for example by the ref of its spec")
	}
	subject := "secure aggregation round " + fmt.Sprintf("%q", p.Round)
	n := len(p.Members)
	if n < MinSites {
		return nil, diag.New(diag.SecAggTooFewSites, subject, "%d member sites; secure aggregation needs at least %d", n, MinSites).
			WithHelp("with two sites each could subtract its own update from the sum and learn the other's; add sites or do not aggregate")
	}
	proto := p.Protocol
	if proto == "" {
		proto = DefaultProtocol(n)
	}
	if !proto.valid() {
		return nil, bad("unknown protocol %q", string(p.Protocol)).WithHelp("use %q or %q", string(Pairwise), string(SecAggPlus))
	}
	if limit := map[Protocol]int{Pairwise: MaxSites, SecAggPlus: MaxSitesPlus}[proto]; n > limit {
		return nil, bad("%d member sites; %s supports at most %d", n, proto, limit).WithHelp("split the federation into cohorts of at most %d, or use %s (up to %d)", limit, SecAggPlus, MaxSitesPlus)
	}
	r := &round{p: p, id: p.Round, n: n, proto: proto, members: make(map[string]ed25519.PublicKey, n), xs: make(map[string]byte, n)}
	for _, m := range p.Members {
		if !validID(m.ID) {
			return nil, bad("member ID %q must be 1 to %d bytes of UTF-8", m.ID, MaxIDLength)
		}
		if len(m.Key) != ed25519.PublicKeySize {
			return nil, bad("member %q has a %d-byte identity key, want %d", m.ID, len(m.Key), ed25519.PublicKeySize)
		}
		if _, dup := r.members[m.ID]; dup {
			return nil, bad("member %q listed twice", m.ID).WithHelp("list each site once")
		}
		r.members[m.ID] = m.Key
		r.ids = append(r.ids, m.ID)
	}
	slices.Sort(r.ids)
	for i, id := range r.ids {
		r.xs[id] = byte(i + 1) // pairwise only: n ≤ MaxSites
	}
	r.t = p.Threshold
	if r.t == 0 {
		r.t = n/2 + 1
	}
	if 2*r.t <= n || r.t > n {
		return nil, diag.New(diag.SecAggBadThreshold, subject, "threshold %d with %d sites; it must exceed n/2 and be at most n", r.t, n).
			WithHelp("use a threshold between %d and %d, or 0 for the default %d", n/2+1, n, n/2+1)
	}
	r.floor = max(MinSites, r.t)
	r.k, r.st = n-1, r.t
	if proto == SecAggPlus {
		k, st, ok := graphParams(n, PlusCorruptRate, PlusDropoutRate)
		if !ok {
			if n > MaxSites {
				return nil, bad("no SecAgg+ graph of %d sites meets the failure bounds", n).WithHelp("use fewer sites")
			}
			// Too few sites for a sparser graph to be safe: every
			// pair masks, as pairwise, with the round's threshold.
			k, st = n-1, r.t
		}
		r.k, r.st = k, st
	}
	if p.Dim < 1 || p.Dim > MaxDim {
		return nil, bad("dimension %d; want 1 to %d", p.Dim, MaxDim)
	}
	r.dim = p.Dim
	// sites is how many encodings the grid and the ring must hold: the
	// round's own, or the hierarchical round's total (Params.Sites).
	sites := n
	if p.Sites != 0 {
		if p.Sites < n || p.Sites > maxSitesTotal {
			return nil, bad("sites %d with %d members: want 0 (the members) or %d to %d", p.Sites, n, n, maxSitesTotal).
				WithHelp("set Sites to the number of sites of the whole hierarchical round")
		}
		sites = p.Sites
	}
	var ok bool
	if r.fracBits, ok = fracBitsFor(p.Clip, sites); !ok {
		return nil, bad("clip %v: want a finite positive bound with %d·clip below 2^62", p.Clip, sites).WithHelp("clip updates to a smaller range before aggregating")
	}
	if p.GridBits < 0 || p.GridBits > r.fracBits {
		return nil, bad("grid bits %d: want 0 (derived) or 1 to %d, so that %d·(clip·2^f + 1) stays below 2^62", p.GridBits, r.fracBits, sites).
			WithHelp("choose a coarser grid or a smaller clip")
	} else if p.GridBits > 0 {
		r.fracBits = p.GridBits
	}
	r.encBound = int64(math.Floor(math.Ldexp(p.Clip, r.fracBits)))
	if p.Weighted {
		if r.wFracBits, ok = fracBitsFor(p.MaxWeight, sites); !ok {
			return nil, bad("max weight %v: want a finite positive bound with %d·max weight below 2^62", p.MaxWeight, sites)
		}
		r.dim++
	} else if p.MaxWeight != 0 {
		return nil, bad("max weight %v set on an unweighted round", p.MaxWeight).WithHelp("set weighted, or leave max weight at 0")
	}
	r.ringBits = ringBitsFor(sites, r.encBound)
	r.lay = layout{vals: p.Dim, width: r.ringBits / 8, weight: p.Weighted}
	r.prg = p.PRG
	if r.prg == "" {
		r.prg = AESCTR
	}
	if !r.prg.valid() {
		return nil, bad("unknown PRG %q", string(p.PRG)).WithHelp("use %q or %q", string(AESCTR), string(ChaCha20))
	}
	if p.Parent != nil && len(p.Parent) != keySize {
		return nil, bad("parent key of %d bytes, want a %d-byte X25519 public key", len(p.Parent), keySize).
			WithHelp("take the parent aggregator's key for this round from its plan")
	}
	r.errBound1 = math.Ldexp(1, -r.fracBits)
	r.scale, r.wScale = math.Ldexp(1, r.fracBits), math.Ldexp(1, r.wFracBits)
	members := make([]Member, n)
	for i, id := range r.ids {
		members[i] = Member{ID: id, Key: r.members[id]}
	}
	// The domain names the version of the round's messages: v2 carries
	// the 32-bit ring's coordinates in pairs, one Z_2^64 word each; v3
	// adds the consistency round (survivor signatures before unmasking).
	// A site of another version computes another digest, so its advert is
	// refused (a loud failure) instead of its messages being misread.
	sum := sha256.Sum256(mustEncode(paramsWire{
		Domain: "scellis/secagg/v3/params", Round: p.Round, Members: members, Threshold: r.t,
		Dim: p.Dim, Clip: p.Clip, Weighted: p.Weighted, MaxWeight: p.MaxWeight,
		FracBits: r.fracBits, WFracBits: r.wFracBits, PRG: r.prg, RingBits: r.ringBits,
		Protocol: r.proto, Degree: r.k, ShareT: r.st, Parent: p.Parent, Sites: p.Sites,
	}))
	r.session = sum[:]
	if !r.revealed() {
		r.graph()
	}
	return r, nil
}

// graph derives the masking graph: every pair for pairwise (and for a
// SecAgg+ round too small for a sparser graph), else, for a sub-cohort of
// a hierarchical round, a random Harary graph whose order is drawn from
// the session digest. A flat SecAgg+ round on a sparse graph draws its
// graph later, from every site's revealed randomness (graphseed.go): the
// digest covers the round ID, which the aggregator picks, so it could try
// round IDs until it found a graph it liked.
func (r *round) graph() {
	r.nbrs = make(map[string][]string, r.n)
	r.holderX = make(map[string]map[string]byte, r.n)
	if r.k >= r.n-1 {
		for _, id := range r.ids {
			r.nbrs[id] = slices.DeleteFunc(slices.Clone(r.ids), func(v string) bool { return v == id })
			r.holderX[id] = r.xs
		}
		return
	}
	r.drawGraph(r.session)
}

// drawGraph draws the sparse graph from seed: the session digest for a
// sub-cohort of a hierarchical round, the reveals' seed otherwise
// (graphseed.go).
func (r *round) drawGraph(seed []byte) {
	r.nbrs = harary(r.ids, r.k, deriveKey(seed, r.session, labelGraph))
	r.holderX = make(map[string]map[string]byte, r.n)
	for _, id := range r.ids {
		hs := append(slices.Clone(r.nbrs[id]), id)
		slices.Sort(hs)
		xs := make(map[string]byte, len(hs))
		for i, h := range hs {
			xs[h] = byte(i + 1)
		}
		r.holderX[id] = xs
	}
}

// neighbour reports whether u and v mask each other.
func (r *round) neighbour(u, v string) bool {
	_, ok := r.holderX[u][v]
	return ok && u != v
}

// Degree returns the protocol the round runs, its masking graph's degree
// k (n − 1 for pairwise) and the Shamir threshold of each site's secrets
// among its neighbours and itself (t for pairwise).
func (p Params) Degree() (Protocol, int, int, error) {
	r, err := newRound(p)
	if err != nil {
		return "", 0, 0, err
	}
	return r.proto, r.k, r.st, nil
}

// Digest returns the session digest of p (the SHA-256 of the canonical
// encoding of p and of what is derived from it), or an error if p is invalid.
// Adverts carry it so that sites with different params refuse each other.
func (p Params) Digest() ([]byte, error) {
	return derived(p, func(r *round) []byte { return slices.Clone(r.session) })
}

// FracBits returns the fixed-point fraction bits f of the values: a value x
// is encoded as a stochastic rounding of x·2^f.
func (p Params) FracBits() (int, error) {
	return derived(p, func(r *round) int { return r.fracBits })
}

// EffectiveThreshold returns the threshold t the round runs with: Threshold,
// or the default ⌊n/2⌋+1 when it is zero. Every sum the server can unmask
// holds the inputs of at least max(3, t) sites, so a site that takes part
// only in sums of at least k sites refuses params whose t is below k.
func (p Params) EffectiveThreshold() (int, error) {
	return derived(p, func(r *round) int { return r.t })
}

// EncodedBound returns the bound on each value of an input the site put on
// the grid itself (MaskEncoded): |y_i| ≤ ⌊Clip·2^f⌋, the per-site share of
// the ring's headroom. A site adding noise on the grid refuses a round
// whose bound its noise could exceed.
func (p Params) EncodedBound() (int64, error) {
	return derived(p, func(r *round) int64 { return r.encBound })
}

// RingBits returns the ring of the round's value coordinates: 32 (Z_2^32)
// when the sum of all members' encodings provably fits in it,
// n·(⌊Clip·2^f⌋ + 1) < 2^31, else 64. It is derived from the params, so
// every party agrees, and it is part of the session digest. A weight
// coordinate is always in Z_2^64.
func (p Params) RingBits() (int, error) {
	return derived(p, func(r *round) int { return r.ringBits })
}

// ringBitsFor picks the narrowest ring that holds the sum of n encodings
// bounded by encBound: a value encodes to at most encBound + 1 in
// magnitude (stochastic rounding rounds up by at most one; MaskEncoded
// inputs are within encBound), so the sum lies within ±n·(encBound + 1),
// and read as a signed 32-bit integer it is exact when that is at most
// 2^31 − 1. Integer arithmetic: no rounding can make the check pass
// wrongly.
func ringBitsFor(n int, encBound int64) int {
	if encBound >= 0 && encBound < math.MaxInt32 && int64(n)*(encBound+1) <= math.MaxInt32 {
		return 32
	}
	return 64
}

func (r *round) subject() string { return fmt.Sprintf("secure aggregation round %q", r.id) }

// checkRound refuses a message of another round.
func (r *round) checkRound(kind, got string) error {
	if got != r.id {
		return diag.New(diag.SecAggWrongRound, r.subject(), "%s is for round %q", kind, got).
			WithHelp("a message from an earlier or another round was replayed or misrouted; drop it")
	}
	return nil
}

// checkFloor refuses a set of sites below three or below the threshold.
func (r *round) checkFloor(phase string, have int) error {
	if have < MinSites {
		return diag.New(diag.SecAggTooFewSites, r.subject(), "%d sites left at %s; a round needs at least %d", have, phase, MinSites).
			WithHelp("with fewer than three sites a site could learn another's update from the sum; the round ends without a result — run it again")
	}
	if have < r.t {
		return diag.New(diag.SecAggBelowThreshold, r.subject(), "%d sites left at %s; the threshold is %d", have, phase, r.t).
			WithHelp("too many sites dropped out to recover the sum safely; the round ends without a result — run it again")
	}
	return nil
}

// derived is what f reads from the round p describes, or why p is invalid:
// each accessor of a derived value validates p in full.
func derived[T any](p Params, f func(*round) T) (T, error) {
	r, err := newRound(p)
	if err != nil {
		var none T
		return none, err
	}
	return f(r), nil
}
