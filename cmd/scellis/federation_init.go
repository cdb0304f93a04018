package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// siloDataRoot is where a silo's dataset is looked for on its machine
// (--state-dir): /srv/scellis/NAME/patients.csv. Data a site serves
// belongs under /srv, not beside the config in /etc/scellis/NAME; the
// image and the Kubernetes manifests in deploy/ mount it there read-only.
const siloDataRoot = "/srv/scellis"

// initOptions are the flags of `scellis federation init`.
type initOptions struct {
	dir                                string
	name, regime                       string
	aggregators, silos, workers, port  int
	researcher, operator, hosts, state string
}

func newFederationInitCmd() *cobra.Command {
	var o initOptions
	cmd := &cobra.Command{
		Use:   "init --dir DIR --aggregators N --silos M",
		Short: "Write keys, a federation file and a config for every process, one folder per machine",
		Long: `Make a whole federation in one folder, ready to copy to each machine: for
every member DIR/NAME/ holds its identity key (mode 0600; made here, on the
machine running init — copy each folder to its machine over a trusted channel
and delete it here, or make keys on the machines with 'scellis keygen'
instead), its public key, a copy of the federation file and the config of its
process (aggregator.yaml, silo.yaml, worker.yaml). DIR/federation.yaml is the
federation file; people (--researcher, --operator) get a key and no config:
they export SCELLIS_IDENTITY and SCELLIS_FEDERATION for client commands.

Aggregator i serves its API on HOST:PORT and Raft on HOST:PORT+1, HOST
taken in turn from --hosts (two aggregators on one host get the next two
ports). A silo's config names one dataset that the hospital provides:
patients.csv next to the config, or /srv/scellis/NAME/patients.csv with
--state-dir, so that a machine's data is never looked for under /etc (edit the
path, label and budget; 'scellis config check' says what is missing). State
(Raft log, blobs, ledger, caches) goes under --state-dir, in DIR/NAME, or next
to each config when it is not given; the systemd units in deploy/ use
/var/lib/scellis.`,
		Example: "  scellis federation init --dir fed --aggregators 3 --silos 3 --researcher alice\n" +
			"  scellis federation init --dir fed --aggregators 3 --workers 2 --hosts agg1.example.org,agg2.example.org,agg3.example.org --state-dir /var/lib/scellis",
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runFederationInit(o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dir, "dir", "", "folder to write the federation to (must not exist or be empty)")
	f.StringVar(&o.name, "name", "federation", "the federation's name")
	f.StringVar(&o.regime, "regime", "consortium", "the pool's trust regime: own, consortium or open")
	f.IntVar(&o.aggregators, "aggregators", 3, "number of aggregators (an odd number survives the loss of a minority)")
	f.IntVar(&o.silos, "silos", 0, "number of silos (hospitals), named silo-1, silo-2, …")
	f.IntVar(&o.workers, "workers", 0, "number of pool workers, named worker-1, worker-2, …")
	f.StringVar(&o.researcher, "researcher", "", "also make a researcher (a person who submits jobs and launches runs) of this name")
	f.StringVar(&o.operator, "operator", "", "also make an operator (a person who may cancel any job) of this name")
	f.StringVar(&o.hosts, "hosts", "127.0.0.1", "comma-separated hosts the aggregators run on, taken in turn")
	f.IntVar(&o.port, "port", 7400, "first aggregator API port; Raft on the next one")
	f.StringVar(&o.state, "state-dir", "", "folder for each process's state on its machine (default: next to its config)")
	flagRange(cmd, "aggregators", "1", "15")
	flagRange(cmd, "silos", "0", "1000")
	flagRange(cmd, "workers", "0", "1000")
	flagRange(cmd, "port", "1", "65000")
	return cmd
}

// initMember is one member federation init writes.
type initMember struct {
	Name        string `json:"name"`
	Role        string `json:"role"`
	Folder      string `json:"folder"`
	Config      string `json:"config,omitempty"`
	Address     string `json:"address,omitempty"`
	RaftAddress string `json:"raft_address,omitempty"`
	pub         string
}

func runFederationInit(o initOptions, stdout io.Writer) error {
	if o.dir == "" {
		return usageError{fmt.Errorf("federation init needs --dir DIR, the folder to write the federation to")}
	}
	var ds diag.List
	if err := identity.CheckName(o.name); err != nil {
		ds = append(ds, subjectOf(err, "--name"))
	}
	for flag, n := range map[string]string{"--researcher": o.researcher, "--operator": o.operator} {
		if n != "" {
			if err := identity.CheckName(n); err != nil {
				ds = append(ds, subjectOf(err, flag))
			}
		}
	}
	if entries, err := os.ReadDir(o.dir); err == nil && len(entries) > 0 {
		ds = append(ds, diag.New(diag.KeyFileExists, o.dir, "the folder is not empty").
			WithHelp("federation init never replaces keys: give a new or empty --dir"))
	}
	members, addrs := initMembers(o)
	ds = append(ds, addrs...)
	if len(ds) > 0 {
		return ds
	}

	// Keys first, then the federation file that lists them, then configs.
	if err := writeInitKeys(o.dir, members); err != nil {
		return err
	}
	var fed strings.Builder
	fmt.Fprintf(&fed, "# The federation %s: every member, its role, public key and addresses.\n", o.name)
	fmt.Fprintf(&fed, "# Written by 'scellis federation init'; every machine has the same copy.\n")
	fmt.Fprintf(&fed, "federation: %s\nregime: %s\nmembers:\n", o.name, o.regime)
	for _, m := range members {
		fmt.Fprintf(&fed, "  - name: %s\n    role: %s\n    public_key: %s\n", m.Name, m.Role, m.pub)
		if m.Address != "" {
			fmt.Fprintf(&fed, "    address: %s\n    raft_address: %s\n", yamlString(m.Address), yamlString(m.RaftAddress))
		}
	}
	fedPath := filepath.Join(o.dir, "federation.yaml")
	if err := writeNewFile(fedPath, []byte(fed.String()), 0o644); err != nil {
		return err
	}
	// The file must pass what the daemons check before anything is copied.
	loaded, err := identity.LoadFederation(fedPath)
	if err != nil {
		return err
	}
	if err := daemonRefusals(loaded); err != nil {
		return err
	}
	state := func(m *initMember, sub string) string {
		if o.state == "" {
			return sub
		}
		return filepath.Join(o.state, m.Name)
	}
	// A config installed on its machine (--state-dir) lives in /etc, where
	// no hospital keeps its data: its dataset is looked for under /srv.
	dataset := func(m *initMember) string {
		if o.state == "" {
			return "patients.csv"
		}
		return filepath.Join(siloDataRoot, m.Name, "patients.csv")
	}
	for _, m := range members {
		if err := writeNewFile(filepath.Join(m.Folder, "federation.yaml"), []byte(fed.String()), 0o644); err != nil {
			return err
		}
		head := fmt.Sprintf("# %s's config, written by 'scellis federation init'; paths resolve against this file's folder.\nname: %s\nidentity: %s\nfederation: federation.yaml\n", m.Name, m.Name, keyFileName)
		var body string
		switch m.Role {
		case "aggregator":
			m.Config = "aggregator.yaml"
			body = head + fmt.Sprintf("data_dir: %s   # Raft log, snapshots, blobs: back it up\nlease_ttl: 30s\nraft_timing: lan   # wan for links of about 150 ms round trip\n", state(m, "data"))
		case "worker":
			m.Config = "worker.yaml"
			body = head + fmt.Sprintf("cache_dir: %s\nparallel: 1\n", state(m, "cache"))
		case "silo":
			m.Config = "silo.yaml"
			body = head + fmt.Sprintf(`data_dir: %s   # the privacy ledger and client state: back it up
datasets:
  - name: patients
    path: %s   # the hospital's CSV (header row, numeric features)
    label: outcome
    class: confidential
    budget: {epsilon: 8, delta: 1.0e-5}   # the most this dataset may ever spend
    unit: record
policy:
  strategies: [fedavg, fedprox]
  max_epsilon_per_round: 1.0
  min_noise_multiplier: 0.8
  min_cohort: 3
`, state(m, "data"), dataset(m))
		default:
			continue
		}
		if err := writeNewFile(filepath.Join(m.Folder, m.Config), []byte(body), 0o644); err != nil {
			return err
		}
	}
	if jsonOutput {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Federation string        `json:"federation"`
			File       string        `json:"file"`
			Members    []*initMember `json:"members"`
		}{o.name, fedPath, members})
	}
	fmt.Fprintf(stdout, "wrote federation %s (%s) to %s: copy each folder to its machine\n", o.name, o.regime, fedPath)
	for _, m := range members {
		switch {
		case m.Config == "aggregator.yaml":
			fmt.Fprintf(stdout, "  %-14s scellis aggregator --config %s   (API %s, Raft %s)\n", m.Folder+"/", m.Config, m.Address, m.RaftAddress)
		case m.Config != "":
			fmt.Fprintf(stdout, "  %-14s scellis %s --config %s\n", m.Folder+"/", m.Role, m.Config)
		default:
			fmt.Fprintf(stdout, "  %-14s export SCELLIS_IDENTITY=%s/%s SCELLIS_FEDERATION=%s/federation.yaml   (%s)\n", m.Folder+"/", m.Name, keyFileName, m.Name, m.Role)
		}
	}
	if o.silos > 0 {
		where := "patients.csv beside it"
		if o.state != "" {
			where = siloDataRoot + "/NAME/patients.csv"
		}
		fmt.Fprintf(stdout, "each silo names its dataset in silo.yaml (%s): 'scellis config check silo.yaml' before starting\n", where)
	}
	return nil
}

