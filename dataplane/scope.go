package dataplane

import (
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/scellis/scellis/identity"
)

// Where a peer's ICE candidates come from follows the federation file:
// the members' addresses say which networks the federation lives on, and
// a candidate on any other network only costs connectivity checks that
// cannot succeed — or, on one machine, makes two processes talk through
// the machine's own LAN address instead of loopback (issue 29).
//
//   - Every member address is loopback (federation init --hosts 127.0.0.1,
//     tests, the demo): loopback candidates only, no mDNS, and no STUN or
//     TURN server off this machine. It works in a network namespace that
//     has only lo, and never shows another address of the machine.
//   - The addresses are IP literals, not all loopback: no loopback
//     candidate (it would be another machine's loopback to the peer), and
//     host candidates only on the interfaces the kernel routes the members'
//     addresses through — a docker bridge or a VPN the federation is not
//     on is left out. If that leaves no IPv4 address (the only kind ICE
//     gathers here), every interface is used, as before.
//   - Some address is a hostname: every non-loopback interface, as before
//     (resolving names here would tie the choice to one DNS answer).
//
// Config.Loopback (p2p_loopback) still forces the first case, for a
// federation whose hostnames resolve to loopback.

// scope is the part of the network a peer gathers candidates on.
type scope struct {
	loopback bool
	// dsts are the members' addresses when every one is an IP literal
	// and none is loopback: candidates come from the interfaces routing
	// to them. Empty: every non-loopback interface.
	dsts []netip.AddrPort

	mu     sync.Mutex
	ifaces map[string]bool // interfaces routing to dsts; nil: any
	at     time.Time       // when ifaces was computed
}

// scopeOf reads the federation's member addresses; force is p2p_loopback.
func scopeOf(fed *identity.Federation, force bool) *scope {
	if force {
		return &scope{loopback: true}
	}
	var dsts []netip.AddrPort
	loopback, literal := 0, true
	for _, m := range fed.Current() {
		if m.Address == "" {
			continue
		}
		host, port, err := net.SplitHostPort(m.Address)
		if err != nil {
			continue // the federation loader refuses these anyway
		}
		if strings.EqualFold(host, "localhost") {
			loopback++ // always loopback (RFC 6761), never another host
			continue
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			literal = false
			continue
		}
		if ip.Unmap().IsLoopback() {
			loopback++
			continue
		}
		p, _ := strconv.Atoi(port)
		dsts = append(dsts, netip.AddrPortFrom(ip.Unmap(), uint16(p)))
	}
	switch {
	case loopback > 0 && len(dsts) == 0 && literal:
		return &scope{loopback: true}
	case literal:
		return &scope{dsts: dsts}
	default:
		return &scope{}
	}
}

// String names the scope for logs.
func (s *scope) String() string {
	switch {
	case s.loopback:
		return "loopback"
	case len(s.dsts) == 0:
		return "every non-loopback interface"
	}
	ifs := s.interfaces()
	if ifs == nil {
		return "every non-loopback interface (none routes to the federation's addresses)"
	}
	names := make([]string, 0, len(ifs))
	for n := range ifs {
		names = append(names, n)
	}
	sort.Strings(names)
	return "interfaces " + strings.Join(names, ", ")
}

// ipOK is the ICE IP filter: loopback addresses in a loopback scope, and
// only there.
func (s *scope) ipOK(ip net.IP) bool { return ip.IsLoopback() == s.loopback }

// interfaceOK is the ICE interface filter.
func (s *scope) interfaceOK(name string) bool {
	ifs := s.interfaces()
	return ifs == nil || ifs[name]
}

// routesTTL is how long a route lookup is reused: the filter is asked for
// every interface at each gathering, and routes change rarely (a VPN
// coming up, a lease renewed), so a minute-old answer will do.
const routesTTL = time.Minute

// interfaces returns the interfaces that route to the scope's addresses,
// or nil for no restriction.
func (s *scope) interfaces() map[string]bool {
	if s.loopback || len(s.dsts) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.at.IsZero() && time.Since(s.at) < routesTTL {
		return s.ifaces
	}
	s.ifaces, s.at = routeInterfaces(s.dsts), time.Now()
	return s.ifaces
}

// routeInterfaces asks the kernel which source address it would use for
// each destination (connecting a UDP socket sends nothing) and returns
// the interfaces holding those addresses; nil when none of them has an
// IPv4 address to gather on, so that no peer is left without candidates.
func routeInterfaces(dsts []netip.AddrPort) map[string]bool {
	srcs := map[netip.Addr]bool{}
	for _, d := range dsts {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(d))
		if err != nil {
			continue // no route (yet): the other addresses decide
		}
		if la, ok := c.LocalAddr().(*net.UDPAddr); ok {
			if a, ok := netip.AddrFromSlice(la.IP); ok {
				srcs[a.Unmap()] = true
			}
		}
		c.Close()
	}
	if len(srcs) == 0 {
		return nil
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	out, v4 := map[string]bool{}, false
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		holds, hasV4 := false, false
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			holds = holds || srcs[ip]
			hasV4 = hasV4 || (ip.Is4() && !ip.IsLoopback())
		}
		if holds {
			out[ifc.Name] = true
			v4 = v4 || hasV4
		}
	}
	if !v4 {
		return nil
	}
	return out
}
