package he

import (
	"crypto/ed25519"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/scellis/scellis/secagg"
)

// Benchmarks of a whole round in threshold-he mode against pairwise
// masking (package secagg) on the same encoded vectors, in the same run,
// with ratios (x-masking: threshold-he ÷ masking):
//
//	encrypt  one site's encryption (opening its key shares, packing,
//	         encoding, encrypting) ÷ one site's masking
//	         (expanding n−1 pairwise masks and its self mask)
//	add      the aggregator taking in the n inputs (parse and add)
//	decrypt  the phase that opens the sum: t partial decryptions plus the
//	         aggregator's combination ÷ n unmaskings plus the server's
//	         reconstruction and mask removal
//	site CPU what the sites compute, per site: key sharing, encryption
//	         and partial decryption ÷ masking's key sharing, masking,
//	         signing the survivors and unmasking
//	bytes    what a site sends and receives over the whole round: the
//	         most any site moves (a decryptor's) and the mean over the
//	         n sites (t of them decrypt), each ÷ masking's
//
// in two layouts of the integers (grid20: ±2^20, masking in 4-byte words,
// HE two values a coefficient; wide: the widest each mode takes, masking
// in 8-byte words, HE one value a coefficient). Each phase runs
// serially (sites one after another) and is timed in the process's CPU
// time (getrusage: user and system, the garbage collector included), the
// least of the iterations, so that a busy machine inflates it less than
// wall time. Run:
//
//	go test ./secagg/he -run XXX -bench . -benchtime 2x
//
// Under -short (CI runs every benchmark once that way) only d=10000,
// n=3 runs: the larger rounds run the same code for longer.

type costs struct {
	encrypt, add, decrypt, site time.Duration // fastest seen
	bytes                       []int         // per site
}

func (c *costs) count(i int, b []byte) []byte {
	c.bytes[i] += len(b)
	return b
}

// countAll counts b against every site (a message each receives).
func (c *costs) countAll(b []byte) {
	for i := range c.bytes {
		c.bytes[i] += len(b)
	}
}

func (c costs) maxBytes() float64 { return float64(slices.Max(c.bytes)) }
func (c costs) meanBytes() float64 {
	t := 0
	for _, b := range c.bytes {
		t += b
	}
	return float64(t) / float64(len(c.bytes))
}

func (c *costs) keep(o costs) {
	if c.encrypt == 0 || o.encrypt < c.encrypt {
		c.encrypt = o.encrypt
	}
	if c.add == 0 || o.add < c.add {
		c.add = o.add
	}
	if c.decrypt == 0 || o.decrypt < c.decrypt {
		c.decrypt = o.decrypt
	}
	if c.site == 0 || o.site < c.site {
		c.site = o.site
	}
	c.bytes = o.bytes
}

func BenchmarkRound(b *testing.B) {
	for _, dim := range []int{10_000, 100_000, 1_000_000} {
		for _, n := range []int{3, 10} {
			for _, lay := range layouts {
				b.Run(fmt.Sprintf("d=%d/n=%d/%s", dim, n, lay.name), func(b *testing.B) {
					benchRound(b, dim, n, lay)
				})
			}
		}
	}
}

// A layout is how wide the integers of both modes are.
type layout struct {
	name string
	// bound is the per-site bound of the inputs and the HE round.
	bound func(n int) int64
	// gridBits is masking's grid: 20 with clip 1 holds ±2^20 and sums in
	// Z_2^32 (4-byte words); 0 derives the widest grid, Z_2^64 (8 bytes).
	gridBits int
}

var layouts = []layout{
	// grid20: ±2^20, a DP-like grid. HE packs two values a coefficient.
	{"grid20", func(int) int64 { return 1 << 20 }, 20},
	// wide: HE's widest bound (one value a coefficient), masking's widest
	// grid (the run's range with no DP grid: what rounds use by default).
	{"wide", BoundFor, 0},
}

