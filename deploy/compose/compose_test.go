package compose

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/scellis/scellis/deploy/internal/testbin"
)

const testTag = "0.0.0-test"

// loadProject reads compose.yaml with compose-go, the loader docker
// compose itself uses: the compose specification's schema, interpolation
// and every profile.
func loadProject(t *testing.T, env ...string) (*types.Project, error) {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{"compose.yaml"}, cli.WithEnv(env), cli.WithProfiles([]string{"*"}), cli.WithResolvedPaths(true))
	if err != nil {
		t.Fatal(err)
	}
	return opts.LoadProject(context.Background())
}

// The compose file passes the compose specification's schema; without
// SCELLIS_TAG it refuses to start and says what to set.
func TestComposeValid(t *testing.T) {
	if _, err := loadProject(t); err == nil || !strings.Contains(err.Error(), "set SCELLIS_TAG") {
		t.Fatalf("without SCELLIS_TAG: %v, want the hint to set it", err)
	}
	p, err := loadProject(t, "SCELLIS_TAG="+testTag)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"agg-1", "agg-2", "agg-3", "alice", "init", "silo-1", "silo-2", "silo-3", "worker-1"}
	if got := p.ServiceNames(); !slices.Equal(sorted(got), want) {
		t.Fatalf("services %v, want %v", got, want)
	}
	for name, s := range p.Services {
		if s.Image != "scellis:"+testTag || !s.ReadOnly || !slices.Equal(s.CapDrop, []string{"ALL"}) || !slices.Contains(s.SecurityOpt, "no-new-privileges:true") {
			t.Errorf("%s: image %q, read-only %v, cap_drop %v, security_opt %v", name, s.Image, s.ReadOnly, s.CapDrop, s.SecurityOpt)
		}
	}
	for name, profile := range map[string]string{"init": "setup", "alice": "client"} {
		if !slices.Equal(p.Services[name].Profiles, []string{profile}) {
			t.Errorf("%s runs on docker compose up (profiles %v): want only the %s profile", name, p.Services[name].Profiles, profile)
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// The walkthrough's federation fits the compose file: init's command, run
// with the real binary, writes every config, key and federation file the
// other services name; each member mounts that volume read-only and has a
// state volume of its own where its config keeps state; each silo's data
// file is mounted where its config looks; the aggregators' addresses are
// service names; every config passes scellis config check (state and data
// moved under the test's folder), and alice's run.yaml runs (fl simulate
// over three generated hospitals).
func TestComposeFitsFederation(t *testing.T) {
	bin, err := testbin.Scellis()
	if err != nil {
		t.Fatal(err)
	}
	p, err := loadProject(t, "SCELLIS_TAG="+testTag)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fed := filepath.Join(dir, "fed")
	init := p.Services["init"]
	args := slices.Clone(init.Command)
	i := slices.Index(args, "--dir")
	if i < 0 || len(init.Volumes) != 1 || init.Volumes[0].Source != "fed" || init.Volumes[0].Target != args[i+1] {
		t.Fatalf("init must write the fed volume where it mounts it: command %q, volumes %+v", args, init.Volumes)
	}
	args[i+1] = fed
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("scellis %q: %v\n%s", args, err, out)
	}
	moved := strings.NewReplacer("/var/lib/scellis", filepath.Join(dir, "state"), "/srv/scellis", filepath.Join(dir, "srv"))
	inFed := func(path string) string { return filepath.Join(fed, strings.TrimPrefix(path, "/etc/scellis/")) }
	for name, s := range p.Services {
		if name == "init" {
			continue
		}
		if !mounted(s, "fed", "/etc/scellis", true) {
			t.Errorf("%s does not mount the fed volume read-only at /etc/scellis", name)
		}
		if name == "alice" {
			checkResearcher(t, bin, s, inFed, dir)
			continue
		}
		if !mounted(s, name, "/var/lib/scellis", false) || p.Volumes[name].Name == "" {
			t.Errorf("%s has no state volume of its own at /var/lib/scellis", name)
		}
		role, cfg := s.Command[0], s.Command[2]
		if s.Command[1] != "--config" || cfg != "/etc/scellis/"+name+"/"+role+".yaml" {
			t.Errorf("%s runs %q", name, s.Command)
			continue
		}
		b, err := os.ReadFile(inFed(cfg))
		if err != nil {
			t.Errorf("%s: init wrote no %s: %v", name, cfg, err)
			continue
		}
		if !regexp.MustCompile(`(?m)^(data_dir|cache_dir): /var/lib/scellis/` + name + `\b`).Match(b) {
			t.Errorf("%s's config keeps its state outside its volume:\n%s", name, b)
		}
		if role == "silo" {
			checkSiloData(t, bin, s, string(b), moved)
		}
		os.WriteFile(inFed(cfg), []byte(moved.Replace(string(b))), 0o644)
		if out, err := exec.Command(bin, "config", "check", inFed(cfg)).CombinedOutput(); err != nil {
			t.Errorf("scellis config check of %s's config: %v\n%s", name, err, out)
		}
	}
	federation, _ := os.ReadFile(filepath.Join(fed, "federation.yaml"))
	for _, m := range regexp.MustCompile(`(?m)^    address: (.+):7400$`).FindAllStringSubmatch(string(federation), -1) {
		if _, ok := p.Services[m[1]]; !ok {
			t.Errorf("the federation file gives an aggregator the address %s, which is no service", m[1])
		}
	}
}

// checkSiloData: the silo's data is a read-only bind of the walkthrough's
// CSV at the path its config names; a generated file there passes.
func checkSiloData(t *testing.T, bin string, s types.ServiceConfig, cfg string, moved *strings.Replacer) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^    path: (\S+)`).FindStringSubmatch(cfg)
	if m == nil {
		t.Fatalf("%s's config names no dataset path", s.Name)
	}
	var bound bool
	for _, v := range s.Volumes {
		bound = bound || v.Type == types.VolumeTypeBind && v.Target == m[1] && v.ReadOnly && strings.HasPrefix(filepath.Base(v.Source), "hospital-")
	}
	if !bound {
		t.Errorf("%s: no read-only bind of a hospital's CSV at %s: %+v", s.Name, m[1], s.Volumes)
	}
	if err := testbin.PatientsCSV(bin, filepath.Dir(moved.Replace(m[1]))); err != nil {
		t.Fatal(err)
	}
}

// checkResearcher: alice's identity and federation are in the volume, and
// the run she launches is a valid run that completes over three
// hospitals.
func checkResearcher(t *testing.T, bin string, s types.ServiceConfig, inFed func(string) string, dir string) {
	t.Helper()
	for _, k := range []string{"SCELLIS_IDENTITY", "SCELLIS_FEDERATION"} {
		v := s.Environment[k]
		if v == nil {
			t.Errorf("alice has no %s", k)
		} else if _, err := os.Stat(inFed(*v)); err != nil {
			t.Errorf("alice's %s: init wrote no %s", k, *v)
		}
	}
	var run string
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeBind && v.Target == "/srv/scellis/run.yaml" && v.ReadOnly {
			run = v.Source
		}
	}
	if run == "" {
		t.Fatalf("alice has no run.yaml at /srv/scellis/run.yaml: %+v", s.Volumes)
	}
	sites := filepath.Join(dir, "sites")
	if out, err := exec.Command(bin, "datagen", "hospitals", "--sites", "3", "--rows", "300", "--out", sites).CombinedOutput(); err != nil {
		t.Fatalf("datagen: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "fl", "simulate", run, "--data", sites).CombinedOutput(); err != nil {
		t.Fatalf("scellis fl simulate %s: %v\n%s", run, err, out)
	}
}

func mounted(s types.ServiceConfig, source, target string, readOnly bool) bool {
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeVolume && v.Source == source && v.Target == target && v.ReadOnly == readOnly {
			return true
		}
	}
	return false
}
