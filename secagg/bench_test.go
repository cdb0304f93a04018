package secagg

import (
	"crypto/ecdh"
	"crypto/rand"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// Benchmarks of the costs that matter, each reported with ratios against
// baselines measured in the same run:
//
//	x-floor   time ÷ the raw cost of the fastest cryptographic keystream on
//	          this machine for the same number of mask bytes (the physical
//	          floor of pairwise masking: every mask byte must be generated);
//	x-encode  time ÷ the plaintext encoding of the same vector (fixed point
//	          with stochastic rounding, serialised), i.e. what sending the
//	          input without secure aggregation would cost.
//
// Ratios compare the fastest iteration with the fastest baseline run,
// interleaved, so a noisy neighbour inflates neither side alone.
//
// Run: go test -run '^$' -bench . -benchtime 3x ./secagg/
//
// Under -short (CI runs every benchmark once that way, so a broken one
// fails CI) only the small rounds run: d=10000 and n up to 10; the
// larger ones skip, saying so.

var (
	benchDims = []int{10_000, 1_000_000}
	benchNs   = []int{3, 10, 30}
)

// skipLargeUnderShort skips a sub-benchmark whose vector has more than
// 10,000 coordinates or whose round more than 10 sites, under -short:
// the small rounds run the same code in a fraction of the time.
func skipLargeUnderShort(b *testing.B, n, d int) {
	if testing.Short() && (d > 10_000 || n > 10) {
		b.Skipf("-short: n=%d, d=%d skipped (the rounds of d=10000 and n≤10 run the same code)", n, d)
	}
}

// BenchmarkKeystream compares the candidate mask generators; DefaultPRG
// picks the faster where hardware supports it.
func BenchmarkKeystream(b *testing.B) {
	for _, g := range []PRG{AESCTR, ChaCha20} {
		b.Run(string(g), func(b *testing.B) {
			buf := make([]byte, 8*1_000_000)
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				rawKeystream(g, buf)
			}
		})
	}
}

// rawKeystream fills buf with the keystream of g, in masker-sized chunks.
func rawKeystream(g PRG, buf []byte) {
	key := make([]byte, 32)
	s := g.stream(key)
	for off := 0; off < len(buf); off += len(zeroChunk) {
		end := min(off+len(zeroChunk), len(buf))
		s.XORKeyStream(buf[off:end], zeroChunk[:end-off])
	}
}

// minTime is the fastest of reps runs of f: a baseline measured in the
// same run as the benchmark it scales.
func minTime(reps int, f func()) time.Duration {
	best := time.Duration(1<<63 - 1)
	for range reps {
		t0 := time.Now()
		f()
		best = min(best, time.Since(t0))
	}
	return best
}

// fastestKeystream returns a func producing streams × bytes of the
// fastest keystream on this machine (one fresh key per stream), on one
// core: the floor the masking kernel is measured against. The keystream
// is produced into one 16 KiB buffer that stays in L1/L2 and is then
// dropped (hotKeystream): writing it out to a vector of the round's size
// costs ~10% more on this kind of machine (the stores reach memory), and
// a floor must be the least that generating the bytes can cost, not a
// way the kernel could also pay.
func fastestKeystream(streams, bytes int) func() {
	best, bestG := time.Duration(1<<63-1), AESCTR
	for _, g := range []PRG{AESCTR, ChaCha20} {
		if d := minTime(2, func() { hotKeystream(g, min(bytes, 1<<20)) }); d < best {
			best, bestG = d, g
		}
	}
	return func() {
		for range streams {
			hotKeystream(bestG, bytes)
		}
	}
}

// floorTile and floorZeros are hotKeystream's buffer and plaintext:
// 16 KiB, the best chunk of 4–64 KiB here (per-call overhead on one
// side, cache on the other; all within 3%).
var floorTile, floorZeros [16 << 10]byte