func benchRound(b *testing.B, dim, n int, lay layout) {
	if testing.Short() && (dim > 10_000 || n > 3) {
		b.Skipf("-short: d=%d, n=%d skipped (d=10000, n=3 runs the same code)", dim, n)
	}
	p, keys := testRound(b, n, dim, lay.bound(n))
	inputs := randInputs(b, n, dim, p.Bound)
	var he, mask costs
	for b.Loop() {
		mask.keep(maskRound(b, p, keys, inputs, lay.gridBits))
		he.keep(heRound(b, p, keys, inputs))
	}
	ratio := func(x, y time.Duration) float64 { return float64(x) / float64(y) }
	b.ReportMetric(float64(he.encrypt.Microseconds())/1000/float64(n), "he-encrypt-ms/site")
	b.ReportMetric(float64(mask.encrypt.Microseconds())/1000/float64(n), "mask-ms/site")
	b.ReportMetric(ratio(he.encrypt, mask.encrypt), "encrypt-x-masking")
	b.ReportMetric(float64(he.add.Microseconds())/1000, "he-add-ms")
	b.ReportMetric(ratio(he.add, mask.add), "add-x-masking")
	b.ReportMetric(float64(he.decrypt.Microseconds())/1000, "he-decrypt-ms")
	b.ReportMetric(ratio(he.decrypt, mask.decrypt), "decrypt-x-masking")
	b.ReportMetric(float64(he.site.Microseconds())/1000/float64(n), "he-site-cpu-ms/site")
	b.ReportMetric(float64(mask.site.Microseconds())/1000/float64(n), "mask-site-cpu-ms/site")
	b.ReportMetric(ratio(he.site, mask.site), "site-cpu-x-masking")
	b.ReportMetric(he.maxBytes()/1e6, "he-MB/site-max")
	b.ReportMetric(mask.maxBytes()/1e6, "mask-MB/site-max")
	b.ReportMetric(he.maxBytes()/mask.maxBytes(), "bytes-max-x-masking")
	b.ReportMetric(he.meanBytes()/mask.meanBytes(), "bytes-mean-x-masking")
	b.ReportMetric(float64(p.Lanes()), "lanes")
}

// timed adds the CPU time f takes to *d.
func timed(d *time.Duration, f func()) {
	t0 := cpuNow()
	f()
	*d += cpuNow() - t0
}

// timed2 is timed counting f's time on two counters (a site's work that
// is also part of a phase).
func timed2(d, e *time.Duration, f func()) {
	var el time.Duration
	timed(&el, f)
	*d += el
	*e += el
}

func heRound(b *testing.B, p Params, keys []ed25519.PrivateKey, inputs [][]int64) costs {
	c := costs{bytes: make([]int, len(keys))}
	count := c.count
	agg := must(NewAggregator(p))
	parties := make([]*Party, len(keys))
	for i, m := range p.Members {
		parties[i] = must(NewParty(p, m.ID, keys[i]))
		if err := agg.AddAdvert(must(ParseAdvert(count(i, must(must(parties[i].Advertise()).Marshal()))))); err != nil {
			b.Fatal(err)
		}
	}
	ksb := must(must(agg.EndAdvertise()).Marshal())
	c.countAll(ksb)
	var keying time.Duration // the sites' key sharing, part of their CPU
	for i := range parties {
		var sh []byte
		timed(&keying, func() { sh = must(must(parties[i].Share(must(ParseKeySet(ksb)))).Marshal()) })
		if err := agg.AddShares(must(ParseShares(count(i, sh)))); err != nil {
			b.Fatal(err)
		}
	}
	dels := must(agg.EndShare())
	for i := range parties {
		db := count(i, must(dels[i].Marshal()))
		var ct *Ciphertext
		timed(&c.encrypt, func() { ct = must(parties[i].Encrypt(must(ParseDelivery(db)), inputs[i])) })
		cb := count(i, must(ct.Marshal()))
		timed(&c.add, func() {
			if err := agg.AddCiphertext(must(ParseCiphertext(cb))); err != nil {
				b.Fatal(err)
			}
		})
	}
	c.site = keying + c.encrypt
	req := must(agg.EndEncrypt())
	rb := must(req.Marshal())
	for _, s := range req.Decryptors {
		i := index(p, s)
		count(i, rb)
		var sb []byte
		timed2(&c.decrypt, &c.site, func() { sb = must(must(parties[i].Decrypt(must(ParseDecryptRequest(rb)))).Marshal()) })
		count(i, sb)
		timed(&c.decrypt, func() {
			if err := agg.AddDecryptShare(must(ParseDecryptShare(sb))); err != nil {
				b.Fatal(err)
			}
		})
	}
	timed(&c.decrypt, func() {
		if res, _, err := agg.EndDecrypt(); err != nil || res == nil {
			b.Fatal(err)
		}
	})
	return c
}

