package main

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/pion/turn/v5"

	"github.com/scellis/scellis/dataplane"
)

// A member's TURN credential, fetched from a running aggregator's
// /p2p/ice the way a worker does, relays to public addresses only: a
// permission for 127.0.0.1 (the node's own loopback services), for a
// private address or for cloud metadata is refused by the aggregator's
// embedded TURN server, and `aggregator status` counts the refusals.
// Before, each was granted. Relays for a loopback federation need
// turn_allow_peers (TestP2PPoolJobOverDataChannels, TestP2PThroughNATs).
func TestTURNRefusesLoopbackRelayE2E(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("multi-process test")
	}
	c := newCluster(t, "own", 1, member{"alice", "researcher"})
	c.write("agg-1.yaml", "name: agg-1\nidentity: agg-1/identity.key\nfederation: federation.yaml\ndata_dir: agg-1/data\nlog_level: error\nturn_listen: 127.0.0.1:0\n")
	c.startAggregators()

	m := c.apiAs("alice")
	resp, err := m.http.Get(m.base + "/p2p/ice")
	if err != nil {
		t.Fatal(err)
	}
	var servers []dataplane.ICEServer
	err = json.NewDecoder(resp.Body).Decode(&servers)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var cred dataplane.ICEServer
	for _, s := range servers {
		if len(s.URLs) > 0 && strings.HasPrefix(s.URLs[0], "turn:") {
			cred = s
		}
	}
	if cred.Username == "" {
		t.Fatalf("/p2p/ice gave no TURN server: %+v", servers)
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(cred.URLs[0], "turn:"), "?transport=udp")

	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl, err := turn.NewClient(&turn.ClientConfig{STUNServerAddr: addr, TURNServerAddr: addr, Conn: conn, Username: cred.Username, Password: cred.Credential, Realm: "scellis"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.Listen(); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Allocate(); err != nil {
		t.Fatalf("alice's credential got no relay: %v", err)
	}
	// The aggregator's API port on loopback: what an attacker would aim at.
	apiPort := strings.TrimPrefix(m.base[strings.LastIndex(m.base, ":"):], ":")
	for _, peer := range []string{"127.0.0.1:" + apiPort, "10.0.0.1:22", "169.254.169.254:80"} {
		a, err := net.ResolveUDPAddr("udp4", peer)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.CreatePermission(a); err == nil {
			t.Errorf("the aggregator's TURN server permitted a relay to %s", peer)
		}
	}
	if out := c.mustCLI("alice", "aggregator", "status"); !strings.Contains(out, "3 peers refused") {
		t.Errorf("aggregator status does not count 3 refused peers:\n%s", out)
	}
}
