package dataplane

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/content"
)

// Throughput of one blob transfer on loopback, as ratios against raw
// TCP and against the HTTPS blob endpoint, both measured in the same run
// (BenchmarkTransfer/tcp and /https). Run with
//
//	go test -run '^$' -bench Transfer -benchtime 3x ./dataplane/
//
// Each sub-benchmark reports MB/s (b.SetBytes) and cpu_ns/B (measure);
// https, direct and turn also vs_tcp, their throughput divided by raw
// TCP's for the same size, and direct and turn vs_https, divided by the
// HTTPS endpoint's. Under -short (CI runs every benchmark once that way)
// the 64 MB transfers skip: 8 MB takes the same paths.
func BenchmarkTransfer(b *testing.B) {
	tcp, https := map[int]float64{}, map[int]float64{}
	for _, size := range []int{8 << 20, 64 << 20} {
		label := fmt.Sprintf("%dMB", size>>20)
		var data []byte
		var ref content.Ref
		// run is b.Run, skipping under -short a size above 8 MB (before
		// its blob is made).
		run := func(name string, f func(b *testing.B)) {
			b.Run(name+"/"+label, func(b *testing.B) {
				if testing.Short() && size > 8<<20 {
					b.Skipf("-short: %s skipped (8 MB takes the same path)", label)
				}
				if data == nil {
					data = randomBlob(b, size)
					ref = content.Hash(data)
				}
				f(b)
			})
		}
		run("tcp", func(b *testing.B) {
			tcp[size] = measure(b, size, tcpTransfer(b, data))
		})
		run("https", func(b *testing.B) {
			https[size] = measure(b, size, httpsTransfer(b, data, ref))
			ratio(b, https[size], tcp[size], "vs_tcp")
		})
		run("direct", func(b *testing.B) {
			got := measure(b, size, dcTransfer(b, data, ref, nil))
			ratio(b, got, tcp[size], "vs_tcp")
			ratio(b, got, https[size], "vs_https")
		})
		run("turn", func(b *testing.B) {
			srv, err := StartTURN(TURNConfig{Listen: "127.0.0.1:0", RelayIP: net.IPv4(127, 0, 0, 1), AllowPeers: loopbackOnly, BandwidthBytes: 1 << 30})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			relay := func(c *Config) {
				c.Policy = PolicyRelay
				name := c.Name
				c.ICE = func(context.Context) ([]ICEServer, error) { return srv.Credentials(name), nil }
			}
			got := measure(b, size, dcTransfer(b, data, ref, relay))
			ratio(b, got, tcp[size], "vs_tcp")
			ratio(b, got, https[size], "vs_https")
		})
	}
}

// measure runs fn b.N times and returns bytes per second. It also
// reports cpu_ns/B, the CPU time (user and system, both ends: they share
// this process) per byte moved — the ceiling on a machine of n free cores
// is n·10⁹/cpu_ns/B bytes per second, whatever the tuning of windows.
func measure(b *testing.B, size int, fn func()) float64 {
	b.SetBytes(int64(size))
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	for range b.N {
		fn()
	}
	elapsed := time.Since(start)
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(size*b.N), "cpu_ns/B")
	return float64(size) * float64(b.N) / elapsed.Seconds()
}

// cpuTime is the process's CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ratio reports got/base as unit, when the baseline ran (it did not when
// -bench selects this sub-benchmark alone).
func ratio(b *testing.B, got, base float64, unit string) {
	if base > 0 {
		b.ReportMetric(got/base, unit)
	}
}

// tcpTransfer: the bytes over one loopback TCP connection, no TLS.
func tcpTransfer(b *testing.B, data []byte) func() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write(data)
			c.Close()
		}
	}()
	return func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || len(got) != len(data) {
			b.Fatalf("tcp: %d bytes, %v", len(got), err)
		}
	}
}

