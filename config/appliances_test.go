package config

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const aggBase = "name: agg-1\nidentity: k\nfederation: f.yaml\ndata_dir: d\n"

// The Raft timeouts come from a profile, each overridable; an order Raft
// cannot run with is refused at the key that breaks it.
func TestAggregatorRaftTiming(t *testing.T) {
	load := func(extra string) (*Aggregator, error) {
		dir := writeFiles(t, map[string]string{"agg.yaml": aggBase + extra})
		return LoadAggregator(filepath.Join(dir, "agg.yaml"))
	}
	c, err := load("")
	if err != nil {
		t.Fatal(err)
	}
	if c.RaftTiming != "lan" || c.RaftHeartbeatTimeout != time.Second || c.RaftElectionTimeout != time.Second || c.RaftLeaderLeaseTimeout != 500*time.Millisecond {
		t.Fatalf("default timing: %+v", c)
	}
	c, err = load("raft_timing: wan\nraft_election_timeout: 5s\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.RaftHeartbeatTimeout != 3*time.Second || c.RaftElectionTimeout != 5*time.Second || c.RaftLeaderLeaseTimeout != 1500*time.Millisecond {
		t.Fatalf("wan timing with an override: %+v", c)
	}
	for _, tc := range []struct {
		extra string
		want  []string
	}{
		{"raft_timing: satellite\n", []string{"SC1005 5:14"}},
		{"raft_leader_lease_timeout: 2s\n", []string{"SC1005 5:28"}},
		{"raft_heartbeat_timeout: 2s\nraft_election_timeout: 1s\n", []string{"SC1005 5:25"}},
	} {
		_, err := load(tc.extra)
		if got := where(err); !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %v, want %v (%v)", tc.extra, got, tc.want, err)
		}
	}
}

// The volunteer page is off by default; on, it needs the operator's wasm
// build (resolved beside the config), and its difficulty is bounded.
func TestAggregatorVolunteer(t *testing.T) {
	load := func(extra string) (*Aggregator, error) {
		dir := writeFiles(t, map[string]string{"agg.yaml": aggBase + extra})
		return LoadAggregator(filepath.Join(dir, "agg.yaml"))
	}
	c, err := load("")
	if err != nil || c.VolunteerListen != "" {
		t.Fatalf("default: %+v %v", c, err)
	}
	c, err = load("volunteer_listen: 127.0.0.1:7490\nvolunteer_wasm: w/scellis.wasm\nvolunteer_difficulty: 12\nvolunteer_max_leases: 4\n")
	if err != nil || !filepath.IsAbs(c.VolunteerWasm) || filepath.Base(filepath.Dir(c.VolunteerWasm)) != "w" || c.VolunteerDifficulty != 12 || c.VolunteerMaxLeases != 4 {
		t.Fatalf("on: %+v %v", c, err)
	}
	for _, tc := range []struct {
		extra string
		want  []string
	}{
		{"volunteer_listen: 127.0.0.1:7490\n", []string{"SC1004 5:19"}},
		{"volunteer_listen: 127.0.0.1:7490\nvolunteer_wasm: w\nvolunteer_difficulty: 40\n", []string{"SC1005 7:23"}},
		{"volunteer_listen: 127.0.0.1:7490\nvolunteer_wasm: w\nvolunteer_max_leases: 65\n", []string{"SC1005 7:23"}},
	} {
		_, err := load(tc.extra)
		if got := where(err); !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %v, want %v (%v)", tc.extra, got, tc.want, err)
		}
	}
}

// A child cluster's node sets parent_federation, delegate_identity and
// delegate_name together; the refusal names the ones given and missing
// (a key set to "" counts as missing), at the last given.
func TestAggregatorChildKeysTogether(t *testing.T) {
	load := func(extra string) (*Aggregator, error) {
		dir := writeFiles(t, map[string]string{"agg.yaml": aggBase + extra})
		return LoadAggregator(filepath.Join(dir, "agg.yaml"))
	}
	if c, err := load("parent_federation: p.yaml\ndelegate_identity: d/identity.key\ndelegate_name: kid\n"); err != nil || !filepath.IsAbs(c.ParentFederation) {
		t.Fatalf("all three: %+v %v", c, err)
	}
	for _, tc := range []struct {
		extra, want, says string
	}{
		{"delegate_name: kid\n", "SC1004 5:16", "delegate_name without parent_federation and delegate_identity"},
		{"parent_federation: \"\"\ndelegate_identity: d/identity.key\ndelegate_name: kid\n", "SC1004 7:16", "delegate_identity and delegate_name without parent_federation"},
	} {
		_, err := load(tc.extra)
		if got := where(err); !slices.Equal(got, []string{tc.want}) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%q: got %v (%v), want %s saying %q", tc.extra, got, err, tc.want, tc.says)
		}
	}
}

// turn_allow_peers takes CIDR ranges; anything else is refused at the
// entry, with the P2P configuration code.
func TestAggregatorTURNAllowPeers(t *testing.T) {
	load := func(extra string) (*Aggregator, error) {
		dir := writeFiles(t, map[string]string{"agg.yaml": aggBase + extra})
		return LoadAggregator(filepath.Join(dir, "agg.yaml"))
	}
	c, err := load("turn_allow_peers: [127.0.0.0/8, \"fd00::/8\"]\nturn_max_per_member: 2\n")
	if err != nil || !slices.Equal(c.TURNAllowPeers, []string{"127.0.0.0/8", "fd00::/8"}) || c.TURNMaxPerMember != 2 {
		t.Fatalf("%+v %v", c, err)
	}
	_, err = load("turn_allow_peers: [127.0.0.1]\n")
	if got := where(err); len(got) != 1 || !strings.HasPrefix(got[0], "SC7") || !strings.HasSuffix(got[0], " 5:20") {
		t.Errorf("an address without a prefix length: got %v (%v)", got, err)
	}
}
