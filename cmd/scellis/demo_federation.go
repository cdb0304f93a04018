package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/datagen"
	"github.com/scellis/scellis/dp"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/studio"
)

// federationDemo is `scellis demo`: a whole federation on this machine —
// 3 aggregator nodes and 4 hospital silos as child processes on loopback —
// running FedProx with DP and secure aggregation, losing a silo mid-run,
// then a sweep on the same pool.
type federationDemo struct {
	dir    string
	out    io.Writer
	exe    string
	procs  map[string]*exec.Cmd
	exited map[string]chan struct{}
	fed    string
	// studio is agg-1's Studio address; stay keeps the federation (and
	// the Studio) up after the demo until interrupted.
	studio string
	stay   bool
}

const demoSilos = 4

// The demo's hospitals hold demoRows records each; the run has demoRounds.
const (
	demoRows   = 800
	demoRounds = 6
)

func (d *federationDemo) path(p ...string) string {
	return filepath.Join(append([]string{d.dir}, p...)...)
}

func (d *federationDemo) step(format string, args ...any) {
	fmt.Fprintf(d.out, "\n== "+format+"\n", args...)
}

// setup writes keys, the federation file, configs and data.
func (d *federationDemo) setup() error {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	port := func() (string, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		listeners = append(listeners, l)
		return l.Addr().String(), nil
	}
	var fed strings.Builder
	fed.WriteString("federation: demo\nregime: consortium\nmembers:\n")
	member := func(name, role string, extra string) error {
		id, err := identity.Generate()
		if err != nil {
			return err
		}
		if err := os.MkdirAll(d.path(name), 0o700); err != nil {
			return err
		}
		if err := identity.Save(d.path(name, "identity.key"), id, identity.SaveOptions{}); err != nil {
			return err
		}
		fmt.Fprintf(&fed, "  - name: %s\n    role: %s\n    public_key: %s\n%s", name, role, id.Public(), extra)
		return nil
	}
	for i := 1; i <= 3; i++ {
		a, err := port()
		if err != nil {
			return err
		}
		r, err := port()
		if err != nil {
			return err
		}
		name := fmt.Sprintf("agg-%d", i)
		if err := member(name, "aggregator", fmt.Sprintf("    address: %s\n    raft_address: %s\n", a, r)); err != nil {
			return err
		}
		cfg := fmt.Sprintf("name: %s\nidentity: %s/identity.key\nfederation: federation.yaml\ndata_dir: %s/data\nlease_ttl: 5s\nround_join_timeout: 6s\nlog_level: error\n", name, name, name)
		if i == 1 {
			// The Studio, the live web view, on the first node.
			if d.studio, err = port(); err != nil {
				return err
			}
			cfg += fmt.Sprintf("studio_listen: %s\n", d.studio)
		}
		if err := os.WriteFile(d.path(name+".yaml"), []byte(cfg), 0o600); err != nil {
			return err
		}
	}
	sites, err := datagen.Hospitals(demoSilos, demoRows, 7)
	if err != nil {
		return err
	}
	if _, err := datagen.WriteHospitals(d.path("data"), sites); err != nil {
		return err
	}
	for i := 1; i <= demoSilos; i++ {
		name := fmt.Sprintf("hospital-%d", i)
		if err := member(name, "silo", ""); err != nil {
			return err
		}
		cfg := fmt.Sprintf(`name: %s
identity: %s/identity.key
federation: federation.yaml
data_dir: %s/data
datasets:
  - name: patients
    path: data/hospital-%d.csv
    label: outcome
    class: confidential
    budget: {epsilon: 8, delta: 1.0e-5}
    unit: record
policy:
  strategies: [fedavg, fedprox]
  min_cohort: 3
  generic_shards: true
`, name, name, name, i)
		if err := os.WriteFile(d.path(name+".yaml"), []byte(cfg), 0o600); err != nil {
			return err
		}
	}
	if err := member("scientist", "researcher", ""); err != nil {
		return err
	}
	d.fed = d.path("federation.yaml")
	return os.WriteFile(d.fed, []byte(fed.String()), 0o600)
}