func index(p Params, site string) int {
	for i, m := range p.Members {
		if m.ID == site {
			return i
		}
	}
	panic(site)
}

// maskRound runs the same vectors through pairwise masking with clip 1 on
// a grid of gridBits fraction bits (0: the widest), which holds the same
// integers.
func maskRound(b *testing.B, hp Params, keys []ed25519.PrivateKey, inputs [][]int64, gridBits int) costs {
	c := costs{bytes: make([]int, len(keys))}
	count := c.count
	p := secagg.Params{Round: hp.Round, Members: hp.Members, Dim: hp.Dim, Clip: 1, GridBits: gridBits}
	srv := must(secagg.NewServer(p))
	cl := make([]*secagg.Client, len(keys))
	for i, m := range p.Members {
		cl[i] = must(secagg.NewClient(p, m.ID, keys[i]))
		if err := srv.AddAdvert(must(secagg.ParseAdvert(count(i, must(must(cl[i].Advertise()).Marshal()))))); err != nil {
			b.Fatal(err)
		}
	}
	ksb := must(must(srv.EndAdvertise()).Marshal())
	c.countAll(ksb)
	var keying time.Duration // the sites' key sharing, part of their CPU
	for i := range cl {
		var sh []byte
		timed(&keying, func() { sh = must(must(cl[i].ShareKeys(must(secagg.ParseKeySet(ksb)))).Marshal()) })
		if err := srv.AddShares(must(secagg.ParseShares(count(i, sh)))); err != nil {
			b.Fatal(err)
		}
	}
	dels := must(srv.EndShare())
	for i := range cl {
		db := count(i, must(dels[i].Marshal()))
		var m *secagg.MaskedInput
		timed(&c.encrypt, func() { m = must(cl[i].MaskEncoded(must(secagg.ParseShareDelivery(db)), inputs[i], 0)) })
		mb := count(i, must(m.Marshal()))
		timed(&c.add, func() {
			if err := srv.AddMaskedInput(must(secagg.ParseMaskedInput(mb))); err != nil {
				b.Fatal(err)
			}
		})
	}
	c.site = keying + c.encrypt
	req := must(srv.EndMask())
	c.countAll(must(req.Marshal()))
	// The consistency round secure aggregation requires before any
	// unmasking (SC6011 without it): every survivor signs the set.
	for i := range cl {
		var sb []byte
		timed2(&c.decrypt, &c.site, func() {
			sb = must(must(cl[i].SignSurvivors(must(secagg.ParseUnmaskRequest(must(req.Marshal()))))).Marshal())
		})
		count(i, sb)
		if err := srv.AddSignature(must(secagg.ParseSurvivorSig(sb))); err != nil {
			b.Fatal(err)
		}
	}
	rb := must(must(srv.EndConsistency()).Marshal())
	c.countAll(rb)
	for i := range cl {
		var ub []byte
		timed2(&c.decrypt, &c.site, func() { ub = must(must(cl[i].Unmask(must(secagg.ParseUnmaskRequest(rb)))).Marshal()) })
		count(i, ub)
		timed(&c.decrypt, func() {
			if err := srv.AddUnmasking(must(secagg.ParseUnmasking(ub))); err != nil {
				b.Fatal(err)
			}
		})
	}
	timed(&c.decrypt, func() {
		if _, err := srv.Finish(); err != nil {
			b.Fatal(err)
		}
	})
	return c
}
