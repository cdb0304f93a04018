package dataplane

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"

	"testing"
	"time"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/content"
)

// Throughput of one blob transfer on loopback, as a ratio against raw TCP
// measured in the same run (BenchmarkTransfer/tcp). Run with
//
//	go test ./dataplane -run XXX -bench . -benchtime 3x
//
// Each sub-benchmark reports MB/s (b.SetBytes) and vs_tcp: its throughput
// divided by raw TCP's for the same size.
func BenchmarkTransfer(b *testing.B) {
	tcp := map[int]float64{}
	for _, size := range []int{8 << 20, 64 << 20} {
		data := randomBlob(b, size)
		ref := content.Hash(data)
		label := fmt.Sprintf("%dMB", size>>20)
		b.Run("tcp/"+label, func(b *testing.B) {
			tcp[size] = measure(b, size, tcpTransfer(b, data))
		})
		b.Run("https/"+label, func(b *testing.B) {
			report(b, tcp[size], measure(b, size, httpsTransfer(b, data, ref)))
		})
		b.Run("direct/"+label, func(b *testing.B) {
			report(b, tcp[size], measure(b, size, dcTransfer(b, data, ref, nil)))
		})
		b.Run("turn/"+label, func(b *testing.B) {
			srv, err := StartTURN(TURNConfig{Listen: "127.0.0.1:0", RelayIP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			relay := func(c *Config) {
				c.Policy = PolicyRelay
				name := c.Name
				c.ICE = func(context.Context) ([]ICEServer, error) { return srv.Credentials(name), nil }
			}
			report(b, tcp[size], measure(b, size, dcTransfer(b, data, ref, relay)))
		})
	}
}

// measure runs fn b.N times and returns bytes per second.
func measure(b *testing.B, size int, fn func()) float64 {
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		fn()
	}
	return float64(size) * float64(b.N) / time.Since(start).Seconds()
}

func report(b *testing.B, tcp, got float64) {
	if tcp > 0 {
		b.ReportMetric(got/tcp, "vs_tcp")
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
// against raw TCP in the same run:
//
//	go test ./dataplane -run XXX -bench Tuning -benchtime 3x
func BenchmarkTuning(b *testing.B) {
	const size = 8 << 20
	data := randomBlob(b, size)
	ref := content.Hash(data)
	var tcp float64
	b.Run("tcp", func(b *testing.B) { tcp = measure(b, size, tcpTransfer(b, data)) })
	saved, savedBuf, savedHigh, savedLow := tuning, socketBuffer, highWater, lowWater
	defer func() { tuning, socketBuffer, highWater, lowWater = saved, savedBuf, savedHigh, savedLow }()
	for _, v := range []struct {
		name string
		set  func()
		mod  func(*Config)
	}{
		{"default", func() {}, nil},
		{"crc32c", func() { tuning.zeroChecksum = false }, nil},
		{"recv1MB", func() { tuning.recvBuffer = 1 << 20 }, nil},
		{"sockbuf-kernel-default", func() { socketBuffer = 0 }, nil},
		{"buffered-256k", func() { highWater, lowWater = 256<<10, 64<<10 }, nil},
		{"chunk16k", func() {}, func(c *Config) { c.Chunk = 16 << 10 }},
	} {
		b.Run(v.name, func(b *testing.B) {
			tuning, socketBuffer, highWater, lowWater = saved, savedBuf, savedHigh, savedLow
			v.set()
			report(b, tcp, measure(b, size, dcTransfer(b, data, ref, v.mod)))
		})
	}
}
