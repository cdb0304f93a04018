package dataplane

import (
	"net"

	"github.com/pion/transport/v5"
	"github.com/pion/transport/v5/stdnet"
)

// socketBuffer is the kernel buffer asked for each ICE socket. SCTP sends
// bursts of ~1.2 kB datagrams; with Linux's default receive buffer (208
// KiB) a reader that is a moment late drops some, and each drop costs a
// retransmission and halves the congestion window (bench_test.go). The
// kernel caps the request at net.core.rmem_max / wmem_max.
var socketBuffer = 4 << 20

// bufNet is the standard network with larger socket buffers.
type bufNet struct{ *stdnet.Net }

func newBufNet() (transport.Net, error) {
	n, err := stdnet.NewNet()
	if err != nil {
		return nil, err
	}
	return bufNet{n}, nil
}

type buffered interface {
	SetReadBuffer(int) error
	SetWriteBuffer(int) error
}

func grow(c any) {
	if b, ok := c.(buffered); ok && socketBuffer > 0 {
		b.SetReadBuffer(socketBuffer)
		b.SetWriteBuffer(socketBuffer)
	}
}

func (n bufNet) ListenPacket(network, address string) (net.PacketConn, error) {
	c, err := n.Net.ListenPacket(network, address)
	if err == nil {
		grow(c)
	}
	return c, err
}

func (n bufNet) ListenUDP(network string, laddr *net.UDPAddr) (transport.UDPConn, error) {
	c, err := n.Net.ListenUDP(network, laddr)
	if err == nil {
		grow(c)
	}
	return c, err
}

func (n bufNet) DialUDP(network string, laddr, raddr *net.UDPAddr) (transport.UDPConn, error) {
	c, err := n.Net.DialUDP(network, laddr, raddr)
	if err == nil {
		grow(c)
	}
	return c, err
}