// hotKeystream generates bytes of the keystream of g under a fresh key,
// 16 KiB at a time into the same buffer.
func hotKeystream(g PRG, bytes int) {
	key := make([]byte, 32)
	s := g.stream(key)
	for off := 0; off < bytes; off += len(floorTile) {
		m := min(len(floorTile), bytes-off)
		s.XORKeyStream(floorTile[:m], floorZeros[:m])
	}
}

// measure runs op b.N times under the benchmark timer and, interleaved
// with it and off the timer, each baseline once per iteration. It reports
// the fastest op over the fastest run of each baseline as "x-<name>":
// interleaving and taking minima keep the ratios honest on a busy machine.
// Where the process's CPU time can be read it also reports
// "x-<name>-cpu": the least CPU time (all threads) of op over the least
// of the baseline, the work done whatever the machine's load, which the
// wall-time ratio only shows on idle cores (a baseline on one core, op on
// all of them: on an idle machine of c cores x-floor approaches
// x-floor-cpu / c).
func measure(b *testing.B, op func(), baselines map[string]func()) {
	measureWith(b, nil, op, baselines)
}

// measureWith is measure with prep (if any) run before each op, off the
// timer and out of the op's figures.
func measureWith(b *testing.B, prep, op func(), baselines map[string]func()) {
	const never = time.Duration(1<<63 - 1)
	type best struct{ wall, cpu time.Duration }
	timed := func(f func(), into *best) {
		c0, cpuOK := cpuTime()
		t0 := time.Now()
		f()
		into.wall = min(into.wall, time.Since(t0))
		if c1, _ := cpuTime(); cpuOK {
			into.cpu = min(into.cpu, c1-c0)
		}
	}
	base := map[string]*best{}
	for name := range baselines {
		base[name] = &best{never, never}
	}
	opBest := best{never, never}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for name, f := range baselines {
			timed(f, base[name])
		}
		if prep != nil {
			prep()
		}
		b.StartTimer()
		timed(op, &opBest)
	}
	b.StopTimer()
	for name, d := range base {
		b.ReportMetric(float64(opBest.wall)/float64(d.wall), "x-"+name)
		if d.cpu > 0 && d.cpu < never && opBest.cpu < never {
			b.ReportMetric(float64(opBest.cpu)/float64(d.cpu), "x-"+name+"-cpu")
		}
	}
}

// plainEncode is the no-secure-aggregation baseline: fixed-point encoding
// with stochastic rounding, serialised as the masked input would be.
func plainEncode(r *round, x []float64) []byte {
	rd, err := newRounder(r.prg)
	if err != nil {
		panic(err)
	}
	out := make([]byte, 8*r.dim)
	var draws [tileBytes / 8 * roundBytes]byte
	for i := 0; i < len(x); i += tileBytes / 8 {
		xs := x[i:min(i+tileBytes/8, len(x))]
		rd.draws(draws[:roundBytes*len(xs)])
		encodeTile(out[8*i:], 8, xs, r.scale, draws[:])
	}
	return out
}

func benchInput(d int) []float64 {
	x := make([]float64, d)
	for i := range x {
		x[i] = float64(i%2001-1000) / 1000.1
	}
	return x
}

// advertised starts a round of p with a server and a client for each of
// ids, in that order, and runs it up to the key set.
func advertised(b *testing.B, p Params, ids []string) (*Server, map[string]*Client, *KeySet) {
	s, err := NewServer(p)
	if err != nil {
		b.Fatal(err)
	}
	clients := map[string]*Client{}
	for _, id := range ids {
		c, err := NewClient(p, id, identity(id))
		if err != nil {
			b.Fatal(err)
		}
		clients[id] = c
		a, _ := c.Advertise()
		if err := s.AddAdvert(a); err != nil {
			b.Fatal(err)
		}
	}
	ks, err := s.EndAdvertise()
	if err != nil {
		b.Fatal(err)
	}
	return s, clients, ks
}

