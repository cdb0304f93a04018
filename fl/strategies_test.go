package fl

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/datagen"
	"github.com/scellis/scellis/model"
	"github.com/scellis/scellis/script"
)

// evalAll sums the strategy's evaluate over datasets.
func evalAll(t testing.TB, c *catalog.Catalog, s *Strategy, g Global, ds ...*model.Dataset) (loss, acc float64) {
	t.Helper()
	var sum map[string]float64
	for _, d := range ds {
		m, err := Evaluate(context.Background(), script.Env{Catalog: c}, s, g, d)
		if err != nil {
			t.Fatal(err)
		}
		if sum == nil {
			sum = map[string]float64{}
		}
		for k, v := range m {
			sum[k] += v
		}
	}
	return sum["loss"] / sum["examples"], sum["correct"] / sum["examples"]
}

// FedAvg over four heterogeneous hospitals reaches the accuracy of the same
// model trained centrally on the pooled rows (DP off, the own regime).
func TestFedAvgMatchesCentralised(t *testing.T) {
	c := builtins(t)
	train, pooledTrain, pooledTest := hospitalSplits(t, 4, 1500, 1)
	s := load(t, c, "fedavg", map[string]any{"epochs": int64(1), "lr": 0.1, "batch_size": int64(32)})
	start := time.Now()
	h := simulate(t, c, s, train, 20, SimOptions{Seed: 1})
	elapsed := time.Since(start)
	_, fedAcc := evalAll(t, c, s, h.Final, pooledTest)

	m, err := model.New(model.Spec{Kind: model.KindLogistic, Inputs: pooledTrain.Dims()}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := model.Train(m, pooledTrain, model.TrainConfig{Epochs: 20, LR: 0.1, BatchSize: 32}); err != nil {
		t.Fatal(err)
	}
	central := model.Evaluate(m, pooledTest)
	t.Logf("held-out accuracy: FedAvg %.4f (20 rounds × 1 epoch, 4 sites, %v), centralised %.4f (20 epochs on %d pooled rows)",
		fedAcc, elapsed.Round(time.Millisecond), central.Accuracy, pooledTrain.Rows())
	if math.Abs(fedAcc-central.Accuracy) > 0.02 {
		t.Fatalf("FedAvg accuracy %.4f is more than 2 points from centralised %.4f", fedAcc, central.Accuracy)
	}
	if first, last := h.Rounds[0].Mean("loss"), h.Rounds[19].Mean("loss"); !(last < first) {
		t.Fatalf("training loss went from %.4f to %.4f", first, last)
	}
}

// synthetic11 returns Synthetic(1,1) over 30 devices, each capped at 200
// rows so the comparison runs in a second or two.
func synthetic11(t testing.TB, seed uint64) []*model.Dataset {
	t.Helper()
	sites, err := datagen.Synthetic(1, 1, 30, seed)
	if err != nil {
		t.Fatal(err)
	}
	out := siteData(sites)
	for i, d := range out {
		if d.Rows() > 200 {
			idx := make([]int, 200)
			for j := range idx {
				idx[j] = j
			}
			out[i] = d.Subset(idx)
		}
	}
	return out
}

// Li et al. 2020, Figure 1 (Synthetic(1,1), 90% stragglers): FedAvg drops
// the stragglers and diverges; FedProx with μ = 1 keeps their partial work
// and reaches a lower training loss. Paper settings (softmax regression,
// 10 of 30 devices per round, E = 20 local epochs, batch 10, lr 0.01) with
// fewer rounds and rows.
func TestFedProxBeatsFedAvgWithStragglers(t *testing.T) {
	c := builtins(t)
	seeds := []uint64{1, 2}
	if testing.Short() {
		seeds = seeds[:1]
	}
	for _, seed := range seeds {
		sites := synthetic11(t, seed)
		params := map[string]any{"model": "softmax", "classes": int64(10), "epochs": int64(20), "lr": 0.01, "batch_size": int64(10)}
		opts := SimOptions{Seed: seed, Cohort: 10, Stragglers: 0.9}
		loss := map[string]float64{}
		for _, name := range []string{"fedavg", "fedprox"} {
			p := map[string]any{"mu": 1.0}
			for k, v := range params {
				p[k] = v
			}
			s := load(t, c, name, p)
			start := time.Now()
			h := simulate(t, c, s, sites, 12, opts)
			loss[name], _ = evalAll(t, c, s, h.Final, sites...)
			kept := 0
			for _, r := range h.Rounds {
				kept += r.Participants
			}
			t.Logf("seed %d: %s training loss %.4f after 12 rounds (%d updates kept of 120, %v)", seed, name, loss[name], kept, time.Since(start).Round(time.Millisecond))
		}
		if !(loss["fedprox"] < loss["fedavg"]) || !(loss["fedprox"] < math.Log(10)) {
			t.Fatalf("seed %d: FedProx %.4f, FedAvg %.4f, initial %.4f: FedProx should be lowest", seed, loss["fedprox"], loss["fedavg"], math.Log(10))
		}
	}
}

// SCAFFOLD's control variate is client state: it round-trips through the
// canonical encoding a silo persists, changes from round to round, and
// training with it reduces the loss.
func TestScaffoldClientState(t *testing.T) {
	c := builtins(t)
	env := script.Env{Catalog: c}
	ctx := context.Background()
	train, _, _ := hospitalSplits(t, 4, 400, 2)
	s := load(t, c, "scaffold", map[string]any{"epochs": int64(1), "lr": 0.1})
	g, err := Init(ctx, env, s, train[0].Dims())
	if err != nil {
		t.Fatal(err)
	}
	if cv, ok := g.Vector("c"); !ok || len(cv) != 10 {
		t.Fatalf("initial server control variate %v", g["c"])
	}
	var prev []byte
	state := map[string]any(nil)
	for round := range 3 {
		out, err := ClientStep(ctx, env, s.With(map[string]any{"round": int64(round)}), g, train[0], state, Privacy{})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Update) != 20 || out.Weight != 1 {
			t.Fatalf("update of %d values, weight %v: want concat(Δy, Δc) of 2×10, weight 1", len(out.Update), out.Weight)
		}
		b, err := EncodeState(out.State)
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeState(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, out.State) {
			t.Fatalf("round %d: state %v decodes as %v", round, out.State, back)
		}
		if again, _ := EncodeState(back); !bytes.Equal(again, b) {
			t.Fatal("re-encoding a decoded state changes its bytes")
		}
		if ci, ok := back["c"].([]float64); !ok || len(ci) != 10 {
			t.Fatalf("decoded control variate %T %v", back["c"], back["c"])
		}
		if bytes.Equal(b, prev) {
			t.Fatalf("round %d: the control variate did not change", round)
		}
		prev, state = b, back
		// A server step on this site's update alone moves c.
		if g, err = ServerStep(ctx, env, s.With(map[string]any{"sites": int64(4)}), g, out.Update, out.Weight); err != nil {
			t.Fatal(err)
		}
	}

	h := simulate(t, c, s, train, 8, SimOptions{Seed: 3})
	first, last := h.Rounds[0].Mean("loss"), h.Rounds[7].Mean("loss")
	t.Logf("SCAFFOLD: loss %.4f → %.4f", first, last)
	if !(last < first-0.1) {
		t.Fatalf("SCAFFOLD loss %.4f → %.4f", first, last)
	}
	for i, b := range h.States {
		st, err := DecodeState(b)
		if err != nil || st["c"] == nil {
			t.Fatalf("site %d: persisted state %v (%v)", i, st, err)
		}
	}
}

