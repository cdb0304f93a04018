package consensus

import (
	"context"
	"crypto/tls"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scellis/scellis/diag"
)

func TestConfigRefused(t *testing.T) {
	p := newPins()
	k := newTestKey(t, "n1")
	good := func() Config {
		return Config{
			NodeID:    "n1",
			BindAddr:  "127.0.0.1:0",
			Dir:       filepath.Join(t.TempDir(), "n1"),
			ServerTLS: p.serverTLS(k),
			ClientTLS: p.clientTLS(k),
		}
	}
	cases := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no node ID", func(c *Config) { c.NodeID = "" }, "node ID is empty"},
		{"no dir", func(c *Config) { c.Dir = "" }, "data directory is empty"},
		{"no address", func(c *Config) { c.BindAddr = "" }, "bind address is empty"},
		{"no server TLS", func(c *Config) { c.ServerTLS = nil }, "server TLS config is missing"},
		{"no client auth", func(c *Config) { c.ServerTLS.ClientAuth = tls.NoClientCert }, "does not require client certificates"},
		{"no client TLS", func(c *Config) { c.ClientTLS = nil }, "client TLS function is missing"},
		{"bootstrap without self", func(c *Config) { c.Bootstrap = []Server{{"n2", "127.0.0.1:7001"}} }, `does not name this node "n1"`},
		{"bootstrap duplicate", func(c *Config) {
			c.Bootstrap = []Server{{"n1", "127.0.0.1:7001"}, {"n1", "127.0.0.1:7002"}}
		}, "listed twice"},
		{"bootstrap at another address", func(c *Config) { c.Bootstrap = []Server{{"n1", "127.0.0.1:1"}} }, "but it advertises"},
		{"lease above heartbeat", func(c *Config) { c.HeartbeatTimeout, c.LeaderLeaseTimeout = 100e6, 200e6 }, "LeaderLeaseTimeout"},
		{"log level", func(c *Config) { c.LogLevel = "loud" }, "unknown log level"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.edit(&cfg)
			n, err := Open(cfg, &chainSM{})
			if err == nil {
				n.Close()
				t.Fatal("accepted")
			}
			l, ok := diag.As(err)
			if !ok || l[0].Code != diag.ConsensusConfig {
				t.Fatalf("error %v is not an SC8001 diagnostic", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}

	// Every problem is reported at once.
	_, err := Open(Config{}, &chainSM{})
	if l, _ := diag.As(err); len(l) < 5 {
		t.Errorf("empty config: %d diagnostics, want every problem: %v", len(l), err)
	}

	// A taken port is SC8003.
	n, err := Open(good(), &chainSM{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	cfg := good()
	cfg.BindAddr = n.stream.ln.Addr().String()
	if _, err := Open(cfg, &chainSM{}); err == nil {
		t.Fatal("bound a taken port")
	} else if l, ok := diag.As(err); !ok || l[0].Code != diag.ConsensusListen {
		t.Errorf("taken port: %v, want SC8003", err)
	}
}

func TestClosed(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, nil)
	leader := c.waitLeader()
	n := c.nodes[leader]
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	delete(c.nodes, leader)
	ctx := context.Background()
	if _, err := n.Apply(ctx, []byte("x")); !errors.Is(err, ErrClosed) {
		t.Errorf("Apply after Close: %v", err)
	}
	if err := n.Snapshot(); !errors.Is(err, ErrClosed) {
		t.Errorf("Snapshot after Close: %v", err)
	}
	if st := n.Status(); st.State != StateShutdown {
		t.Errorf("state after Close: %s", st.State)
	}
}

// TestDirInUse: a second node on the same data directory fails at once
// instead of waiting for bbolt's file lock.
func TestDirInUse(t *testing.T) {
	c := newCluster(t, 1, nil)
	cfg := c.config("n1", nil, nil)
	cfg.BindAddr = "127.0.0.1:0"
	_, err := Open(cfg, &chainSM{})
	if l, ok := diag.As(err); !ok || l[0].Code != diag.ConsensusStore || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Open on one directory: %v, want SC8002 in use", err)
	}
}
