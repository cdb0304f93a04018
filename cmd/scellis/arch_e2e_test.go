package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// crossArchJobs are the replayable examples that once gave other bytes on
// arm64 than on amd64 (kfold, matmul, sweep: examples/), cut to the
// smallest sizes that showed it: an MLP fold (gonum's kernels, math.Tanh
// and math.Exp, fused multiply-adds in training), a matrix product of
// normal draws (gonum's Dgemm, NormFloat64's tail) and a logistic grid
// (the sigmoid's math.Exp, fused updates); content of a user's own
// calling the math module's exp, log and tanh (mathFnsProgram); and a
// small cnn trained and scored by content (cnnProgram: im2col, ReLU, max
// pooling and their gradients, on the package's kernels).
var crossArchJobs = map[string]string{
	"cnn": `name: cnn-small
program: ./cnn.star
partitioner: {use: range, params: {start: 0, count: 2, chunks: 2}}
reducer: concat
inputs:
  data: {path: hospital.csv, label: outcome, class: confidential}
`,
	"mathfns": `name: mathfns-small
program: ./fns.star
partitioner: {use: range, params: {start: 0, count: 600, chunks: 2}}
reducer: concat
`,
	"kfold": `name: kfold-small
program: train-eval
partitioner: {use: kfold, params: {k: 2}}
reducer: mean
params: {model: mlp, hidden: 4, epochs: 2, batch_size: 32, lr: 0.05, l2: 0.0001, seed: 2}
inputs:
  data: {path: hospital.csv, label: outcome, class: confidential}
`,
	"matmul": `name: matmul-small
program: matmul
partitioner: {use: range, params: {start: 0, count: 48, chunks: 2}}
reducer: concat
params: {n: 48, seed: 1}
verification: {freivalds: 4}
`,
	"sweep": `name: sweep-small
program: train-eval
partitioner:
  use: grid
  params: {lr: [0.03, 0.3], l2: [0.0, 0.01]}
reducer: {use: collect, params: {metric: auc, goal: max}}
params: {model: logistic, epochs: 2, batch_size: 32, test_frac: 0.25, seed: 1}
inputs:
  data: {path: hospital.csv, label: outcome, class: confidential}
`,
}

// cnnProgram trains a cnn over the nine features as a 3×3 image (four
// channels, pooled to 1×1, a dense layer of three) and returns its
// parameters and its loss.
const cnnProgram = `def run(params, inputs):
    train, test = data.standardize(inputs["data"], inputs["data"])
    m = model.train(kind = "cnn", data = train, image = [3, 3], conv = [4], hidden = 3, classes = 2,
                    epochs = 2, batch_size = 16, lr = 0.1, seed = params["start"])
    return [list(model.params(m)), model.evaluate(m, test)["loss"]]
`

// mathFnsProgram returns exp, log and tanh of normal draws.
const mathFnsProgram = `def run(params, inputs):
    out = []
    for _ in range(params["count"]):
        x = rng.normal()
        out.append([math.exp(3 * x), math.log(x * x + 1e-3), math.tanh(x), math.log(abs(x) + 1, 10)])
    return out
`

// TestReplayableAcrossArchitectures runs the replayable examples with this
// machine's amd64 binary and with a linux/arm64 build under Debian's
// qemu-user-static, and requires byte-identical result.json files: replicas
// of the replayable tier on mixed machines must agree (issue 37, item 5;
// docs/verification.md, "Across architectures").
func TestReplayableAcrossArchitectures(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("compares this machine's amd64 build with an emulated arm64 one; this machine is %s", runtime.GOARCH)
	}
	qemu, err := exec.LookPath("qemu-aarch64-static")
	if err != nil {
		t.Skip("no qemu-aarch64-static: apt-get install -y qemu-user-static (.ci/run installs it) to run the arm64 binary")
	}
	if testing.Short() {
		// Building the arm64 binary is most of this test's 20 s; the full
		// suite (and CI) runs it.
		t.Skip("cross-compiles and emulates arm64: runs without -short")
	}
	t.Parallel() // its own processes and directories
	csv, err := os.ReadFile(filepath.Join("..", "..", "examples", "data", "hospital-2.csv"))
	if err != nil {
		t.Fatal(err)
	}
	armBin := buildArm64(t)
	host := scellisBinary(t)
	for name, job := range crossArchJobs {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644); err != nil {
				t.Fatal(err)
			}
			for file, body := range map[string][]byte{"hospital.csv": csv, "fns.star": []byte(mathFnsProgram), "cnn.star": []byte(cnnProgram)} {
				if err := os.WriteFile(filepath.Join(dir, file), body, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			results := map[string][]byte{}
			for arch, argv := range map[string][]string{
				"amd64": {host},
				"arm64": {qemu, armBin},
			} {
				cmd := exec.Command(argv[0], append(argv[1:], "run", "job.yaml", "--out", arch)...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "SCELLIS_HOME="+filepath.Join(dir, ".scellis-"+arch))
				mustRun(t, cmd)
				b, err := os.ReadFile(filepath.Join(dir, arch, "result.json"))
				if err != nil {
					t.Fatal(err)
				}
				results[arch] = b
			}
			if len(results["amd64"]) == 0 || !bytes.Equal(results["amd64"], results["arm64"]) {
				t.Fatalf("result.json differs between amd64 and arm64:\n%s\n--- arm64:\n%s", results["amd64"], results["arm64"])
			}
		})
	}
}

// buildArm64 builds cmd/scellis for linux/arm64 with the release's settings
// (deploy/release/build.go: CGO_ENABLED=0, -trimpath, GOARM64=v8.0,
// -buildvcs=false), so the packages compiled here are the ones the release
// step of CI finds in the build cache.
func buildArm64(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "scellis-arm64")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+testVersion, "-o", out, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64", "GOARM64=v8.0",
		"GOFLAGS=-mod=readonly -buildvcs=false", "GOEXPERIMENT=")
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building scellis for linux/arm64: %v\n%s", err, msg)
	}
	return out
}

// TestReplayablePackagesHaveNoFMA compiles the packages of the replayable
// path for arm64 and fails on any fused multiply-add instruction in them,
// naming the source line: an unrounded x*y + z there would make arm64's
// results differ from amd64's again. It needs no emulator, so it holds the
// rule (docs/verification.md, "Across architectures") on every machine.
func TestReplayablePackagesHaveNoFMA(t *testing.T) {
	t.Parallel()
	pkgs := []string{"../../tensor", "../../model", "../../script", "../../internal/repmath"}
	build := exec.Command("go", append([]string{"build", "-trimpath", "-gcflags=-S", "-o", os.DevNull}, pkgs...)...)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64", "GOARM64=v8.0")
	out, err := build.CombinedOutput()
	if err != nil {
		t.Fatalf("compiling for arm64: %v\n%s", err, tail(out))
	}
	if !bytes.Contains(out, []byte("TEXT")) {
		t.Fatalf("the compiler printed no assembly to check:\n%s", tail(out))
	}
	var fused []string
	for line := range strings.Lines(string(out)) {
		if fmaInstruction.MatchString(line) {
			fused = append(fused, strings.TrimSpace(line))
		}
	}
	if len(fused) > 0 {
		t.Fatalf("fused multiply-adds on the replayable path (round the product with float64()):\n%s", strings.Join(fused, "\n"))
	}
}

var fmaInstruction = regexp.MustCompile(`\tFN?M(ADD|SUB)[DS]\t`)

func tail(b []byte) []byte { return b[max(0, len(b)-4000):] }