// benchClients sets up n clients of dimension d through key sharing.
type benchClients struct {
	p       Params
	clients map[string]*Client
	server  *Server
	ids     []string
}

func newBenchClients(b *testing.B, n, d, ring int) *benchClients {
	p := testParams("bench", n, 0, d, 1)
	p.PRG = DefaultPRG()
	if ring == 32 {
		p.GridBits = 16 // as a DP round's grid: n·(2^16+1) fits Z_2^32
	}
	ids := clientIDs(n)
	slices.Sort(ids)
	s, clients, ks := advertised(b, p, ids)
	bc := &benchClients{p: p, clients: clients, server: s, ids: ids}
	if err := shareAll(s, bc.clients, bc.ids, ks); err != nil {
		b.Fatal(err)
	}
	return bc
}

var clientCache = map[[3]int]*benchClients{}

// BenchmarkClientMask is one client's masking: encode its vector, expand
// its self mask and n-1 pairwise masks, add them, in the masked input's
// bytes. ring=64 is a round with a derived grid and float input (the
// encoding includes stochastic rounding); ring=32 is a round on a fixed
// grid whose sum fits Z_2^32, with the input already on the grid
// (MaskEncoded: the DP path of a silo). x-floor divides by n·d ring
// elements of keystream at the round's width on one core; x-floor64 by
// n·d 8-byte elements (the floor of the 64-bit ring).
func BenchmarkClientMask(b *testing.B) {
	for _, ring := range []int{64, 32} {
		for _, d := range benchDims {
			for _, n := range benchNs {
				b.Run(fmt.Sprintf("ring=%d/d=%d/n=%d", ring, d, n), func(b *testing.B) {
					skipLargeUnderShort(b, n, d)
					key := [3]int{ring, n, d}
					bc, ok := clientCache[key]
					if !ok {
						bc = newBenchClients(b, n, d, ring)
						clientCache[key] = bc
					}
					c := bc.clients[bc.ids[0]]
					if c.r.ringBits != ring {
						b.Fatalf("round runs in Z_2^%d, want %d", c.r.ringBits, ring)
					}
					x := benchInput(d)
					var enc []int64
					if ring == 32 {
						enc = make([]int64, d)
						for i, v := range x {
							enc[i] = int64(v * 65536)
						}
						x = nil
					}
					b.SetBytes(int64(8 * d))
					b.ReportAllocs()
					xin := benchInput(d) // made once: the baseline is the encoding alone
					base := map[string]func(){
						"floor":  fastestKeystream(n, c.r.lay.size()),
						"encode": func() { plainEncode(c.r, xin) },
					}
					if ring == 32 {
						base["floor64"] = fastestKeystream(n, 8*d)
					}
					out := make([]byte, c.MaskedVectorSize()) // reused, as a site's round path does (MaskInputTo)
					measure(b, func() {
						if _, err := c.maskedVector(out, x, enc, 0, bc.ids); err != nil {
							b.Fatal(err)
						}
					}, base)
				})
			}
		}
	}
}

var serverCache = map[[4]int]*Server{}

// benchServer runs a round of n clients of dimension d in the given ring
// (as BenchmarkClientMask's), with the last drops clients dropping after
// key sharing, up to the unmaskings.
func benchServer(b *testing.B, n, d, drops, ring int) *Server {
	key := [4]int{n, d, drops, ring}
	if s, ok := serverCache[key]; ok {
		return s
	}
	bc := newBenchClients(b, n, d, ring)
	s := bc.server
	if s.r.ringBits != ring {
		b.Fatalf("round runs in Z_2^%d, want %d", s.r.ringBits, ring)
	}
	dels, err := s.EndShare()
	if err != nil {
		b.Fatal(err)
	}
	x := benchInput(d)
	if err := maskAll(s, bc.clients, dels[:n-drops], func(string) []float64 { return x }); err != nil {
		b.Fatal(err)
	}
	req, err := s.EndMask()
	if err != nil {
		b.Fatal(err)
	}
	if req, err = consistency(s, bc.clients, req); err != nil {
		b.Fatal(err)
	}
	if err := unmaskAll(s, bc.clients, req.Survivors, req, nil); err != nil {
		b.Fatal(err)
	}
	serverCache[key] = s
	return s
}

