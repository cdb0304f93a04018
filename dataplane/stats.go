package dataplane

import (
	"sort"
	"sync"
)

// PairStats is what moved between this member and one other, by path.
type PairStats struct {
	Peer string `json:"peer"`
	// Path is the path of the live (or last) data-channel connection:
	// direct, relayed, or https when the last transfer fell back.
	Path string `json:"path"`
	// Candidates is the ICE candidate pair of the last data-channel
	// connection, "<type> <ip>:<port> ↔ <type> <ip>:<port>" (this side
	// first): which addresses the channel used.
	Candidates string `json:"candidates,omitempty"`
	// Bytes moved over each path, both ways.
	DirectBytes  int64 `json:"direct_bytes"`
	RelayedBytes int64 `json:"relayed_bytes"`
	HTTPSBytes   int64 `json:"https_bytes"`
	Transfers    int64 `json:"transfers"`
	Fallbacks    int64 `json:"fallbacks"`    // transfers that went over HTTPS: no data channel up, or it failed
	FailedDials  int64 `json:"failed_dials"` // connection attempts that found no path
	// Connections made with this member (either side dialing), by path.
	DirectConns  int64 `json:"direct_connections"`
	RelayedConns int64 `json:"relayed_connections"`
}

type pairCounter struct {
	mu sync.Mutex
	s  PairStats
}

func (p *Peer) counter(member string) *pairCounter {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.stats[member]
	if !ok {
		c = &pairCounter{s: PairStats{Peer: member}}
		p.stats[member] = c
	}
	return c
}

func (c *pairCounter) connected(path, candidates string) {
	c.mu.Lock()
	c.s.Path, c.s.Candidates = path, candidates
	if path == PathRelayed {
		c.s.RelayedConns++
	} else {
		c.s.DirectConns++
	}
	c.mu.Unlock()
}

func (c *pairCounter) failedDial() {
	c.mu.Lock()
	c.s.FailedDials++
	c.mu.Unlock()
}

func (c *pairCounter) moved(path string, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.s.Transfers++
	switch path {
	case PathDirect:
		c.s.DirectBytes += n
		c.s.Path = path
	case PathRelayed:
		c.s.RelayedBytes += n
		c.s.Path = path
	case PathHTTPS:
		c.s.HTTPSBytes += n
		c.s.Fallbacks++
		c.s.Path = PathHTTPS
	}
}

// RecordHTTPS counts a transfer with member that fell back to HTTPS.
func (p *Peer) RecordHTTPS(member string, n int64) { p.counter(member).moved(PathHTTPS, n) }

// Stats returns the counters of every member this peer moved blobs
// with, by name.
func (p *Peer) Stats() []PairStats {
	p.mu.Lock()
	cs := make([]*pairCounter, 0, len(p.stats))
	for _, c := range p.stats {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	out := make([]PairStats, 0, len(cs))
	for _, c := range cs {
		c.mu.Lock()
		out = append(out, c.s)
		c.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Peer < out[j].Peer })
	return out
}
