package dp

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"testing"

	"github.com/scellis/scellis/diag"
)

func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	kp := filepath.Join(dir, "silo.key")
	priv, err := GenerateKeyFile(kp)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(kp); fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v", fi.Mode().Perm())
	}
	if _, err := GenerateKeyFile(kp); err == nil {
		t.Fatal("a key file was overwritten")
	}
	back, err := ReadPrivateKeyFile(kp)
	if err != nil || !back.Equal(priv) {
		t.Fatalf("read back %v", err)
	}
	pp := filepath.Join(dir, "silo.pub")
	pub := priv.Public().(ed25519.PublicKey)
	if err := WritePublicKeyFile(pp, pub); err != nil {
		t.Fatal(err)
	}
	if err := WritePublicKeyFile(pp, pub); err != nil {
		t.Fatalf("rewriting the same public key: %v", err)
	}
	for _, f := range []string{pp, kp} {
		got, err := ReadPublicKeyFile(f)
		if err != nil || !pub.Equal(got) {
			t.Fatalf("%s: public key %v, %v", f, got, err)
		}
	}
	data, _ := os.ReadFile(pp)
	if p, err := ParsePublicKey(string(data[:len(data)-1])); err != nil || !pub.Equal(p) {
		t.Fatalf("public key file %q does not parse: %v", data, err)
	}
	other, _ := GenerateKeyFile(filepath.Join(dir, "other.key"))
	if err := WritePublicKeyFile(pp, other.Public().(ed25519.PublicKey)); err == nil {
		t.Fatal("a public key file was overwritten with another key")
	}
	os.WriteFile(filepath.Join(dir, "junk"), []byte("junk"), 0o600)
	for _, f := range []string{"junk", "missing"} {
		_, err := ReadPrivateKeyFile(filepath.Join(dir, f))
		if ds, ok := diag.As(err); !ok || ds[0].Code != diag.LedgerKeyFile {
			t.Errorf("%s: %v", f, err)
		}
	}
}
