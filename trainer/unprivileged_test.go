package trainer_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/scellis/scellis/trainer"
)

const unprivilegedEnv = "SCELLIS_TRAINER_TEST_UNPRIVILEGED"

// TestSandboxUnprivileged: a silo that does not run as root makes a user
// namespace first, in which it may mount and bind; its trainer trains
// and stays held in (no network, no file beside its data). Run as root,
// the test runs itself again as nobody; run as another user, it is that
// path already.
func TestSandboxUnprivileged(t *testing.T) {
	if os.Getuid() == 0 && os.Getenv(unprivilegedEnv) == "" {
		needNumpy(t)
		// A copy of this test binary and a temporary folder nobody may use:
		// beside the harness's temporary root, which only root may enter.
		dir, err := os.MkdirTemp(filepath.Dir(os.TempDir()), "scellis-unprivileged-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		if err := os.Chmod(dir, 0o1777); err != nil {
			t.Fatal(err)
		}
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "trainer.test")
		src, err := os.Open(self)
		if err != nil {
			t.Fatal(err)
		}
		dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(dst, src)
		src.Close()
		if cerr := dst.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "-test.run=^TestSandboxUnprivileged$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), unprivilegedEnv+"=1", "TMPDIR="+dir, "HOME="+dir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		t.Logf("as nobody:\n%s", out)
		if err != nil {
			t.Fatalf("the test as nobody failed: %v", err)
		}
		return
	}
	if os.Getuid() == 0 {
		t.Fatal("still root")
	}
	b, data, w0, layout := fixture(t)
	res, err := trainer.Run(context.Background(), job(b, data, w0, layout, map[string]any{"lr": 0.2, "epochs": 2}, t.TempDir()))
	if err != nil || res.Examples != 300 {
		t.Fatalf("training as an unprivileged user: %+v %v", res, err)
	}
	beside := filepath.Join(filepath.Dir(data), "beside.csv")
	if err := os.WriteFile(beside, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	j := job(b, data, w0, layout, map[string]any{"misbehave": "escape", "port": acceptingPort(t), "forbidden": []any{beside}}, t.TempDir())
	j.Mode = trainer.ModeEvaluate
	res, err = trainer.Run(context.Background(), j)
	if err != nil {
		t.Fatal(err)
	}
	if res.Metrics["socket"] != 0 || res.Metrics["file0"] != 0 || res.Metrics["scratch"] != 1 || res.Metrics["capabilities"] != 0 {
		t.Fatalf("the unprivileged sandbox let the trainer out: %v", res.Metrics)
	}
}