// initMembers lays out the federation's members: aggregators on the
// hosts in turn (two ports each: API and Raft), then silos, workers and
// the people; ds holds the addresses that are not valid.
func initMembers(o initOptions) (members []*initMember, ds diag.List) {
	hosts := strings.Split(o.hosts, ",")
	perHost := map[string]int{}
	for i := 1; i <= o.aggregators; i++ {
		host := strings.TrimSpace(hosts[(i-1)%len(hosts)])
		k := perHost[host]
		perHost[host]++
		m := &initMember{Name: fmt.Sprintf("agg-%d", i), Role: "aggregator",
			Address:     joinHostPort(host, o.port+2*k),
			RaftAddress: joinHostPort(host, o.port+2*k+1)}
		for _, a := range []string{m.Address, m.RaftAddress} {
			if err := identity.CheckAddress(a); err != nil {
				ds = append(ds, subjectOf(err, "--hosts"))
			}
		}
		members = append(members, m)
	}
	for i := 1; i <= o.silos; i++ {
		members = append(members, &initMember{Name: fmt.Sprintf("silo-%d", i), Role: "silo"})
	}
	for i := 1; i <= o.workers; i++ {
		members = append(members, &initMember{Name: fmt.Sprintf("worker-%d", i), Role: "worker"})
	}
	if o.researcher != "" {
		members = append(members, &initMember{Name: o.researcher, Role: "researcher"})
	}
	if o.operator != "" {
		members = append(members, &initMember{Name: o.operator, Role: "operator"})
	}
	return members, ds
}

// writeInitKeys makes each member's folder under dir with a new key and
// its public half.
func writeInitKeys(dir string, members []*initMember) error {
	for _, m := range members {
		m.Folder = filepath.Join(dir, m.Name)
		if err := os.MkdirAll(m.Folder, 0o700); err != nil {
			return err
		}
		id, err := identity.Generate()
		if err != nil {
			return err
		}
		if err := identity.Save(filepath.Join(m.Folder, keyFileName), id, identity.SaveOptions{}); err != nil {
			return err
		}
		m.pub = id.Public().String()
		if err := writeNewFile(filepath.Join(m.Folder, pubKeyFileName), []byte(m.pub+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func joinHostPort(host string, port int) string {
	if strings.Contains(host, ":") {
		return fmt.Sprintf("[%s]:%d", host, port)
	}
	return fmt.Sprintf("%s:%d", host, port)
}