// httpsTransfer: GET of the blob from the HTTPS blob endpoint (TLS, HTTP/2
// as the aggregator serves it), hash checked as api.Client does.
func httpsTransfer(b *testing.B, data []byte, ref content.Ref) func() {
	store, err := blob.Open(b.TempDir(), 0)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := store.PutBytes(data); err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(blob.Handler(store, func(http.ResponseWriter, *http.Request) bool { return true }))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	b.Cleanup(srv.Close)
	client := srv.Client()
	return func() {
		resp, err := client.Get(srv.URL + "/blobs/" + string(ref))
		if err != nil {
			b.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || content.Hash(got) != ref {
			b.Fatalf("https: %d bytes, %v", len(got), err)
		}
	}
}

// dcTransfer: Get of the blob over a data channel (connection set up
// once, before the timer), hash checked.
func dcTransfer(b *testing.B, data []byte, ref content.Ref, mod func(*Config)) func() {
	fed, ids := testFed(b, "a", "b")
	box := &Mailbox{}
	pa := startPeer(b, fed, ids, box, "a", mod)
	pb := startPeer(b, fed, ids, box, "b", mod)
	if _, err := pb.store.PutBytes(data); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := pa.Probe(ctx, "b", 1); err != nil {
		b.Fatal(err)
	}
	return func() {
		if _, err := pa.Get(ctx, "b", ref); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTuning compares SCTP settings for a direct 8 MB transfer, each
// against raw TCP and the HTTPS blob endpoint in the same run:
//
//	go test -run '^$' -bench Tuning -benchtime 3x ./dataplane/
//
// The peers are on loopback, so the loopback settings apply (peer.go's
// tuning, sctpmtu.go). Under -short (CI runs every benchmark once that
// way) every setting moves 1 MB: each still sets up its peers and moves a
// blob.
func BenchmarkTuning(b *testing.B) {
	size := 8 << 20
	if testing.Short() {
		size = 1 << 20
	}
	data := randomBlob(b, size)
	ref := content.Hash(data)
	var tcp, https float64
	b.Run("tcp", func(b *testing.B) { tcp = measure(b, size, tcpTransfer(b, data)) })
	b.Run("https", func(b *testing.B) { https = measure(b, size, httpsTransfer(b, data, ref)) })
	saved, savedBuf, savedHigh, savedLow := tuning, socketBuffer, highWater, lowWater
	defer func() { tuning, socketBuffer, highWater, lowWater = saved, savedBuf, savedHigh, savedLow }()
	for _, v := range []struct {
		name string
		set  func()
		mod  func(*Config)
	}{
		{"default", func() {}, nil},
		{"mtu1191", func() { tuning.loopbackMTU = 0 }, nil},
		{"recv8MB", func() { tuning.loopbackRecvBuffer = 8 << 20 }, nil},
		{"recv256k", func() { tuning.loopbackRecvBuffer = 256 << 10 }, nil},
		{"mincwnd0", func() { tuning.loopbackMinCwnd = 0 }, nil},
		{"mincwnd1MB", func() { tuning.loopbackMinCwnd = 1 << 20 }, nil},
		{"crc32c", func() { tuning.zeroChecksum = false }, nil},
		{"sockbuf-kernel-default", func() { socketBuffer = 0 }, nil},
		{"buffered-256k", func() { highWater, lowWater = 256<<10, 64<<10 }, nil},
		{"buffered-16MB", func() { highWater, lowWater = 16<<20, 8<<20 }, nil},
		{"chunk16k", func() {}, func(c *Config) { c.Chunk = 16 << 10 }},
		{"castep64k", func() { tuning.caStep = 64 << 10 }, nil},
		{"fastrtx1MB", func() { tuning.fastRtxWnd = 1 << 20 }, nil},
	} {
		b.Run(v.name, func(b *testing.B) {
			tuning, socketBuffer, highWater, lowWater = saved, savedBuf, savedHigh, savedLow
			v.set()
			got := measure(b, size, dcTransfer(b, data, ref, v.mod))
			ratio(b, got, tcp, "vs_tcp")
			ratio(b, got, https, "vs_https")
		})
	}
}