// DiLoCo (inner AdamW, outer Nesterov) and FedBuff (asynchronous, stale
// updates down-weighted) run and reduce the loss.
func TestDiLoCoAndFedBuffReduceLoss(t *testing.T) {
	c := builtins(t)
	train, _, test := hospitalSplits(t, 4, 400, 4)

	s := load(t, c, "diloco", map[string]any{"steps": int64(20), "lr": 0.02})
	h := simulate(t, c, s, train, 10, SimOptions{Seed: 4})
	first, last := h.Rounds[0].Mean("loss"), h.Rounds[9].Mean("loss")
	testLoss, _ := evalAll(t, c, s, h.Final, test)
	t.Logf("DiLoCo: loss %.4f → %.4f (held out %.4f)", first, last, testLoss)
	if !(last < first-0.1) {
		t.Fatalf("DiLoCo loss %.4f → %.4f", first, last)
	}
	if mom, _ := h.Final.Vector("momentum"); len(mom) != 10 {
		t.Fatalf("outer momentum %v", h.Final["momentum"])
	}
	st, err := DecodeState(h.States[0])
	if err != nil {
		t.Fatal(err)
	}
	if adam, _ := st["adam"].(map[string]any); adam == nil || adam["t"] != int64(10*20) {
		t.Fatalf("site 0's inner AdamW state %v: want its steps carried over 10 rounds of 20", st["adam"])
	}

	s = load(t, c, "fedbuff", map[string]any{"epochs": int64(1), "lr": 0.1})
	h = simulate(t, c, s, train, 12, SimOptions{Seed: 5, Async: &Async{Buffer: 3}, Stragglers: 0.3})
	first, last = h.Rounds[0].Mean("loss"), h.Rounds[11].Mean("loss")
	maxStale := 0
	for _, r := range h.Rounds {
		if r.Participants != 3 {
			t.Fatalf("server step %d applied %d updates, want the buffer of 3", r.Index, r.Participants)
		}
		maxStale = max(maxStale, r.MaxStaleness)
	}
	t.Logf("FedBuff: loss %.4f → %.4f, stalest update %d versions old", first, last, maxStale)
	if !(last < first-0.1) || maxStale == 0 {
		t.Fatalf("FedBuff loss %.4f → %.4f, max staleness %d", first, last, maxStale)
	}
	if h.Final["round"] != int64(12) {
		t.Fatalf("version %v after 12 server steps", h.Final["round"])
	}
}