// evaluate scores the run's model file (the model with the standardisation
// the run agreed on, as `scellis model eval` reads it) on held-out data the
// scientist holds — four more generated hospitals — against the
// majority-class baseline.
func (d *federationDemo) evaluate(id content.Ref) error {
	path := d.path("model.json")
	if err := d.cli("fl", "model", string(id), "--out", path); err != nil {
		return err
	}
	f, err := fl.ReadModelFile(path)
	if err != nil {
		return err
	}
	held, err := datagen.Hospitals(demoSilos, demoRows, 99)
	if err != nil {
		return err
	}
	files, err := datagen.WriteHospitals(d.path("heldout"), held)
	if err != nil {
		return err
	}
	var auc, acc, base, bestAUC, bestAcc float64
	for i, file := range files {
		raw, err := model.LoadCSV(file, datagen.HospitalLabel)
		if err != nil {
			return err
		}
		data, err := f.Prepare(raw, file, true)
		if err != nil {
			return err
		}
		e := model.Evaluate(f.Model(), data)
		// The model the site's labels were drawn from, on its raw features,
		// is the ceiling no model trained on these rows can beat: it shows
		// how much of the gap to a perfect score is the data's own noise.
		ceiling := model.Evaluate(held[i].Truth, raw)
		bestAUC += ceiling.AUC / float64(len(files))
		bestAcc += ceiling.Accuracy / float64(len(files))
		auc += e.AUC / float64(len(files))
		acc += e.Accuracy / float64(len(files))
		var pos float64
		for _, y := range data.Y {
			pos += y
		}
		base += math.Max(pos, float64(len(data.Y))-pos) / float64(len(data.Y)) / float64(len(files))
	}
	fmt.Fprintf(d.out, "held-out (4 new hospitals × %d rows): AUC %.3f (majority-class baseline 0.500), accuracy %.3f (majority-class baseline %.3f)\n", demoRows, auc, acc, base)
	fmt.Fprintf(d.out, "the model that generated these rows scores AUC %.3f, accuracy %.3f: no model can do better on them\n", bestAUC, bestAcc)
	return nil
}

