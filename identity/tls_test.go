package identity

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
)

// world is a federation of two aggregators, a silo and a worker, plus an
// outsider whose own (forged) federation file lists it next to agg-1.
type world struct {
	t                                  *testing.T
	agg1, agg2, silo, worker, outsider *Identity
	fed, outsiderFed                   *Federation
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, agg1: seeded(11), agg2: seeded(12), silo: seeded(13), worker: seeded(14), outsider: seeded(15)}
	src := fmt.Sprintf(`federation: test
regime: consortium
members:
  - {name: agg-1, role: aggregator, public_key: %s, address: "127.0.0.1:1"}
  - {name: agg-2, role: aggregator, public_key: %s, address: "127.0.0.1:2"}
  - {name: silo-a, role: silo, public_key: %s}
  - {name: w1, role: worker, public_key: %s}
`, w.agg1.Public(), w.agg2.Public(), w.silo.Public(), w.worker.Public())
	var err error
	if w.fed, err = ParseFederation("fed.yaml", []byte(src)); err != nil {
		t.Fatal(err)
	}
	forged := fmt.Sprintf(`federation: test
regime: consortium
members:
  - {name: agg-1, role: aggregator, public_key: %s, address: "127.0.0.1:1"}
  - {name: silo-a, role: silo, public_key: %s}
`, w.agg1.Public(), w.outsider.Public())
	if w.outsiderFed, err = ParseFederation("forged.yaml", []byte(forged)); err != nil {
		t.Fatal(err)
	}
	return w
}

// serve accepts connections with cfg; each accepted handshake's outcome is
// sent on the returned channel (the peer's name, or the error).
func serve(t *testing.T, fed *Federation, cfg *tls.Config) (addr string, results <-chan string) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				tc.SetDeadline(time.Now().Add(10 * time.Second))
				if err := tc.Handshake(); err != nil {
					ch <- "error: " + err.Error()
					return
				}
				cs := tc.ConnectionState()
				m, ok := fed.Peer(&cs)
				if !ok {
					ch <- "error: no peer"
					return
				}
				fmt.Fprintf(tc, "hello %s\n", m.Name)
				ch <- m.Name
			}()
		}
	}()
	return ln.Addr().String(), ch
}

// dial connects with cfg and reads the server's greeting; it returns the
// greeting or the client-side error, and the server's view.
func dial(t *testing.T, addr string, cfg *tls.Config, results <-chan string) (client, server string) {
	t.Helper()
	d := &net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		client = "error: " + err.Error()
	} else {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil {
			client = "error: " + err.Error()
		} else {
			client = strings.TrimSpace(string(b))
		}
		c.Close()
	}
	select {
	case server = <-results:
	case <-time.After(10 * time.Second):
		t.Fatal("server never finished the handshake")
	}
	return client, server
}

func (w *world) must(cfg *tls.Config, err error) *tls.Config {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
	return cfg
}

func TestTLSMemberAccepted(t *testing.T) {
	w := newWorld(t)
	addr, res := serve(t, w.fed, w.must(ServerTLSConfig(w.agg1, w.fed)))
	for _, who := range []struct {
		id   *Identity
		name string
	}{{w.silo, "silo-a"}, {w.worker, "w1"}, {w.agg2, "agg-2"}} {
		cfg := w.must(ClientTLSConfig(who.id, w.fed, "agg-1"))
		client, server := dial(t, addr, cfg, res)
		if client != "hello "+who.name || server != who.name {
			t.Fatalf("%s: client %q, server %q", who.name, client, server)
		}
	}
	// Any aggregator, by role.
	cfg := w.must(ClientTLSConfig(w.worker, w.fed, "", Aggregator))
	if client, _ := dial(t, addr, cfg, res); client != "hello w1" {
		t.Fatalf("by role: %q", client)
	}
}

func TestTLSUnknownKeyRefused(t *testing.T) {
	w := newWorld(t)
	addr, res := serve(t, w.fed, w.must(ServerTLSConfig(w.agg1, w.fed)))
	cfg := w.must(ClientTLSConfig(w.outsider, w.outsiderFed, "agg-1"))
	client, server := dial(t, addr, cfg, res)
	if !strings.HasPrefix(client, "error:") || !strings.Contains(client, "bad certificate") {
		t.Fatalf("outsider got %q", client)
	}
	if !strings.Contains(server, ErrUnknownPeer.Error()) {
		t.Fatalf("server saw %q", server)
	}

	// The other way round: a member dialling a server whose key is not listed.
	oaddr, ores := serve(t, w.outsiderFed, w.must(ServerTLSConfig(w.outsider, w.outsiderFed)))
	client, _ = dial(t, oaddr, w.must(ClientTLSConfig(w.agg1, w.fed, "")), ores)
	if !strings.Contains(client, ErrUnknownPeer.Error()) {
		t.Fatalf("member reached an outsider: %q", client)
	}
}

// A client that presents a member's certificate without its private key
// fails TLS 1.3's CertificateVerify.
func TestTLSStolenCertificateRefused(t *testing.T) {
	w := newWorld(t)
	addr, res := serve(t, w.fed, w.must(ServerTLSConfig(w.agg1, w.fed)))
	siloCert, err := selfSigned(w.silo.keys(), "silo-a", "test", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	forged := &tls.Certificate{Certificate: siloCert.Certificate, PrivateKey: w.outsider.PrivateKey()}
	cfg := w.must(ClientTLSConfig(w.outsider, w.outsiderFed, "agg-1"))
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return forged, nil }
	client, server := dial(t, addr, cfg, res)
	if !strings.HasPrefix(client, "error:") || !strings.HasPrefix(server, "error:") {
		t.Fatalf("stolen certificate: client %q, server %q", client, server)
	}
}

