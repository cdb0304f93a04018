package safefile

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestReadFileRefusesWhatWouldHangOrExhaust(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 2048), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := filepath.Join(dir, "ok")
	if err := os.WriteFile(ok, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want error
	}{
		{fifo, ErrNotRegular},
		{"/dev/zero", ErrNotRegular},
		{dir, ErrNotRegular},
		{big, ErrTooLarge},
	} {
		if _, err := ReadFile(c.path, 1024); !errors.Is(err, c.want) {
			t.Errorf("ReadFile(%s) = %v, want %v", c.path, err, c.want)
		}
	}
	if b, err := ReadFile(ok, 5); err != nil || string(b) != "hello" {
		t.Fatalf("ReadFile(ok) = %q, %v", b, err)
	}
	if _, err := ReadFile(filepath.Join(dir, "missing"), 5); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}