func (d *federationDemo) start(name string, args ...string) error {
	if err := os.MkdirAll(d.path("logs"), 0o700); err != nil {
		return err
	}
	log, err := os.Create(d.path("logs", name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(d.exe, args...)
	cmd.Dir = d.dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "SCELLIS_HOME="+d.path(".scellis"))
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	done := make(chan struct{})
	d.procs[name], d.exited[name] = cmd, done
	go func() { cmd.Wait(); log.Close(); close(done) }()
	return nil
}

// stopAll ends every child: SIGTERM, then SIGKILL for stragglers.
func (d *federationDemo) stopAll() {
	for _, p := range d.procs {
		p.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(5 * time.Second)
	for name, done := range d.exited {
		select {
		case <-done:
		case <-deadline:
			d.procs[name].Process.Kill()
		}
	}
}

func (d *federationDemo) client() (*api.Client, *identity.Federation, error) {
	id, _, err := identity.Load(d.path("scientist", "identity.key"), identity.LoadOptions{})
	if err != nil {
		return nil, nil, err
	}
	fed, err := identity.LoadFederation(d.fed)
	if err != nil {
		return nil, nil, err
	}
	c, err := api.NewClient(id, fed)
	return c, fed, err
}

// cli runs a scellis command in this process as the scientist.
func (d *federationDemo) cli(args ...string) error {
	args = append(args, "--identity", d.path("scientist", "identity.key"), "--federation", d.fed)
	if code := run(args, d.out, d.out); code != 0 {
		return fmt.Errorf("scellis %s exited %d", strings.Join(args[:2], " "), code)
	}
	return nil
}

func (d *federationDemo) run(ctx context.Context) error {
	d.step("setting up a federation in %s: 3 aggregator nodes, %d hospital silos, non-IID patient data", d.dir, demoSilos)
	if err := d.setup(); err != nil {
		return err
	}
	for i := 1; i <= 3; i++ {
		if err := d.start(fmt.Sprintf("agg-%d", i), "aggregator", "--config", fmt.Sprintf("agg-%d.yaml", i)); err != nil {
			return err
		}
	}
	for i := 1; i <= demoSilos; i++ {
		if err := d.start(fmt.Sprintf("hospital-%d", i), "silo", "--config", fmt.Sprintf("hospital-%d.yaml", i)); err != nil {
			return err
		}
	}
	c, fed, err := d.client()
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := c.Jobs(wctx); err != nil {
		return fmt.Errorf("the aggregator cluster did not come up (see %s): %w", d.path("logs"), err)
	}
	fmt.Fprintf(d.out, "cluster up; logs in %s\n", d.path("logs"))
	if err := d.printStudio(); err != nil {
		return err
	}

	// Record-level DP-SGD from the planner: ε ≤ 1 per round, ≤ 6 for the
	// run, for 800 records per hospital (scellis privacy plan).
	plan, err := dp.PlanDPSGD(6, 1, 1e-5, demoRows, demoRounds, nil, dp.Improved)
	if err != nil {
		return err
	}
	sigma := math.Ceil(plan.Sigma*1000) / 1000
	d.step(fmt.Sprintf("FedProx, %d rounds, record-level DP-SGD (clip 1, σ %g, q %g, %d steps per round: ε %.2g per round, %.2g for the run; from scellis privacy plan), secure aggregation; hospital-4 is killed after the first round",
		demoRounds, sigma, plan.Q, plan.StepsPerRound, plan.RoundEpsilon, plan.Epsilon))
	features, _ := datagen.HospitalModel()
	spec := &fl.RunSpec{Name: "fedprox-hospitals", Strategy: "fedprox", Params: map[string]any{"mu": 0.1, "lr": 0.5, "steps": int64(plan.StepsPerRound)},
		Model:   fl.ModelSpec{Kind: "logistic", Inputs: 9, Features: features, Label: datagen.HospitalLabel},
		Dataset: "patients", Rounds: demoRounds, MinCohort: 3,
		DP: true, Clip: 1, Sigma: sigma, Q: plan.Q, Steps: plan.StepsPerRound, SecureAgg: true, Seed: 7,
		// Each hospital standardises with its own statistics: a federated
		// statistics step would be one more release, charged as a Gaussian
		// at q = 1 with the run's σ (ε ≈ 3.2 at σ 1.4), over the demo's
		// "ε ≤ 1 per round" (docs/models.md has the statistics step).
		Standardize: fl.StandardizeLocal}
	cat, err := catalog.Builtin()
	if err != nil {
		return err
	}
	canon, id, _, err := spec.Resolve(cat, d.dir)
	if err != nil {
		return err
	}
	b, err := content.Encode(canon)
	if err != nil {
		return err
	}
	if _, err := c.PutBlob(wctx, b); err != nil {
		return err
	}
	if _, err := c.StartRun(wctx, api.RunRequest{Spec: id}); err != nil {
		return err
	}
	go func() {
		for ctx.Err() == nil {
			st, err := c.Run(ctx, id)
			// After the first round, so that rounds remain for the drop
			// to show in: a round takes well under a second.
			if err == nil && len(st.Models) >= 1 {
				fmt.Fprintln(d.out, "   (killing hospital-4 with SIGKILL: the next rounds go on with three sites)")
				d.procs["hospital-4"].Process.Kill()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	rctx, rcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer rcancel()
	if err := watchRun(rctx, c, fed, id, d.out); err != nil {
		return err
	}
	if err := d.evaluate(id); err != nil {
		return err
	}

	d.step("each hospital's privacy ledger (what its compliance officer reads)")
	for i := 1; i <= demoSilos; i++ {
		name := fmt.Sprintf("hospital-%d", i)
		fmt.Fprintf(d.out, "-- %s\n", name)
		if code := run([]string{"ledger", "verify", "--ledger", d.path(name, "data", "privacy.ledger")}, d.out, d.out); code != 0 {
			return fmt.Errorf("%s's ledger does not verify", name)
		}
		run([]string{"ledger", "show", "--ledger", d.path(name, "data", "privacy.ledger")}, d.out, d.out)
	}

	d.step("the receipt chain, replicated on all three aggregators")
	if err := d.cli("receipts", "verify"); err != nil {
		return err
	}
	if err := d.cli("aggregator", "status"); err != nil {
		return err
	}

	d.step("a learning-rate × L2 sweep on the same pool (the three live silos execute it, each shard verified by two)")
	if err := os.WriteFile(d.path("sweep.yaml"), []byte(demoPoolSweep), 0o600); err != nil {
		return err
	}
	jobID := new(strings.Builder)
	if code := run([]string{"job", "submit", d.path("sweep.yaml"), "--identity", d.path("scientist", "identity.key"), "--federation", d.fed}, jobID, d.out); code != 0 {
		return fmt.Errorf("submitting the sweep failed")
	}
	if err := d.cli("job", "result", strings.TrimSpace(jobID.String()), "--wait", "--out", d.path("out", "sweep")); err != nil {
		return err
	}
	if d.stay {
		fmt.Fprintf(d.out, "\nthe federation stays up; the Studio serves at https://%s/ — press Ctrl-C to stop\n", d.studio)
		<-ctx.Done()
	}
	return nil
}

// printStudio prints the URL of the Studio, signed in as the scientist
// with an 8-hour viewer token.
func (d *federationDemo) printStudio() error {
	id, _, err := identity.Load(d.path("scientist", "identity.key"), identity.LoadOptions{})
	if err != nil {
		return err
	}
	fed, err := identity.LoadFederation(d.fed)
	if err != nil {
		return err
	}
	tok, _, err := studio.IssueToken(id, fed, 8*time.Hour, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "live view (Studio, signed in as the scientist for 8 h; the certificate is the node's own, so the browser asks you to accept it):\n  https://%s/?token=%s\n", d.studio, tok)
	return nil
}

const demoPoolSweep = `name: pool-sweep
program: train-eval
partitioner:
  use: grid
  params: {lr: [0.03, 0.1, 0.3], l2: [0.0, 0.01, 0.1]}
reducer:
  use: collect
  params: {metric: auc, goal: max}
params: {model: logistic, epochs: 3, batch_size: 32, test_frac: 0.25, seed: 1}
inputs:
  # generated data, classed public so any pool member may compute on it
  data: {path: data/hospital-1.csv, label: outcome, class: public}
`
