package aggregator

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/trust"
)

// A client that trickles a request body (the one byte every 5 s)
// is cut off at the body deadline instead of holding a connection forever.
func TestSlowBodyIsCutOff(t *testing.T) {
	p := newTestPool(t, trust.Own, 1, Options{BodyTimeout: time.Second})
	cfg, err := identity.ClientTLSConfig(p.ids["w1"], p.fed, "agg-1", identity.Aggregator)
	if err != nil {
		t.Fatal(err)
	}
	agg, _ := p.fed.Member("agg-1")
	addr := agg.Address
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const declared = 1000
	fmt.Fprintf(conn, "POST /v1/results HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", addr, declared)

	// The server answers (or closes) once the deadline passes; until then
	// the client keeps trickling.
	answered := make(chan *http.Response, 1)
	go func() {
		resp, _ := http.ReadResponse(bufio.NewReader(conn), nil)
		answered <- resp
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	sent := 0
	for {
		select {
		case resp := <-answered:
			if resp != nil && resp.StatusCode < 400 {
				t.Fatalf("slow body accepted: %s", resp.Status)
			}
			if sent >= declared {
				t.Fatalf("the whole body was read before the server gave up")
			}
			return
		case <-tick.C:
			if sent < declared {
				if _, err := conn.Write([]byte{' '}); err == nil {
					sent++
				}
			}
		case <-time.After(2 * time.Minute): // hang detector only
			t.Fatal("the server never cut the slow client off")
		}
	}
}
