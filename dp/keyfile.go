package dp

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
)

// Key files. Until the ledger reads keys through the shared identity package,
// a silo's Ed25519 key lives in files compatible with `scellis keygen`:
//
//	private: PEM "PRIVATE KEY", PKCS#8 (x509.MarshalPKCS8PrivateKey), mode 0600
//	public:  one line "ed25519:<standard base64 of the 32 key bytes>"
//
// Public keys are also read from a PEM "PUBLIC KEY" (PKIX) file or from the
// private key file. age-encrypted key files are not read here.

const (
	pemPrivate = "PRIVATE KEY"
	pemPublic  = "PUBLIC KEY"
)

// GenerateKeyFile creates a new Ed25519 key, writes it to path (which must
// not exist) with mode 0600, syncs it, and returns it.
func GenerateKeyFile(path string) (ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	if err := writeNewFile(path, pem.EncodeToMemory(&pem.Block{Type: pemPrivate, Bytes: der}), 0o600); err != nil {
		return nil, keyFileDiag(path, "cannot be created: %v", err)
	}
	return priv, nil
}

// WritePublicKeyFile writes pub to path as one line "ed25519:<base64>". An
// existing file holding the same key is left alone; one holding another key
// is an error.
func WritePublicKeyFile(path string, pub ed25519.PublicKey) error {
	data := []byte(PublicKeyString(pub) + "\n")
	if old, err := ReadPublicKeyFile(path); err == nil {
		if old.Equal(pub) {
			return nil
		}
		return keyFileDiag(path, "already holds another public key")
	}
	if err := writeNewFile(path, data, 0o644); err != nil {
		return keyFileDiag(path, "cannot be written: %v", err)
	}
	return nil
}

// ReadPrivateKeyFile reads an Ed25519 private key from a PEM PKCS#8 file.
// It refuses (SC5040) a key file that its group or other users may access:
// whoever reads the key can sign ledger entries.
func ReadPrivateKeyFile(path string) (ed25519.PrivateKey, error) {
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o077 != 0 {
		return nil, diag.New(diag.LedgerInsecure, path, "the ledger key file is accessible to others (mode %04o); refusing to use it", fi.Mode().Perm()).
			WithHelp("run: chmod 600 %s, and consider the key exposed if others may have read it", path)
	}
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	if block.Type != pemPrivate {
		return nil, keyFileDiag(path, "holds a %q PEM block, not a %q", block.Type, pemPrivate)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, keyFileDiag(path, "is not a PKCS#8 private key: %v", err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, keyFileDiag(path, "holds a %T, not an Ed25519 key", k)
	}
	return priv, nil
}

// ReadPublicKeyFile reads an Ed25519 public key from a file holding one line
// "ed25519:<base64>", a PEM PUBLIC KEY (PKIX), or a PEM PRIVATE KEY (whose
// public half is returned).
func ReadPublicKeyFile(path string) (ed25519.PublicKey, error) {
	if data, err := safefile.ReadFile(path, safefile.MaxKey); err == nil {
		if line := strings.TrimSpace(string(data)); strings.HasPrefix(line, "ed25519:") {
			pub, err := ParsePublicKey(line)
			if err != nil {
				return nil, keyFileDiag(path, "does not hold an Ed25519 public key: %v", err)
			}
			return pub, nil
		}
	}
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	switch block.Type {
	case pemPrivate:
		priv, err := ReadPrivateKeyFile(path)
		if err != nil {
			return nil, err
		}
		return priv.Public().(ed25519.PublicKey), nil
	case pemPublic:
		k, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, keyFileDiag(path, "is not a PKIX public key: %v", err)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, keyFileDiag(path, "holds a %T, not an Ed25519 key", k)
		}
		return pub, nil
	}
	return nil, keyFileDiag(path, "holds a %q PEM block, not a public or private key", block.Type)
}

// ParsePublicKey parses a public key given inline, in the form
// PublicKeyString prints ("ed25519:<base64>") or as 64 hex digits.
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	var b []byte
	var err error
	if rest, ok := strings.CutPrefix(s, "ed25519:"); ok {
		b, err = base64.StdEncoding.DecodeString(rest)
	} else {
		b, err = hex.DecodeString(s)
	}
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("dp: %q is not an Ed25519 public key (want ed25519:<base64> or 64 hex digits)", s)
	}
	return ed25519.PublicKey(b), nil
}

// PublicKeyString renders pub as "ed25519:<base64>".
func PublicKeyString(pub ed25519.PublicKey) string {
	return "ed25519:" + base64.StdEncoding.EncodeToString(pub)
}

func readPEM(path string) (*pem.Block, error) {
	data, err := safefile.ReadFile(path, safefile.MaxKey)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, keyFileDiag(path, "does not exist")
		}
		return nil, keyFileDiag(path, "cannot be read: %v", err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, keyFileDiag(path, "is not a PEM file")
	}
	return block, nil
}

func keyFileDiag(path, format string, args ...any) error {
	return diag.New(diag.LedgerKeyFile, path, "key file "+format, args...).
		WithHelp("give a PEM Ed25519 key: the .key file `scellis ledger init` wrote, or its .pub for verification")
}

// writeNewFile writes data to a new file at path (failing if it exists) and
// syncs the file and its directory.
func writeNewFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return syncDir(path)
}
