package consensus

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scellis/scellis/internal/testharness"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testharness.Wrap(m)) // nothing outlives the tests (internal/testharness)
}

// ---- identities and pinned TLS configs ----

// testKey is a node identity: an Ed25519 key and a self-signed certificate.
type testKey struct {
	pub  ed25519.PublicKey
	cert tls.Certificate
}

func newTestKey(t testing.TB, name string) *testKey {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	return &testKey{pub: pub, cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv}}
}

// pins is a federation in miniature: the key pinned for each node ID. It
// counts the certificates it refused.
type pins struct {
	mu       sync.Mutex
	keys     map[string]ed25519.PublicKey
	rejected atomic.Int64
}

func newPins() *pins { return &pins{keys: map[string]ed25519.PublicKey{}} }

func (p *pins) pin(id string, k *testKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys[id] = k.pub
}

// check accepts raw's leaf when its key is pinned for id, or for any member
// when id is empty.
func (p *pins) check(raw [][]byte, id string) error {
	err := p.verify(raw, id)
	if err != nil {
		p.rejected.Add(1)
	}
	return err
}

func (p *pins) verify(raw [][]byte, id string) error {
	if len(raw) == 0 {
		return errors.New("no certificate")
	}
	cert, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return err
	}
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok {
		return errors.New("not an Ed25519 key")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if id != "" {
		if want, ok := p.keys[id]; ok && want.Equal(pub) {
			return nil
		}
		return fmt.Errorf("certificate key is not the one pinned for %q", id)
	}
	for _, k := range p.keys {
		if k.Equal(pub) {
			return nil
		}
	}
	return errors.New("certificate key is not a member")
}

func (p *pins) serverTLS(k *testKey) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{k.cert},
		ClientAuth:   tls.RequireAnyClientCert,
		MinVersion:   tls.VersionTLS13,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			return p.check(raw, "")
		},
	}
}

func (p *pins) clientTLS(k *testKey) func(string) *tls.Config {
	return func(id string) *tls.Config {
		return &tls.Config{
			Certificates:       []tls.Certificate{k.cert},
			MinVersion:         tls.VersionTLS13,
			InsecureSkipVerify: true, // self-signed: VerifyPeerCertificate pins the key
			VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
				return p.check(raw, id)
			},
		}
	}
}

// ---- a deterministic test state machine: a hash chain of commands ----

// chainSM folds every command into head = sha256(head || cmd). Replicas
// that diverge in any command or its order end with different heads. The
// response to a command is its sequence number (8 bytes) and the new head.
type chainSM struct {
	mu   sync.Mutex
	n    uint64
	head [32]byte
	gate *gate
}

// gate holds the next Apply until released.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func (s *chainSM) Apply(cmd []byte) []byte {
	s.mu.Lock()
	g := s.gate
	s.gate = nil
	s.mu.Unlock()
	if g != nil {
		close(g.entered)
		<-g.release
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	s.head = chainNext(s.head, cmd)
	return encodeChain(s.n, s.head)
}

func (s *chainSM) Snapshot() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return encodeChain(s.n, s.head), nil
}

func (s *chainSM) Restore(b []byte) error {
	n, head, err := decodeChain(b)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n, s.head = n, head
	return nil
}

// holdNext makes the next Apply wait until the returned gate is released.
func (s *chainSM) holdNext() *gate {
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	s.mu.Lock()
	s.gate = g
	s.mu.Unlock()
	return g
}

func (s *chainSM) state() (uint64, [32]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, s.head
}

