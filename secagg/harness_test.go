package secagg

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
)

// The harness runs one round in memory: n clients and a server, every
// message optionally marshalled to bytes and parsed back (wire mode, which
// also records every byte the server receives), with scripted dropouts and a
// few faults a dishonest relay could inject.

// step is a protocol phase, in order; a client that stops after a step
// takes no part in later ones.
type step int

const (
	stepStart step = iota
	stepAdvertise
	stepShare
	stepMask
	stepUnmask
)

var stepNames = map[string]step{"start": stepStart, "advertise": stepAdvertise, "share": stepShare, "mask": stepMask, "unmask": stepUnmask}

func (s step) String() string {
	for k, v := range stepNames {
		if v == s {
			return k
		}
	}
	return fmt.Sprintf("step(%d)", int(s))
}

// identity returns a deterministic Ed25519 key for a test client.
func identity(id string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("scellis secagg test identity " + id))
	return ed25519.NewKeyFromSeed(seed[:])
}

func clientIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("c%d", i+1)
	}
	return ids
}

// testParams returns Params for n clients c1…cn.
func testParams(round string, n, t, dim int, clip float64) Params {
	p := Params{Round: round, Threshold: t, Dim: dim, Clip: clip}
	for _, id := range clientIDs(n) {
		p.Members = append(p.Members, Member{ID: id, Key: identity(id).Public().(ed25519.PublicKey)})
	}
	return p
}

type harness struct {
	tb      testing.TB
	p       Params
	ids     []string
	clients map[string]*Client
	server  *Server
	inputs  map[string][]float64
	weights map[string]float64
	// enc, when it holds a client, is that client's input already on the
	// grid: it is sent with MaskEncoded (inputs holds its decoded value).
	enc     map[string][]int64
	encoded map[string][]uint64 // plaintext ring encodings, from the hook
	ring    []uint64            // unmasked ring sum, from the hook
	stop    map[string]step     // last step a client takes part in
	failed  map[string]bool     // clients that refused something
	wire    bool
	reuse   bool     // clients mask into used buffers (MaskInputTo, MaskEncodedTo)
	recv    [][]byte // every byte string the server received (wire mode)
	evil    map[string]string

	ks     *KeySet
	dels   []*ShareDelivery
	req    *UnmaskRequest
	result *Result
	out    strings.Builder
}

func newHarness(tb testing.TB, p Params) (*harness, error) {
	h := &harness{
		tb: tb, p: p, clients: map[string]*Client{}, inputs: map[string][]float64{}, weights: map[string]float64{},
		encoded: map[string][]uint64{}, stop: map[string]step{}, failed: map[string]bool{}, evil: map[string]string{},
	}
	s, err := NewServer(p)
	if err != nil {
		return nil, err
	}
	s.testRing = func(r []uint64) { h.ring = r }
	h.server = s
	for i, m := range p.Members {
		c, err := NewClient(p, m.ID, identity(m.ID))
		if err != nil {
			return nil, err
		}
		nonce := sha256.Sum256([]byte("graph nonce of " + m.ID))
		c.testGraphNonce = nonce[:]
		c.testEncoded = func(e []uint64) { h.encoded[m.ID] = e }
		h.clients[m.ID] = c
		h.ids = append(h.ids, m.ID)
		h.stop[m.ID] = stepUnmask
		// Default input: multiples of 1/4 in [-1, 1], exact in fixed point.
		x := make([]float64, p.Dim)
		for j := range x {
			x[j] = float64(((i+1)*(j+3))%9-4) / 4
		}
		h.inputs[m.ID] = x
		if p.Weighted {
			h.weights[m.ID] = float64(i + 1)
		}
	}
	slices.Sort(h.ids)
	return h, nil
}

func (h *harness) printf(format string, args ...any) { fmt.Fprintf(&h.out, format, args...) }

// takesPart reports whether client id acts in step s.
func (h *harness) takesPart(id string, s step) bool {
	return !h.failed[id] && h.stop[id] >= s
}

// refusal renders an error for scripts: the diagnostic code and message.
func refusal(err error) string {
	if l, ok := diag.As(err); ok {
		return fmt.Sprintf("refused %s: %s", l[0].Code, l[0].Message)
	}
	return "error: " + err.Error()
}