func TestTLSRoles(t *testing.T) {
	w := newWorld(t)
	// Raft-like: only aggregators may connect.
	addr, res := serve(t, w.fed, w.must(ServerTLSConfig(w.agg1, w.fed, Aggregator)))
	client, server := dial(t, addr, w.must(ClientTLSConfig(w.silo, w.fed, "agg-1")), res)
	if !strings.HasPrefix(client, "error:") || !strings.Contains(server, ErrPeerRole.Error()) {
		t.Fatalf("silo on an aggregator-only server: client %q, server %q", client, server)
	}
	client, _ = dial(t, addr, w.must(ClientTLSConfig(w.agg2, w.fed, "", Aggregator)), res)
	if client != "hello agg-2" {
		t.Fatalf("aggregator refused: %q", client)
	}

	// A client that requires an aggregator refuses a silo's server, and one
	// that dialled agg-1 refuses agg-2.
	saddr, sres := serve(t, w.fed, w.must(ServerTLSConfig(w.silo, w.fed)))
	client, _ = dial(t, saddr, w.must(ClientTLSConfig(w.worker, w.fed, "", Aggregator)), sres)
	if !strings.Contains(client, ErrPeerRole.Error()) {
		t.Fatalf("client reached a silo as an aggregator: %q", client)
	}
	a2addr, a2res := serve(t, w.fed, w.must(ServerTLSConfig(w.agg2, w.fed)))
	client, _ = dial(t, a2addr, w.must(ClientTLSConfig(w.worker, w.fed, "agg-1")), a2res)
	if !strings.Contains(client, ErrUnexpectedPeer.Error()) {
		t.Fatalf("client dialled agg-1 and accepted agg-2: %q", client)
	}
}

func TestTLS12Refused(t *testing.T) {
	w := newWorld(t)
	addr, res := serve(t, w.fed, w.must(ServerTLSConfig(w.agg1, w.fed)))
	cfg := w.must(ClientTLSConfig(w.silo, w.fed, "agg-1"))
	cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	client, server := dial(t, addr, cfg, res)
	if !strings.HasPrefix(client, "error:") || !strings.Contains(server, "version") {
		t.Fatalf("TLS 1.2 client: client %q, server %q", client, server)
	}

	// And a TLS 1.2-only server is refused by our client.
	srvCfg := w.must(ServerTLSConfig(w.agg1, w.fed))
	srvCfg.MinVersion, srvCfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	addr, res = serve(t, w.fed, srvCfg)
	client, _ = dial(t, addr, w.must(ClientTLSConfig(w.silo, w.fed, "agg-1")), res)
	if !strings.HasPrefix(client, "error:") {
		t.Fatalf("client accepted TLS 1.2: %q", client)
	}
}

func TestTLSConfigNeedsMembership(t *testing.T) {
	w := newWorld(t)
	_, err := ServerTLSConfig(w.outsider, w.fed)
	wantCode(t, err, diag.NotAMember)
	_, err = ClientTLSConfig(w.outsider, w.fed, "agg-1")
	wantCode(t, err, diag.NotAMember)
	_, err = ClientTLSConfig(w.silo, w.fed, "agg-9")
	wantCode(t, err, diag.NotAMember)
}

func TestPeerFromRequest(t *testing.T) {
	w := newWorld(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		TLSConfig: w.must(ServerTLSConfig(w.agg1, w.fed)),
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			m, ok := w.fed.PeerFromRequest(r)
			if !ok {
				http.Error(rw, "who?", http.StatusUnauthorized)
				return
			}
			fmt.Fprintf(rw, "%s %s", m.Name, m.Role)
		}),
		ErrorLog: log.New(io.Discard, "", 0), // refused handshakes are expected
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })

	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: w.must(ClientTLSConfig(w.silo, w.fed, "agg-1"))},
	}
	resp, err := client.Get("https://" + ln.Addr().String() + "/whoami")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "silo-a silo" {
		t.Fatalf("got %q", b)
	}

	outsider := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: w.must(ClientTLSConfig(w.outsider, w.outsiderFed, "agg-1"))},
	}
	if resp, err := outsider.Get("https://" + ln.Addr().String() + "/whoami"); err == nil {
		resp.Body.Close()
		t.Fatalf("outsider got an HTTP answer: %s", resp.Status)
	}

	if _, ok := w.fed.PeerFromRequest(&http.Request{}); ok {
		t.Fatal("a request without TLS has a peer")
	}
}

func TestCertificateRenewal(t *testing.T) {
	w := newWorld(t)
	src, err := newCertSource(w.agg1, w.fed)
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := src.get()
	if c1.Leaf.Subject.CommonName != "agg-1" || c1.Leaf.Subject.Organization[0] != "test" {
		t.Fatalf("subject %v", c1.Leaf.Subject)
	}
	if c2, _ := src.get(); c2 != c1 {
		t.Fatal("certificate regenerated before half-life")
	}
	src.mu.Lock()
	src.renewAt = time.Now().Add(-time.Second)
	src.mu.Unlock()
	c3, _ := src.get()
	if c3 == c1 || !c3.Leaf.NotAfter.After(c1.Leaf.NotAfter.Add(-time.Second)) {
		t.Fatal("certificate not renewed")
	}
}
