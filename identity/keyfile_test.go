package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/scellis/scellis/diag"
)

func init() { scryptWorkFactor = 10 } // keep tests fast; the format is the same

func wantCode(t *testing.T, err error, code diag.Code) *diag.Diagnostic {
	t.Helper()
	ds, ok := diag.As(err)
	if !ok {
		t.Fatalf("got %v, want diagnostic %s", err, code)
	}
	if ds[0].Code != code {
		t.Fatalf("got %s (%v), want %s", ds[0].Code, err, code)
	}
	return ds[0]
}

func TestKeyFilePlaintext(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "identity.key")
	id := seeded(3)
	if err := Save(path, id, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(data), "-----BEGIN PRIVATE KEY-----\n") {
		t.Fatalf("not PKCS#8 PEM:\n%s", data)
	}
	got, warns, err := Load(path, LoadOptions{})
	if err != nil || len(warns) != 0 {
		t.Fatalf("Load: %v %v", err, warns)
	}
	if !got.Public().Equal(id.Public()) {
		t.Fatal("loaded a different key")
	}
	// Sign with the loaded key, verify with the original public key.
	if !Verify(id.Public(), PurposeReceipt, []byte("m"), Sign(got, PurposeReceipt, []byte("m"))) {
		t.Fatal("loaded key does not sign like the original")
	}
	// Never overwrite.
	wantCode(t, Save(path, seeded(4), SaveOptions{}), diag.KeyFileExists)
	got, _, _ = Load(path, LoadOptions{})
	if !got.Public().Equal(id.Public()) {
		t.Fatal("Save replaced an existing key")
	}
}

func TestKeyFilePassphrase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "identity.key")
	id := seeded(5)
	const pass = "correct horse battery staple"
	if err := Save(path, id, SaveOptions{Passphrase: pass}); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(data), "-----BEGIN AGE ENCRYPTED FILE-----") || strings.Contains(string(data), "PRIVATE KEY") {
		t.Fatalf("not an armored age file:\n%s", data)
	}
	got, _, err := Load(path, LoadOptions{Passphrase: pass})
	if err != nil || !got.Public().Equal(id.Public()) {
		t.Fatalf("Load with passphrase: %v", err)
	}
	err = func() error { _, _, err := Load(path, LoadOptions{Passphrase: "wrong"}); return err }()
	d := wantCode(t, err, diag.KeyFileUnreadable)
	if !strings.Contains(d.Message, "wrong passphrase") || strings.Contains(err.Error(), "wrong\"") {
		t.Fatalf("message %q", d.Message)
	}
	_, _, err = Load(path, LoadOptions{})
	d = wantCode(t, err, diag.KeyFileUnreadable)
	if !strings.Contains(d.Message, "encrypted") {
		t.Fatalf("message %q", d.Message)
	}
	if strings.Contains(err.Error(), pass) {
		t.Fatal("error shows the passphrase")
	}
}

func TestKeyFileRecipient(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "identity.key")
	ageID, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	idFile := filepath.Join(dir, "age.txt")
	os.WriteFile(idFile, []byte("# test\n"+ageID.String()+"\n"), 0o600)
	id := seeded(6)
	if err := Save(path, id, SaveOptions{Recipient: ageID.Recipient().String()}); err != nil {
		t.Fatal(err)
	}
	got, _, err := Load(path, LoadOptions{AgeIdentityFile: idFile})
	if err != nil || !got.Public().Equal(id.Public()) {
		t.Fatalf("Load with age identity: %v", err)
	}
	other, _ := age.GenerateX25519Identity()
	otherFile := filepath.Join(dir, "other.txt")
	os.WriteFile(otherFile, []byte(other.String()+"\n"), 0o600)
	_, _, err = Load(path, LoadOptions{AgeIdentityFile: otherFile, Passphrase: "x"})
	wantCode(t, err, diag.KeyFileUnreadable)
	_, _, err = Load(path, LoadOptions{AgeIdentityFile: filepath.Join(dir, "missing")})
	wantCode(t, err, diag.KeyEncryption)
}