// A strategy the user wrote — FedAdam, not in the built-in catalog — runs
// through exactly the path the built-ins take: resolved by path into the
// catalog, parsed by catalog.Parse, called by script.Call.
func TestUserWrittenFedAdam(t *testing.T) {
	c := builtins(t)
	if _, ok := c.Lookup("fedadam"); ok {
		t.Fatal("fedadam is built in: the test proves nothing")
	}
	train, _, test := hospitalSplits(t, 4, 400, 6)
	s := load(t, c, "testdata/fedadam.star", map[string]any{"epochs": int64(1), "lr": 0.05})
	if s.Entry.Path != "testdata/fedadam.star" {
		t.Fatalf("entry path %q", s.Entry.Path)
	}
	if e, ok := c.Lookup(string(s.Entry.Ref)); !ok || e != s.Entry {
		t.Fatal("the user strategy is not in the catalog by ref")
	}
	h := simulate(t, c, s, train, 10, SimOptions{Seed: 6})
	first, last := h.Rounds[0].Mean("loss"), h.Rounds[9].Mean("loss")
	testLoss, _ := evalAll(t, c, s, h.Final, test)
	t.Logf("FedAdam: loss %.4f → %.4f (held out %.4f)", first, last, testLoss)
	if !(last < first-0.1) {
		t.Fatalf("FedAdam loss %.4f → %.4f", first, last)
	}
}

// With DP off and fixed seeds, two simulations give the same final model
// hash, however many client steps run at once; another seed gives another.
func TestSimulationDeterministic(t *testing.T) {
	c := builtins(t)
	train, _, _ := hospitalSplits(t, 4, 300, 7)
	for _, name := range []string{"fedprox", "scaffold"} {
		s := load(t, c, name, map[string]any{"epochs": int64(1), "lr": 0.1, "mu": 0.1})
		opts := SimOptions{Seed: 8, Stragglers: 0.5}
		a := simulate(t, c, s, train, 4, opts)
		opts.Parallel = 1
		b := simulate(t, c, s, train, 4, opts)
		opts.Seed = 9
		other := simulate(t, c, s, train, 4, opts)
		if a.Hash != b.Hash || !reflect.DeepEqual(a.Rounds, b.Rounds) || !reflect.DeepEqual(a.States, b.States) {
			t.Fatalf("%s: two runs with one seed differ: %s vs %s", name, a.Hash, b.Hash)
		}
		if h, err := a.Final.Hash(); err != nil || h != a.Hash {
			t.Fatalf("%s: History.Hash %s, Final.Hash() %s (%v)", name, a.Hash, h, err)
		}
		if other.Hash == a.Hash {
			t.Fatalf("%s: another seed gives the same model", name)
		}
		t.Logf("%s: final model %s", name, a.Hash)
	}
}