// codeOf returns the diagnostic code carried by err, or "".
func codeOf(err error) diag.Code {
	if l, ok := diag.As(err); ok {
		return l[0].Code
	}
	return ""
}

// viaWire marshals m, records the bytes when the server is the receiver,
// and parses them back with parse.
func viaWire[T any](h *harness, toServer bool, m interface{ Marshal() ([]byte, error) }, parse func([]byte) (T, error)) T {
	b, err := m.Marshal()
	if err != nil {
		h.tb.Fatalf("marshal %T: %v", m, err)
	}
	if toServer {
		h.recv = append(h.recv, b)
	}
	v, err := parse(b)
	if err != nil {
		h.tb.Fatalf("parse %T: %v", m, err)
	}
	return v
}

// toClient is a message of the server on its way to a client: in wire
// mode, marshalled and parsed back.
func toClient[M marshaler](h *harness, m M, parse func([]byte) (M, error)) M {
	if h.wire {
		return viaWire(h, false, m, parse)
	}
	return m
}

// toServer is client id's answer (m, or the client's error) on its way to
// the server: in wire mode marshalled and parsed back, then handed to add;
// a refusal is the server's, of what of id.
func toServer[M marshaler](h *harness, id, what string, m M, err error, parse func([]byte) (M, error), add func(M) error) {
	if err != nil {
		h.clientErr(id, err)
		return
	}
	if h.wire {
		m = viaWire(h, true, m, parse)
	}
	if err := add(m); err != nil {
		h.serverErr("refuses "+what+" of "+id, err)
	}
}

func (h *harness) serverErr(what string, err error) {
	h.printf("server %s: %s\n", what, refusal(err))
}

func (h *harness) clientErr(id string, err error) {
	h.failed[id] = true
	h.printf("%s: %s\n", id, refusal(err))
}

func list(ids []string) string {
	if len(ids) == 0 {
		return "(none)"
	}
	return strings.Join(ids, " ")
}

func (h *harness) advertise() bool {
	for _, id := range h.ids {
		if !h.takesPart(id, stepAdvertise) {
			continue
		}
		a, err := h.clients[id].Advertise()
		toServer(h, id, "advert", a, err, ParseAdvert, h.server.AddAdvert)
	}
	h.printf("server waits for: %s\n", list(h.server.Missing()))
	return true
}

func (h *harness) share() bool {
	ks, err := h.server.EndAdvertise()
	if err != nil {
		h.serverErr("ends advertising", err)
		return false
	}
	var names []string
	for _, a := range ks.Adverts {
		names = append(names, a.Client)
	}
	h.printf("key set: %s\n", list(names))
	h.ks = ks
	if h.server.Phase() == PhaseReveal && !h.reveal(names) {
		return false
	}
	for _, id := range names {
		if !h.takesPart(id, stepShare) {
			continue
		}
		sh, err := h.clients[id].ShareKeys(toClient(h, h.corruptKeySet(ks), ParseKeySet))
		toServer(h, id, "shares", sh, err, ParseShares, h.server.AddShares)
	}
	h.printf("server waits for: %s\n", list(h.server.Missing()))
	return true
}

// reveal runs the reveal phase of a SecAgg+ round on a sparse graph: the
// sites that share keys reveal their graph randomness, and draw the graph
// from the server's reveal set.
func (h *harness) reveal(names []string) bool {
	var revealing []string
	for _, id := range names {
		if !h.takesPart(id, stepShare) {
			continue
		}
		rv, err := h.clients[id].Reveal(toClient(h, h.corruptKeySet(h.ks), ParseKeySet))
		toServer(h, id, "graph reveal", rv, err, ParseGraphReveal, h.server.AddReveal)
		revealing = append(revealing, id)
	}
	rs, err := h.server.EndReveal()
	if err != nil {
		h.serverErr("ends the reveal phase", err)
		return false
	}
	for _, id := range revealing {
		if err := h.clients[id].DrawGraph(toClient(h, rs, ParseGraphRevealSet)); err != nil {
			h.clientErr(id, err)
		}
	}
	return true
}

