package secagg

import (
	"encoding/binary"
	"fmt"
	"slices"
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
// Run: go test -run x -bench . -benchtime 3x ./secagg/

var (
	benchDims = []int{10_000, 1_000_000}
	benchNs   = []int{3, 10, 30}
)

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

// floorCache holds the keystream floor per number of streams and words.
var floorCache = map[[2]int]time.Duration{}

// keystreamFloor is the time the fastest keystream takes to produce
// streams × words ring elements (one fresh key per stream).
func keystreamFloor(streams, words int) time.Duration {
	k := [2]int{streams, words}
	if d, ok := floorCache[k]; ok {
		return d
	}
	buf := make([]byte, 8*words)
	best := time.Duration(1<<63 - 1)
	for _, g := range []PRG{AESCTR, ChaCha20} {
		best = min(best, minTime(3, func() {
			for range streams {
				rawKeystream(g, buf)
			}
		}))
	}
	floorCache[k] = best
	return best
}

// plainEncode is the no-secure-aggregation baseline: fixed-point encoding
// with stochastic rounding, serialised as the masked input would be.
func plainEncode(r *round, x []float64) []byte {
	rd, err := newRounder(r.prg)
	if err != nil {
		panic(err)
	}
	out := make([]byte, 8*r.dim)
	for i, v := range x {
		binary.LittleEndian.PutUint64(out[8*i:], encodeValue(v, r.fracBits, rd))
	}
	return out
}

func serialize(y []uint64) []byte {
	out := make([]byte, 8*len(y))
	for i, w := range y {
		binary.LittleEndian.PutUint64(out[8*i:], w)
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

// benchClients sets up n clients of dimension d through key sharing.
type benchClients struct {
	p       Params
	clients map[string]*Client
	server  *Server
	ids     []string
}

func newBenchClients(b *testing.B, n, d int) *benchClients {
	p := testParams("bench", n, 0, d, 1)
	p.PRG = DefaultPRG()
	s, err := NewServer(p)
	if err != nil {
		b.Fatal(err)
	}
	bc := &benchClients{p: p, clients: map[string]*Client{}, server: s, ids: clientIDs(n)}
	slices.Sort(bc.ids)
	for _, id := range bc.ids {
		c, err := NewClient(p, id, identity(id))
		if err != nil {
			b.Fatal(err)
		}
		bc.clients[id] = c
		a, _ := c.Advertise()
		if err := s.AddAdvert(a); err != nil {
			b.Fatal(err)
		}
	}
	ks, err := s.EndAdvertise()
	if err != nil {
		b.Fatal(err)
	}
	for _, id := range bc.ids {
		sh, err := bc.clients[id].ShareKeys(ks)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.AddShares(sh); err != nil {
			b.Fatal(err)
		}
	}
	return bc
}

var clientCache = map[[2]int]*benchClients{}

// BenchmarkClientMask is one client's masking: encode its vector, expand
// its self mask and n-1 pairwise masks, add them, serialise.
func BenchmarkClientMask(b *testing.B) {
	for _, d := range benchDims {
		for _, n := range benchNs {
			b.Run(fmt.Sprintf("d=%d/n=%d", d, n), func(b *testing.B) {
				bc, ok := clientCache[[2]int{n, d}]
				if !ok {
					bc = newBenchClients(b, n, d)
					clientCache[[2]int{n, d}] = bc
				}
				c := bc.clients[bc.ids[0]]
				x := benchInput(d)
				floor := keystreamFloor(n, d)
				enc := minTime(3, func() { plainEncode(c.r, x) })
				b.SetBytes(int64(8 * d))
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					y, err := c.maskedVector(x, 0, bc.ids)
					if err != nil {
						b.Fatal(err)
					}
					serialize(y)
				}
				b.StopTimer()
				per := b.Elapsed() / time.Duration(b.N)
				b.ReportMetric(float64(per)/float64(floor), "x-floor")
				b.ReportMetric(float64(per)/float64(enc), "x-encode")
			})
		}
	}
}

var serverCache = map[[3]int]*Server{}

// benchServer runs a round of n clients of dimension d, with the last
// drops clients dropping after key sharing, up to the unmaskings.
func benchServer(b *testing.B, n, d, drops int) *Server {
	if s, ok := serverCache[[3]int{n, d, drops}]; ok {
		return s
	}
	bc := newBenchClients(b, n, d)
	s := bc.server
	dels, err := s.EndShare()
	if err != nil {
		b.Fatal(err)
	}
	x := benchInput(d)
	for _, del := range dels[:n-drops] {
		m, err := bc.clients[del.To].MaskInput(del, x, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.AddMaskedInput(m); err != nil {
			b.Fatal(err)
		}
	}
	req, err := s.EndMask()
	if err != nil {
		b.Fatal(err)
	}
	for _, id := range req.Survivors {
		u, err := bc.clients[id].Unmask(req)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.AddUnmasking(u); err != nil {
			b.Fatal(err)
		}
	}
	serverCache[[3]int{n, d, drops}] = s
	return s
}

// BenchmarkServerUnmask is the server's unmasking: reconstruct the
// survivors' seeds and the dropped clients' mask keys, and remove every
// mask from the accumulated sum (held in one O(d) vector throughout).
// With k dropped clients and m survivors it expands m + k·m masks.
func BenchmarkServerUnmask(b *testing.B) {
	for _, d := range benchDims {
		for _, n := range benchNs {
			for _, drops := range []int{0, 2} {
				if n-drops < MinSites || n-drops < n/2+1 {
					continue
				}
				b.Run(fmt.Sprintf("d=%d/n=%d/dropped=%d", d, n, drops), func(b *testing.B) {
					s := benchServer(b, n, d, drops)
					m := n - drops
					floor := keystreamFloor(m+drops*m, d)
					b.SetBytes(int64(8 * d))
					b.ReportAllocs()
					acc := make([]uint64, len(s.acc))
					b.ResetTimer()
					for range b.N {
						b.StopTimer()
						copy(acc, s.acc)
						b.StartTimer()
						if err := s.unmask(acc); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					per := b.Elapsed() / time.Duration(b.N)
					b.ReportMetric(float64(per)/float64(floor), "x-floor")
					b.ReportMetric(float64(8*len(s.acc)), "server-acc-B")
				})
			}
		}
	}
}