// The global state survives its canonical encoding: vectors stay vectors
// and the bytes are stable.
func TestGlobalEncoding(t *testing.T) {
	g := Global{"w": []float64{0.5, -1, 3}, "round": int64(2), "tags": []any{"a", int64(1)}, "nested": map[string]any{"v": []float64{1.5}}}
	b, err := g.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeGlobal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, g) {
		t.Fatalf("decoded %#v, want %#v", back, g)
	}
	b2, _ := back.Encode()
	h1, _ := g.Hash()
	h2, _ := back.Hash()
	if !bytes.Equal(b, b2) || h1 != h2 {
		t.Fatal("re-encoding changes the bytes")
	}
	if st, err := DecodeState(nil); st != nil || err != nil {
		t.Fatalf("empty state decodes as %v, %v", st, err)
	}
	if b, _ := EncodeState(nil); len(b) != 1 {
		t.Fatalf("nil state encodes as %x", b)
	}
}

// The example strategy in docs/content.md runs as written.
func TestDocumentedExampleRuns(t *testing.T) {
	doc, err := os.ReadFile("../docs/content.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	i := strings.Index(text, `    """my-avg:`)
	j := strings.Index(text, "(`fl/testdata/fedadam.star`")
	if i < 0 || j < i {
		t.Fatal("the my-avg example is missing from docs/content.md")
	}
	var src strings.Builder
	for _, line := range strings.Split(strings.TrimRight(text[i:j], "\n"), "\n") {
		src.WriteString(strings.TrimPrefix(line, "    ") + "\n")
	}
	path := filepath.Join(t.TempDir(), "my-avg.star")
	if err := os.WriteFile(path, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	c := builtins(t)
	train, _, _ := hospitalSplits(t, 3, 200, 15)
	s := load(t, c, path, nil)
	h := simulate(t, c, s, train, 5, SimOptions{Seed: 1})
	if first, last := h.Rounds[0].Mean("loss"), h.Rounds[4].Mean("loss"); !(last < first) {
		t.Fatalf("my-avg loss %.4f → %.4f", first, last)
	}
}

// What federation buys (docs/limits.md): the statistical power of the
// pooled rows, not speed. FedAvg against each site's model trained on its
// own rows alone, all scored on every site's held-out rows: with small
// sites the federated model beats the average site alone; with large ones
// a site alone already nears the pooled accuracy. DP off, seeds fixed.
func TestFederationBuysStatisticalPower(t *testing.T) {
	c := builtins(t)
	for _, tc := range []struct{ sites, rows int }{{8, 80}, {4, 1500}} {
		train, pooledTrain, pooledTest := hospitalSplits(t, tc.sites, tc.rows, 1)
		s := load(t, c, "fedavg", map[string]any{"epochs": int64(1), "lr": 0.1, "batch_size": int64(32)})
		h := simulate(t, c, s, train, 20, SimOptions{Seed: 1})
		_, fedAcc := evalAll(t, c, s, h.Final, pooledTest)
		var alone []float64
		mean := 0.0
		for _, d := range train {
			m, err := model.New(model.Spec{Kind: model.KindLogistic, Inputs: d.Dims()}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := model.Train(m, d, model.TrainConfig{Epochs: 20, LR: 0.1, BatchSize: 32}); err != nil {
				t.Fatal(err)
			}
			acc := model.Evaluate(m, pooledTest).Accuracy
			alone = append(alone, acc)
			mean += acc / float64(len(train))
		}
		t.Logf("%d sites × %d rows (%d pooled training rows, %d held out): FedAvg %.4f; each site alone %.4f (mean %.4f)",
			tc.sites, tc.rows, pooledTrain.Rows(), pooledTest.Rows(), fedAcc, alone, mean)
		if tc.rows < 100 && fedAcc <= mean {
			t.Errorf("with small sites FedAvg (%.4f) should beat the mean site alone (%.4f)", fedAcc, mean)
		}
	}
}