// corruptKeySet applies a scripted relay fault to a copy of the key set.
func (h *harness) corruptKeySet(ks *KeySet) *KeySet {
	out := &KeySet{Round: ks.Round, Adverts: slices.Clone(ks.Adverts)}
	for i := range out.Adverts {
		a := &out.Adverts[i]
		switch h.evil[a.Client] {
		case "unsign":
			a.Sig = nil
		case "badsig":
			a.Sig = slices.Clone(a.Sig)
			a.Sig[0] ^= 1
		case "dup":
			out.Adverts = append(out.Adverts, *a)
		}
	}
	return out
}

func (h *harness) mask() bool {
	dels, err := h.server.EndShare()
	if err != nil {
		h.serverErr("ends key sharing", err)
		return false
	}
	h.dels = dels
	var to []string
	for _, d := range dels {
		to = append(to, d.To)
	}
	h.printf("deliveries to: %s\n", list(to))
	for _, d := range dels {
		id := d.To
		if !h.takesPart(id, stepMask) {
			continue
		}
		d = toClient(h, d, ParseShareDelivery)
		var m *MaskedInput
		var buf []byte
		if h.reuse {
			// A used buffer: its stale bytes must not reach the sum.
			buf = bytes.Repeat([]byte{0xa5}, h.clients[id].MaskedVectorSize())
		}
		if e, ok := h.enc[id]; ok {
			m, err = h.clients[id].MaskEncodedTo(buf, d, e, h.weights[id])
		} else {
			m, err = h.clients[id].MaskInputTo(buf, d, h.inputs[id], h.weights[id])
		}
		if err == nil && h.reuse && &m.Masked[0] != &buf[0] {
			h.tb.Fatalf("%s masked into a new slice, not the buffer it was given", id)
		}
		toServer(h, id, "masked input", m, err, ParseMaskedInput, h.server.AddMaskedInput)
	}
	h.printf("server waits for: %s\n", list(h.server.Missing()))
	return true
}

func (h *harness) unmask() bool {
	req, err := h.server.EndMask()
	if err != nil {
		h.serverErr("ends input collection", err)
		return false
	}
	h.req = req
	h.printf("unmask request: survivors %s; dropped %s\n", list(req.Survivors), list(req.Dropped))
	// The consistency round: every survivor still taking part signs the
	// set it was shown; the server hands the signatures back with the set.
	for _, id := range req.Survivors {
		if !h.takesPart(id, stepUnmask) {
			continue
		}
		in := req
		if v, ok := h.evil["both"]; ok {
			in = &UnmaskRequest{Round: req.Round, Survivors: req.Survivors, Dropped: append(slices.Clone(req.Dropped), v)}
		}
		sig, err := h.clients[id].SignSurvivors(toClient(h, in, ParseUnmaskRequest))
		toServer(h, id, "the survivor signature", sig, err, ParseSurvivorSig, h.server.AddSignature)
	}
	if missing := h.server.Missing(); len(missing) > 0 {
		h.printf("server waits for signatures of: %s\n", list(missing))
	}
	signed, err := h.server.EndConsistency()
	if err != nil {
		h.serverErr("ends the consistency round", err)
		return false
	}
	for _, sg := range signed.Signatures {
		id := sg.Of
		if !h.takesPart(id, stepUnmask) {
			continue
		}
		u, err := h.clients[id].Unmask(toClient(h, signed, ParseUnmaskRequest))
		toServer(h, id, "unmasking", u, err, ParseUnmasking, h.server.AddUnmasking)
	}
	h.printf("server waits for: %s\n", list(h.server.Missing()))
	res, err := h.server.Finish()
	if err != nil {
		h.serverErr("finishes", err)
		return false
	}
	h.result = res
	h.printf("sum: %v\n", res.Sum)
	if h.p.Weighted {
		h.printf("weight: %v\n", res.Weight)
	}
	h.printf("contributors: %s; dropped: %s\n", list(res.Contributors), list(res.Dropped))
	h.check()
	return true
}

// consistency runs the consistency round honestly: every survivor of req
// signs it and the server returns the set with the signatures.
func consistency(s *Server, clients map[string]*Client, req *UnmaskRequest) (*UnmaskRequest, error) {
	for _, id := range req.Survivors {
		sig, err := clients[id].SignSurvivors(req)
		if err != nil {
			return nil, err
		}
		if err := s.AddSignature(sig); err != nil {
			return nil, err
		}
	}
	return s.EndConsistency()
}