func TestSaveRefusesBadOptions(t *testing.T) {
	dir := t.TempDir()
	ageID, _ := age.GenerateX25519Identity()
	wantCode(t, Save(filepath.Join(dir, "a"), seeded(1), SaveOptions{Passphrase: "p", Recipient: ageID.Recipient().String()}), diag.KeyEncryption)
	wantCode(t, Save(filepath.Join(dir, "b"), seeded(1), SaveOptions{Recipient: "age1nope"}), diag.KeyEncryption)
	wantCode(t, Save(filepath.Join(dir, "c"), seeded(1), SaveOptions{Recipient: ageID.Recipient().String() + "\n" + ageID.Recipient().String()}), diag.KeyEncryption)
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("refused saves left files: %v", ents)
	}
}

func TestKeyFilePermissions(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix permissions")
	}
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain.key")
	enc := filepath.Join(dir, "enc.key")
	Save(plain, seeded(1), SaveOptions{})
	Save(enc, seeded(2), SaveOptions{Passphrase: "pw"})

	os.Chmod(plain, 0o644)
	_, _, err := Load(plain, LoadOptions{})
	d := wantCode(t, err, diag.KeyFileInsecure)
	if d.Severity != diag.Error || !strings.Contains(d.Help, "chmod 600") {
		t.Fatalf("world-readable plaintext key: %+v", d)
	}

	os.Chmod(plain, 0o640)
	id, warns, err := Load(plain, LoadOptions{})
	if err != nil || id == nil || len(warns) != 1 || warns[0].Code != diag.KeyFileInsecure || warns[0].Severity != diag.Warning {
		t.Fatalf("group-readable plaintext key: %v %v", err, warns)
	}

	os.Chmod(enc, 0o644)
	id, warns, err = Load(enc, LoadOptions{Passphrase: "pw"})
	if err != nil || id == nil || len(warns) != 1 || warns[0].Severity != diag.Warning {
		t.Fatalf("world-readable encrypted key: %v %v", err, warns)
	}
	if warns.Err() != nil {
		t.Fatal("a warning list must not be an error")
	}
}

func TestLoadRefusesOtherFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, data, 0o600)
		return p
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(ec)
	ecPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	pubPEM := []byte(seeded(1).Public().String() + "\n")
	for name, data := range map[string][]byte{
		"ecdsa.key":   ecPEM,
		"pub.key":     pubPEM,
		"empty.key":   nil,
		"garbage.key": []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
		"huge.key":    make([]byte, maxKeyFile+10),
	} {
		_, _, err := Load(write(name, data), LoadOptions{})
		d := wantCode(t, err, diag.KeyFileUnreadable)
		if d.Subject == "" {
			t.Errorf("%s: no subject", name)
		}
	}
	_, _, err := Load(filepath.Join(dir, "missing.key"), LoadOptions{})
	wantCode(t, err, diag.KeyFileUnreadable)
	_, _, err = Load(dir, LoadOptions{})
	wantCode(t, err, diag.KeyFileUnreadable)
}

func TestReadPassphraseFile(t *testing.T) {
	dir := t.TempDir()
	for in, want := range map[string]string{
		"pw\n":    "pw",
		"pw\r\n":  "pw",
		"pw":      "pw",
		"pw \n\n": "pw \n",
		"p w\r":   "p w\r",
	} {
		p := filepath.Join(dir, "pf")
		os.WriteFile(p, []byte(in), 0o600)
		got, err := ReadPassphraseFile(p)
		if err != nil || got != want {
			t.Errorf("ReadPassphraseFile(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	p := filepath.Join(dir, "empty")
	os.WriteFile(p, []byte("\n"), 0o600)
	_, err := ReadPassphraseFile(p)
	wantCode(t, err, diag.KeyEncryption)
}