// BenchmarkServerUnmask is the server's unmasking: reconstruct the
// survivors' seeds and the dropped clients' mask keys, and remove every
// mask from the accumulated sum (held in one O(d) vector throughout).
// With k dropped clients and m survivors it expands m + k·m masks;
// x-floor divides by as many keystreams of the round's vector (its
// width), x-floor64 (32-bit ring) by as many of 8-byte elements.
func BenchmarkServerUnmask(b *testing.B) {
	for _, ring := range []int{64, 32} {
		for _, d := range benchDims {
			for _, n := range benchNs {
				for _, drops := range []int{0, 2} {
					if n-drops < MinSites || n-drops < n/2+1 {
						continue
					}
					b.Run(fmt.Sprintf("ring=%d/d=%d/n=%d/dropped=%d", ring, d, n, drops), func(b *testing.B) {
						skipLargeUnderShort(b, n, d)
						s := benchServer(b, n, d, drops, ring)
						m := n - drops
						b.SetBytes(int64(8 * d))
						b.ReportAllocs()
						acc := make([]byte, len(s.acc))
						base := map[string]func(){"floor": fastestKeystream(m+drops*m, len(s.acc))}
						if ring == 32 {
							base["floor64"] = fastestKeystream(m+drops*m, 8*d)
						}
						measureWith(b, func() { copy(acc, s.acc) }, func() {
							if err := s.unmask(acc); err != nil {
								b.Fatal(err)
							}
						}, base)
						b.ReportMetric(float64(len(s.acc)), "server-acc-B")
					})
				}
			}
		}
	}
}

// BenchmarkKernel is the masking kernel alone: n masks added into a
// vector of d coordinates of the given ring, against n·d ring elements of
// the fastest keystream on one core (x-floor). Run with -cpu 1 to see the
// kernel's overhead on one core, without -cpu to see all cores at work.
func BenchmarkKernel(b *testing.B) {
	for _, ring := range []int{64, 32} {
		for _, n := range []int{3, 10} {
			const d = 1_000_000
			b.Run(fmt.Sprintf("ring=%d/d=%d/n=%d", ring, d, n), func(b *testing.B) {
				l := layout{vals: d, width: ring / 8}
				vec := make([]byte, l.size())
				var masks []mask
				for i := range n {
					masks = append(masks, mask{selfMaskKey([]byte{byte(i)}, make([]byte, 32), "u"), 1 - 2*(i%2)})
				}
				b.SetBytes(int64(n * l.size()))
				measure(b, func() { applyMasks(DefaultPRG(), vec, l, masks, nil) },
					map[string]func(){"floor": fastestKeystream(n, l.size())})
			})
		}
	}
}

// BenchmarkPlusClient is one site's cost in a round of n sites, SecAgg+
// against pairwise masking: a fresh advert, key sharing (agreements with
// its neighbours, Shamir shares, boxes) and masking its d-vector with its
// neighbours. x-pairwise divides by the same site's cost under pairwise
// masking, measured in the same run; above MaxSites, where pairwise
// cannot run, by what it would have to do at least: 2(n−1) X25519
// agreements and n masks of the vector.
func BenchmarkPlusClient(b *testing.B) {
	const d = 100_000
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("d=%d/n=%d", d, n), func(b *testing.B) {
			if testing.Short() && n > 10 {
				b.Skipf("-short: n=%d skipped (n=10 runs SecAgg+ against pairwise)", n)
			}
			plus := newClientBench(b, n, d, SecAggPlus)
			base := map[string]func(){}
			if n <= MaxSites {
				pw := newClientBench(b, n, d, Pairwise)
				base["pairwise"] = pw.run
			} else {
				base["pairwise"] = pairwiseFloor(b, n, d)
			}
			_, k, st, _ := plus.p.Degree()
			measure(b, plus.run, base)
			b.ReportMetric(float64(k), "neighbours")
			b.ReportMetric(float64(st), "threshold")
		})
	}
}

