package dataplane

import (
	"errors"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/pion/sctp"
	"github.com/pion/webrtc/v4"
)

// Large SCTP packets on loopback.
//
// pion/webrtc builds every SCTP association with a 1191-byte MTU (its
// sctpOutboundMTU, a constant: the safe size through any path, relays and
// IPv6 tunnels included), so each ~1.1 kB of a blob is its own SCTP
// packet, DTLS record and system call on both ends. On a loopback pair
// nothing on the path needs packets that small: the loopback interface
// carries 64 KiB datagrams. There the cost per packet, not per byte,
// bounded the data plane (about 30 ns of CPU per byte, against 4-6 for
// HTTPS; docs/dataplane.md, "Throughput").
//
// So when the ICE pair of a connection is host to host on loopback
// addresses, and the remote said in its SDP that it reads packets this
// large, each end raises its association's outbound MTU to maxLoopbackMTU.
// The largest is set by pion's readers, not by the network: pion/dtls
// reads a datagram into an 8192-byte buffer (its inboundBufferSize) and
// pion/sctp a DTLS record into another (its receiveMTU), so a datagram
// (an SCTP packet, a 13-byte DTLS header, an 8-byte explicit nonce and a
// 16-byte AES-GCM tag) must stay within 8192 bytes.
const (
	// pionMTU is pion/webrtc's SCTP packet size, used everywhere else.
	pionMTU = 1191
	// maxLoopbackMTU is the SCTP packet size used on a loopback pair.
	maxLoopbackMTU = 8192 - 64
	// receiveMTU is the ICE read buffer per datagram (pion's default,
	// 1460, would truncate a large packet): at least maxLoopbackMTU plus
	// the DTLS record overhead.
	receiveMTU = 8192
	// sdpMTUAttr is the SDP attribute in which a member says how large an
	// SCTP packet it reads. Peers that do not know it ignore it (as any
	// unknown attribute) and are sent 1191-byte packets.
	sdpMTUAttr = "a=x-scellis-sctp-mtu:"
)

// withMTU adds this peer's readable SCTP packet size to an SDP it sends
// to another member (offer or answer). The attribute is not covered by
// the fingerprint signature: one who alters it in transit can only make
// the transfer fail over to HTTPS, which dropping the signal does too.
func withMTU(sdp string) string {
	if !strings.HasSuffix(sdp, "\n") {
		sdp += "\r\n"
	}
	return sdp + sdpMTUAttr + strconv.Itoa(maxLoopbackMTU) + "\r\n"
}

// sdpMTU is the SCTP packet size a remote SDP says its peer reads: 0
// when it says nothing (another build of Scellis, a browser).
func sdpMTU(sdp string) uint32 {
	for line := range strings.Lines(sdp) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), sdpMTUAttr); ok {
			n, err := strconv.ParseUint(v, 10, 32)
			if err == nil {
				return uint32(n)
			}
		}
	}
	return 0
}

// loopbackPair reports whether ICE selected a host pair on loopback
// addresses at both ends: no relay, no NAT, no real network in between.
func loopbackPair(pair *webrtc.ICECandidatePair) bool {
	if pair == nil || pair.Local == nil || pair.Remote == nil {
		return false
	}
	for _, c := range []*webrtc.ICECandidate{pair.Local, pair.Remote} {
		if c.Typ == webrtc.ICECandidateTypeRelay {
			return false
		}
		if ip := net.ParseIP(c.Address); ip == nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}

// raiseSCTPMTU sets the outbound MTU of t's association to mtu, as
// pion/sctp's own WithMTU option would have at its creation. pion/webrtc
// offers no setting for it, so this reaches the fields through reflect:
// the transport's association (under the transport's lock) and the
// association's mtu and maxPayloadSize (under the association's lock,
// which its writers hold to read them; mtu is also read atomically). It
// answers an error, and changes nothing, when the association is not up
// yet or the fields are not the ones expected (another pion version):
// the connection then keeps its 1191-byte packets, and
// TestLoopbackRaisesSCTPMTU fails.
func raiseSCTPMTU(t *webrtc.SCTPTransport, mtu uint32) error {
	if t == nil {
		return errors.New("no SCTP transport")
	}
	tv := reflect.ValueOf(t).Elem()
	tlock, ok := fieldPtr[sync.RWMutex](tv, "lock")
	assocField, ok2 := fieldPtr[*sctp.Association](tv, "sctpAssociation")
	if !ok || !ok2 {
		return errors.New("pion/webrtc's SCTPTransport has no lock and sctpAssociation fields")
	}
	tlock.RLock()
	a := *assocField
	tlock.RUnlock()
	if a == nil {
		return errors.New("the SCTP association is not up yet")
	}
	av := reflect.ValueOf(a).Elem()
	alock, ok := fieldPtr[sync.RWMutex](av, "lock")
	mtuField, ok2 := fieldPtr[uint32](av, "mtu")
	maxPayload, ok3 := fieldPtr[uint32](av, "maxPayloadSize")
	interleaving, ok4 := fieldPtr[bool](av, "useInterleaving")
	if !ok || !ok2 || !ok3 || !ok4 {
		return errors.New("pion/sctp's Association has no lock, mtu, maxPayloadSize and useInterleaving fields")
	}
	alock.Lock()
	defer alock.Unlock()
	// pion/sctp's maxPayloadSizeForMTU: the common header and one DATA
	// (or I-DATA) chunk header, rounded down to SCTP's 4-byte padding.
	header := uint32(12 + 16)
	if *interleaving {
		header = 12 + 20
	}
	payload := mtu - header
	atomic.StoreUint32(mtuField, mtu)
	*maxPayload = payload - payload%4
	return nil
}

// fieldPtr returns a pointer to v's field name when it has type T.
func fieldPtr[T any](v reflect.Value, name string) (*T, bool) {
	f := v.FieldByName(name)
	if !f.IsValid() || f.Type() != reflect.TypeFor[T]() || !f.CanAddr() {
		return nil, false
	}
	return (*T)(unsafe.Pointer(f.UnsafeAddr())), true
}