func chainNext(head [32]byte, cmd []byte) [32]byte {
	h := sha256.New()
	h.Write(head[:])
	h.Write(cmd)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

func encodeChain(n uint64, head [32]byte) []byte {
	b := make([]byte, 40)
	binary.BigEndian.PutUint64(b, n)
	copy(b[8:], head[:])
	return b
}

func decodeChain(b []byte) (uint64, [32]byte, error) {
	var head [32]byte
	if len(b) != 40 {
		return 0, head, fmt.Errorf("chain state is %d bytes, want 40", len(b))
	}
	copy(head[:], b[8:])
	return binary.BigEndian.Uint64(b), head, nil
}

// chain is the reference: what a replica must hold after cmds.
type chain struct {
	n    uint64
	head [32]byte
}

func (c *chain) add(cmd []byte) []byte {
	c.n++
	c.head = chainNext(c.head, cmd)
	return encodeChain(c.n, c.head)
}

// ---- an in-process cluster on 127.0.0.1 ----

type testCluster struct {
	t     testing.TB
	pins  *pins
	mod   func(*Config)
	boot  []Server
	keys  map[string]*testKey
	addrs map[string]string
	dirs  map[string]string
	nodes map[string]*Node
	sms   map[string]*chainSM
}

// newCluster starts n nodes n1…nN that bootstrap one cluster.
func newCluster(t testing.TB, n int, mod func(*Config)) *testCluster {
	t.Helper()
	c := &testCluster{
		t: t, pins: newPins(), mod: mod,
		keys: map[string]*testKey{}, addrs: map[string]string{}, dirs: map[string]string{},
		nodes: map[string]*Node{}, sms: map[string]*chainSM{},
	}
	root := t.TempDir()
	t.Cleanup(c.closeAll) // runs before TempDir's removal
	lns := map[string]net.Listener{}
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("n%d", i)
		ln := listen(t, "127.0.0.1:0")
		lns[id] = ln
		c.addrs[id] = ln.Addr().String()
		c.dirs[id] = filepath.Join(root, id)
		c.keys[id] = newTestKey(t, id)
		c.pins.pin(id, c.keys[id])
		c.boot = append(c.boot, Server{ID: id, Address: c.addrs[id]})
	}
	for _, s := range c.boot {
		c.open(s.ID, lns[s.ID], c.boot)
	}
	return c
}

func listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	waitFor(t, 5*time.Second, func() bool {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err == nil
	}, "listen on %s", addr)
	return ln
}

func (c *testCluster) config(id string, ln net.Listener, boot []Server) Config {
	cfg := Config{
		NodeID:    id,
		Listener:  ln,
		Dir:       c.dirs[id],
		ServerTLS: c.pins.serverTLS(c.keys[id]),
		ClientTLS: c.pins.clientTLS(c.keys[id]),
		Bootstrap: boot,
	}
	// On a loaded machine (testharness.Slack) the Raft timeouts grow with
	// the load, as a deployment's profile would: at the defaults, sixteen
	// writers under -race at a load of 20 on two cores lost the leader
	// mid-test. Tests that set their own (mod) keep them.
	if s := testharness.Slack(); s > 1 {
		scale := func(d time.Duration) time.Duration { return time.Duration(s * float64(d)) }
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = scale(time.Second), scale(time.Second), scale(500*time.Millisecond)
	}
	if os.Getenv("CONSENSUS_TEST_LOG") != "" {
		cfg.Logger = os.Stderr
		cfg.LogLevel = os.Getenv("CONSENSUS_TEST_LOG")
	}
	if c.mod != nil {
		c.mod(&cfg)
	}
	return cfg
}

// open starts node id with a fresh state machine.
func (c *testCluster) open(id string, ln net.Listener, boot []Server) *Node {
	c.t.Helper()
	sm := &chainSM{}
	n, err := Open(c.config(id, ln, boot), sm)
	if err != nil {
		c.t.Fatalf("open %s: %v", id, err)
	}
	c.nodes[id], c.sms[id] = n, sm
	return n
}

// add prepares a new member (key pinned, address, empty directory) and
// starts it without a bootstrap list, as a node that joins later.
func (c *testCluster) add(id string) *Node {
	c.t.Helper()
	ln := listen(c.t, "127.0.0.1:0")
	c.addrs[id] = ln.Addr().String()
	c.dirs[id] = filepath.Join(c.t.TempDir(), id)
	c.keys[id] = newTestKey(c.t, id)
	c.pins.pin(id, c.keys[id])
	return c.open(id, ln, nil)
}

func (c *testCluster) stop(id string) {
	c.t.Helper()
	if err := c.nodes[id].Close(); err != nil {
		c.t.Errorf("close %s: %v", id, err)
	}
	delete(c.nodes, id)
	delete(c.sms, id)
}

// restart reopens a stopped node on its address and directory.
func (c *testCluster) restart(id string) *Node {
	c.t.Helper()
	return c.open(id, listen(c.t, c.addrs[id]), c.boot)
}

// wipe deletes a stopped node's data directory.
func (c *testCluster) wipe(id string) {
	if err := os.RemoveAll(c.dirs[id]); err != nil {
		c.t.Fatal(err)
	}
}

func (c *testCluster) closeAll() {
	for id := range c.nodes {
		c.stop(id)
	}
}