// clientBench holds a round of n sites through advertising, so that one
// site can run key sharing and masking again and again.
type clientBench struct {
	b  *testing.B
	p  Params
	ks *KeySet
	x  []float64
	// reveals: on a sparse graph, the other sites' graph reveals (c1
	// reveals afresh in each run).
	reveals []GraphReveal
}

func newClientBench(b *testing.B, n, d int, proto Protocol) *clientBench {
	p := testParams("plus-bench", n, 0, d, 1)
	p.PRG, p.Protocol = DefaultPRG(), proto
	_, clients, ks := advertised(b, p, clientIDs(n))
	cb := &clientBench{b: b, p: p, ks: ks, x: benchInput(d)}
	for _, id := range slices.Sorted(maps.Keys(clients)) {
		if c := clients[id]; id != "c1" && c.Reveals() {
			rv, err := c.Reveal(ks)
			if err != nil {
				b.Fatal(err)
			}
			cb.reveals = append(cb.reveals, *rv)
		}
	}
	return cb
}

// run is c1's part: advertise afresh, share keys, mask.
func (cb *clientBench) run() {
	c, err := NewClient(cb.p, "c1", identity("c1"))
	if err != nil {
		cb.b.Fatal(err)
	}
	a, _ := c.Advertise()
	ks := &KeySet{Round: cb.ks.Round, Adverts: slices.Clone(cb.ks.Adverts)}
	for i := range ks.Adverts {
		if ks.Adverts[i].Client == "c1" {
			ks.Adverts[i] = *a
		}
	}
	if c.Reveals() {
		// A sparse graph: the reveal phase between the key set and key
		// sharing (graphseed.go), c1's reveal among the others'.
		own, err := c.Reveal(ks)
		if err != nil {
			cb.b.Fatal(err)
		}
		rs := &GraphRevealSet{Round: ks.Round, Reveals: append(slices.Clone(cb.reveals), *own)}
		slices.SortFunc(rs.Reveals, func(a, b GraphReveal) int { return strings.Compare(a.From, b.From) })
		if err := c.DrawGraph(rs); err != nil {
			cb.b.Fatal(err)
		}
	}
	if _, err := c.ShareKeys(ks); err != nil {
		cb.b.Fatal(err)
	}
	u2 := append([]string{"c1"}, c.r.nbrs["c1"]...)
	slices.Sort(u2)
	if _, err := c.maskedVector(nil, cb.x, nil, 0, u2); err != nil {
		cb.b.Fatal(err)
	}
}

// pairwiseFloor is the least a pairwise site of n would do: 2(n−1)
// X25519 agreements and n masks over d coordinates.
func pairwiseFloor(b *testing.B, n, d int) func() {
	priv, _ := ecdh.X25519().GenerateKey(rand.Reader)
	peer, _ := ecdh.X25519().GenerateKey(rand.Reader)
	l := layout{vals: d, width: 8}
	vec := make([]byte, l.size())
	masks := make([]mask, n)
	for i := range masks {
		masks[i] = mask{selfMaskKey([]byte{byte(i), byte(i >> 8)}, make([]byte, 32), "u"), 1}
	}
	return func() {
		for range 2 * (n - 1) {
			if _, err := priv.ECDH(peer.PublicKey()); err != nil {
				b.Fatal(err)
			}
		}
		applyMasks(DefaultPRG(), vec, l, masks, nil)
	}
}