// shareAll has each of ids share its keys for ks honestly and hands the
// shares to s.
func shareAll(s *Server, clients map[string]*Client, ids []string, ks *KeySet) error {
	if err := revealAll(s, clients, ids, ks); err != nil {
		return err
	}
	for _, id := range ids {
		sh, err := clients[id].ShareKeys(ks)
		if err != nil {
			return err
		}
		if err := s.AddShares(sh); err != nil {
			return err
		}
	}
	return nil
}

// revealAll runs the reveal phase of a SecAgg+ round on a sparse graph
// (nothing otherwise): the clients of ids reveal to s and draw the graph.
func revealAll(s *Server, clients map[string]*Client, ids []string, ks *KeySet) error {
	if s.Phase() != PhaseReveal {
		return nil
	}
	for _, id := range ids {
		rv, err := clients[id].Reveal(ks)
		if err != nil {
			return err
		}
		if err := s.AddReveal(rv); err != nil {
			return err
		}
	}
	rs, err := s.EndReveal()
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := clients[id].DrawGraph(rs); err != nil {
			return err
		}
	}
	return nil
}

// maskAll has the recipient of each of dels mask its input (unweighted)
// and hands the masked inputs to s.
func maskAll(s *Server, clients map[string]*Client, dels []*ShareDelivery, input func(id string) []float64) error {
	for _, d := range dels {
		m, err := clients[d.To].MaskInput(d, input(d.To), 0)
		if err != nil {
			return err
		}
		if err := s.AddMaskedInput(m); err != nil {
			return err
		}
	}
	return nil
}

// unmaskAll has each of ids answer req and hands the unmaskings to s;
// alter, if not nil, may change the i-th before it is handed over (to
// play a corrupt site).
func unmaskAll(s *Server, clients map[string]*Client, ids []string, req *UnmaskRequest, alter func(i int, u *Unmasking)) error {
	for i, id := range ids {
		u, err := clients[id].Unmask(req)
		if err != nil {
			return err
		}
		if alter != nil {
			alter(i, u)
		}
		if err := s.AddUnmasking(u); err != nil {
			return err
		}
	}
	return nil
}

// finishRefused checks that s refuses to finish with code and releases no
// sum.
func finishRefused(t *testing.T, s *Server, code diag.Code) {
	t.Helper()
	res, err := s.Finish()
	wantCode(t, err, code)
	if res != nil {
		t.Fatalf("the server released a sum despite %s", code)
	}
}

// run drives every step in order, until the server refuses one.
func (h *harness) run() bool {
	return h.advertise() && h.share() && h.mask() && h.unmask()
}

// check compares a result with the plaintext sum of its contributors:
// exactly in the ring, and within the error bound as floats.
func (h *harness) check() {
	res := h.result
	want := make([]uint64, len(h.ring))
	plain := make([]float64, h.p.Dim)
	abs := make([]float64, h.p.Dim) // Σ|x|: bounds the float rounding of the reference sum
	var weight float64
	for _, u := range res.Contributors {
		e, ok := h.encoded[u]
		if !ok {
			h.tb.Fatalf("no encoding recorded for contributor %s", u)
		}
		for i := range want {
			want[i] += e[i]
		}
		for i, v := range h.inputs[u] {
			plain[i] += v
			abs[i] += absf(v)
		}
		weight += h.weights[u]
	}
	if !slices.Equal(h.ring, want) {
		h.tb.Errorf("ring sum differs from the sum of the contributors' encodings")
	}
	k := float64(len(res.Contributors) + 2)
	for i, v := range res.Sum {
		tol := res.ErrorBound + k*abs[i]*0x1p-52 + 0x1p-1070
		if d := v - plain[i]; absf(d) > tol {
			h.tb.Errorf("sum[%d] = %v, plaintext %v: off by %g, bound %g", i, v, plain[i], d, res.ErrorBound)
		}
	}
	if h.p.Weighted && absf(res.Weight-weight) > float64(len(res.Contributors))*h.wBound()+k*weight*0x1p-52 {
		h.tb.Errorf("weight %v, plaintext %v", res.Weight, weight)
	}
}

func (h *harness) wBound() float64 {
	r, _ := newRound(h.p)
	return math.Ldexp(1, -r.wFracBits)
}

func absf(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
