package dataplane

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// sctpMTU is the outbound SCTP packet size of peer's connection with
// remote (dialled or answered), as pion reports it.
func sctpMTU(t *testing.T, p *Peer, remote string) uint32 {
	t.Helper()
	p.mu.Lock()
	var found *conn
	for c := range p.open {
		if c.remote == remote {
			found = c
		}
	}
	p.mu.Unlock()
	if found == nil {
		t.Fatalf("%s has no connection with %s", p.cfg.Name, remote)
	}
	found.mu.Lock()
	pc := found.pc
	found.mu.Unlock()
	return pc.SCTP().Stats().MTU
}

// On a loopback pair both ends send large SCTP packets, and blobs cross
// whole both ways (a put, then a get). A remote that does not say it
// reads them (another build: the SDP attribute stripped in transit) is
// sent pion's 1191-byte packets, and so is a relayed pair: a TURN relay
// forwards datagrams of a real network's size only. If a pion upgrade
// moves the fields raiseSCTPMTU sets, the first case fails here (and
// connections keep working with small packets).
func TestLoopbackRaisesSCTPMTU(t *testing.T) {
	srv, err := StartTURN(TURNConfig{Listen: "127.0.0.1:0", RelayIP: net.IPv4(127, 0, 0, 1), AllowPeers: loopbackOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	strip := func(c *Config) {
		c.Signal.(*boxSignaller).alter = func(s *Signal) {
			var kept []string
			for line := range strings.Lines(s.SDP) {
				if !strings.HasPrefix(line, sdpMTUAttr) {
					kept = append(kept, line)
				}
			}
			s.SDP = strings.Join(kept, "")
		}
	}
	relay := func(c *Config) {
		c.Policy = PolicyRelay
		name := c.Name
		c.ICE = func(context.Context) ([]ICEServer, error) { return srv.Credentials(name), nil }
	}
	for _, tc := range []struct {
		name   string
		mod    func(*Config)
		want   uint32
		lookup string // the path both ends report
	}{
		{"loopback", nil, maxLoopbackMTU, PathDirect},
		{"not advertised", strip, pionMTU, PathDirect},
		{"relayed", relay, pionMTU, PathRelayed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fed, ids := testFed(t, "a", "b")
			box := &Mailbox{}
			a := startPeer(t, fed, ids, box, "a", tc.mod)
			b := startPeer(t, fed, ids, box, "b", tc.mod)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			up := randomBlob(t, 3<<20+17) // not a whole number of messages or packets
			ref, err := a.Put(ctx, "b", up)
			if err != nil {
				t.Fatal(err)
			}
			down := randomBlob(t, 2<<20+5)
			downRef, err := b.store.PutBytes(down)
			if err != nil {
				t.Fatal(err)
			}
			got, err := a.Get(ctx, "b", downRef)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, down) {
				t.Fatal("the blob came back different")
			}
			if stored, err := b.store.Get(ref); err != nil || !bytes.Equal(stored, up) {
				t.Fatalf("b stored the put blob wrongly: %v", err)
			}
			if st := statsOf(a.Peer, "b"); st.Path != tc.lookup {
				t.Fatalf("path %q, want %q", st.Path, tc.lookup)
			}
			if got := sctpMTU(t, a.Peer, "b"); got != tc.want {
				t.Errorf("a sends %d-byte SCTP packets to b, want %d", got, tc.want)
			}
			if got := sctpMTU(t, b.Peer, "a"); got != tc.want {
				t.Errorf("b sends %d-byte SCTP packets to a, want %d", got, tc.want)
			}
		})
	}
}

// The SDP attribute round-trips, and an SDP without it (a browser's,
// another build's) or with a malformed one reads as 0: small packets.
func TestSDPMTU(t *testing.T) {
	sdp := "v=0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=sctp-port:5000\r\n"
	if got := sdpMTU(withMTU(sdp)); got != maxLoopbackMTU {
		t.Fatalf("advertised %d, read back %d", maxLoopbackMTU, got)
	}
	if got := sdpMTU(withMTU(strings.TrimSuffix(sdp, "\r\n"))); got != maxLoopbackMTU {
		t.Fatalf("an SDP without a final newline: read back %d", got)
	}
	for _, s := range []string{sdp, sdp + sdpMTUAttr + "lots\r\n", sdp + sdpMTUAttr + "-1\r\n"} {
		if got := sdpMTU(s); got != 0 {
			t.Fatalf("%q: read %d, want 0", s, got)
		}
	}
}