func (c *testCluster) live() []string {
	ids := make([]string, 0, len(c.nodes))
	for id := range c.nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// waitLeader waits until a live node is leader and every live voter knows
// it, and returns its ID. It waits at least 10 s, and four election
// timeouts of the cluster's timing.
func (c *testCluster) waitLeader() string {
	c.t.Helper()
	cfg := Config{}
	if c.mod != nil {
		c.mod(&cfg)
	}
	var leader string
	waitFor(c.t, max(10*time.Second, 4*cfg.withDefaults().ElectionTimeout), func() bool {
		leader = ""
		for id, n := range c.nodes {
			if n.Status().State == StateLeader {
				leader = id
			}
		}
		if leader == "" {
			return false
		}
		for _, n := range c.nodes {
			if id, _ := n.Leader(); id != leader && c.isVoter(n) {
				return false
			}
		}
		return true
	}, "a leader among %v", c.live())
	return leader
}

func (c *testCluster) isVoter(n *Node) bool {
	for _, s := range n.Status().Servers {
		if s.ID == n.cfg.NodeID {
			return true
		}
	}
	return false
}

func (c *testCluster) apply(id string, cmd []byte) []byte {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		// The chain before cmd: the commands of these tests go one at a
		// time, each applied on the leader before the next.
		n0, h0 := c.sms[id].state()
		resp, err := c.nodes[id].Apply(ctx, cmd)
		if errors.Is(err, ErrNotLeader) && ctx.Err() == nil {
			// Refused before it reached Raft, so not applied: on a loaded
			// machine the leader may have stepped down (its lease ran
			// out); send the command to the new leader, as a client would.
			id = c.waitLeader()
			continue
		}
		if errors.Is(err, ErrOutcomeUnknown) && ctx.Err() == nil {
			// The leader lost its leadership while committing (a loaded
			// machine misses heartbeats): cmd may or may not be in the
			// log. Ask the next leader, as a client would: once its
			// barrier is applied, its machine holds every command that
			// will ever commit.
			id = c.barrierOnLeader(ctx)
			switch n, h := c.sms[id].state(); {
			case n == n0+1 && h == chainNext(h0, cmd):
				return encodeChain(n, h) // it committed
			case n == n0 && h == h0:
				continue // it did not: send it again
			default:
				c.t.Fatalf("after an unknown outcome the leader %s holds %d commands, want %d or %d", id, n, n0, n0+1)
			}
		}
		if err != nil {
			c.t.Fatalf("apply on %s: %v", id, err)
		}
		return resp
	}
}

// barrierOnLeader waits for a leader that applies a barrier and returns it.
func (c *testCluster) barrierOnLeader(ctx context.Context) string {
	c.t.Helper()
	for {
		id := c.waitLeader()
		err := c.nodes[id].Barrier(ctx)
		if err == nil {
			return id
		}
		if ctx.Err() != nil || !(errors.Is(err, ErrNotLeader) || errors.Is(err, ErrOutcomeUnknown)) {
			c.t.Fatalf("barrier on %s: %v", id, err)
		}
	}
}

// applyN applies n commands named prefix-i one by one on the leader and
// checks each response against the reference chain.
func (c *testCluster) applyN(leader, prefix string, n int, ref *chain) {
	c.t.Helper()
	for i := 0; i < n; i++ {
		cmd := fmt.Appendf(nil, "%s-%d", prefix, i)
		if got, want := c.apply(leader, cmd), ref.add(cmd); !bytes.Equal(got, want) {
			c.t.Fatalf("response to %s: got %x, want %x", cmd, got, want)
		}
	}
}

// waitConverged waits until the state machines of ids all hold ref.
func (c *testCluster) waitConverged(ids []string, ref chain) {
	c.t.Helper()
	waitFor(c.t, 10*time.Second, func() bool {
		for _, id := range ids {
			if n, h := c.sms[id].state(); n != ref.n || h != ref.head {
				return false
			}
		}
		return true
	}, "%v to hold %d commands with head %x (have %s)", ids, ref.n, ref.head[:4], lazy(func() string { return c.describe(ids) }))
}

func (c *testCluster) describe(ids []string) string {
	var b bytes.Buffer
	for _, id := range ids {
		n, h := c.sms[id].state()
		fmt.Fprintf(&b, "%s:%d/%x ", id, n, h[:4])
	}
	return b.String()
}

// lazy formats its value when a failure is reported, not before.
type lazy func() string

func (l lazy) String() string { return l() }

// waitFor polls cond until it holds or d passes. Polling a condition with a
// deadline, never sleeping a guessed time, keeps the tests honest on a slow
// machine.
func waitFor(t testing.TB, d time.Duration, cond func() bool, what string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for "+what, append([]any{d}, args...)...)
		}
		<-tick.C
	}
}
