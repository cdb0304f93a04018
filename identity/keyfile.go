package identity

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"filippo.io/age"
	"filippo.io/age/armor"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/safefile"
)

// Key file format.
//
// A plaintext key file is the private key as PKCS#8 PEM (type "PRIVATE
// KEY"), the form `openssl pkey` reads. An encrypted key file is that same
// PEM encrypted with age and ASCII-armored ("-----BEGIN AGE ENCRYPTED
// FILE-----"), either under a passphrase (age scrypt) or to one age
// recipient ("age1…"); Load also accepts unarmored age files.
const (
	pemType      = "PRIVATE KEY"
	ageMagic     = "age-encryption.org/"
	maxKeyFile   = 64 << 10
	maxAgeIDFile = 1 << 20
)

// scryptWorkFactor is age's default (about one second); tests lower it.
var scryptWorkFactor = 18

// SaveOptions says how Save protects a key file. Give at most one of
// Passphrase and Recipient; neither writes plaintext PKCS#8 PEM.
type SaveOptions struct {
	// Passphrase encrypts the file with age under a passphrase (scrypt).
	Passphrase string
	// Recipient encrypts the file with age to a recipient such as
	// "age1…" (X25519) or "age1pq1…" (post-quantum hybrid).
	Recipient string
}

// LoadOptions gives Load what it needs to decrypt an encrypted key file.
// Both may be given; each is tried. A plaintext file ignores them.
type LoadOptions struct {
	// Passphrase decrypts a file encrypted under a passphrase.
	Passphrase string
	// AgeIdentityFile is a file of age identities ("AGE-SECRET-KEY-1…"),
	// one per line, that decrypts a file encrypted to a recipient.
	AgeIdentityFile string
}

// Save writes id's private key to path with mode 0600. It never overwrites:
// an existing file is an SC1111 diagnostic, and bad options are SC1112.
// The file is fsync'd before Save returns.
func Save(path string, id *Identity, opts SaveOptions) error {
	var rcpt age.Recipient
	switch {
	case opts.Passphrase != "" && opts.Recipient != "":
		return diag.New(diag.KeyEncryption, path, "both a passphrase and a recipient were given").
			WithHelp("encrypt the key under a passphrase or to an age recipient, not both")
	case opts.Passphrase != "":
		r, err := age.NewScryptRecipient(opts.Passphrase)
		if err != nil {
			return diag.New(diag.KeyEncryption, path, "unusable passphrase: %v", err)
		}
		r.SetWorkFactor(scryptWorkFactor)
		rcpt = r
	case opts.Recipient != "":
		rs, err := age.ParseRecipients(strings.NewReader(opts.Recipient))
		if err != nil || len(rs) != 1 {
			return diag.New(diag.KeyEncryption, path, "%q is not an age recipient", opts.Recipient).
				WithHelp("give one recipient such as age1… (from age-keygen -y)")
		}
		rcpt = rs[0]
	}

	der, err := x509.MarshalPKCS8PrivateKey(id.PrivateKey())
	if err != nil {
		return fmt.Errorf("identity: encoding the key: %w", err)
	}
	plain := pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: der})
	clear(der)
	defer clear(plain)
	data := plain
	if rcpt != nil {
		var buf bytes.Buffer
		aw := armor.NewWriter(&buf)
		w, err := age.Encrypt(aw, rcpt)
		if err != nil {
			return fmt.Errorf("identity: encrypting the key: %v", err)
		}
		if _, err := w.Write(plain); err != nil {
			return fmt.Errorf("identity: encrypting the key: %v", err)
		}
		if err := w.Close(); err != nil {
			return fmt.Errorf("identity: encrypting the key: %v", err)
		}
		if err := aw.Close(); err != nil {
			return fmt.Errorf("identity: encrypting the key: %v", err)
		}
		data = buf.Bytes()
	}
	return writeNew(path, data)
}

// writeNew creates path (mode 0600, never replacing a file), writes data,
// and syncs the file and its folder. A failed write leaves no file.
func writeNew(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return diag.New(diag.KeyFileExists, path, "a key file already exists here").
			WithHelp("keep it, or move it away first: a replaced key changes the member's identity")
	}
	if err != nil {
		return fmt.Errorf("identity: writing key file: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("identity: writing key file: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync() // best effort: the new entry is durable once the folder is
		d.Close()
	}
	return nil
}

// Load reads a key file written by Save. Refusals are diagnostics: SC1104
// when the file cannot be read, is not an Ed25519 PKCS#8 key, or cannot be
// decrypted with opts; SC1105 when a plaintext key is accessible to others
// (mode bits o+rwx). Warnings (SC1105: a plaintext key accessible to its
// group, an encrypted key accessible to anyone else) come back in warnings
// and do not stop the load; show them to the operator.
//
// Errors never include key material or the passphrase.
func Load(path string, opts LoadOptions) (id *Identity, warnings diag.List, err error) {
	unreadable := func(format string, args ...any) *diag.Diagnostic {
		return diag.New(diag.KeyFileUnreadable, path, format, args...)
	}
	// safefile.Open refuses a FIFO or device without blocking on it; the
	// size is checked below with the key-specific message.
	f, _, err := safefile.Open(path, os.O_RDONLY, math.MaxInt64)
	if err != nil {
		return nil, nil, unreadable("cannot open the key file: %s", pathErr(err)).
			WithHelp("check the path; create a key with 'scellis keygen --out DIR'")
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, unreadable("cannot stat the key file: %s", pathErr(err))
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, unreadable("the key file is not a regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, nil, unreadable("cannot read the key file: %s", pathErr(err))
	}
	defer clear(data)
	if len(data) > maxKeyFile {
		return nil, nil, unreadable("the file is larger than any key file (%d bytes limit)", maxKeyFile)
	}

	trimmed := bytes.TrimLeft(data, " \t\r\n")
	armored := bytes.HasPrefix(trimmed, []byte(armor.Header))
	encrypted := armored || bytes.HasPrefix(data, []byte(ageMagic))

	if d := permissionDiag(path, fi.Mode().Perm(), encrypted); d != nil {
		if d.Severity == diag.Error {
			return nil, nil, d
		}
		warnings = append(warnings, d)
	}

	plain := data
	if encrypted {
		plain, err = decrypt(path, data, armored, opts)
		if err != nil {
			return nil, warnings, err
		}
		defer clear(plain)
	}

	block, _ := pem.Decode(plain)
	if block == nil || block.Type != pemType {
		return nil, warnings, unreadable("the file is not a Scellis identity key (want PKCS#8 PEM %q or an age-encrypted one)", pemType).
			WithHelp("give the identity.key written by 'scellis keygen'")
	}
	defer clear(block.Bytes)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, warnings, unreadable("the PKCS#8 key cannot be parsed").
			WithHelp("give the identity.key written by 'scellis keygen'")
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, warnings, unreadable("the key is %T, not an Ed25519 key", key).
			WithHelp("Scellis identities are Ed25519 keys made by 'scellis keygen'")
	}
	return fromPrivate(priv), warnings, nil
}

func decrypt(path string, data []byte, armored bool, opts LoadOptions) ([]byte, error) {
	var ids []age.Identity
	if opts.Passphrase != "" {
		si, err := age.NewScryptIdentity(opts.Passphrase)
		if err != nil {
			return nil, diag.New(diag.KeyEncryption, path, "unusable passphrase: %v", err)
		}
		ids = append(ids, si)
	}
	if opts.AgeIdentityFile != "" {
		fids, err := readAgeIdentities(opts.AgeIdentityFile)
		if err != nil {
			return nil, err
		}
		ids = append(ids, fids...)
	}
	if len(ids) == 0 {
		return nil, diag.New(diag.KeyFileUnreadable, path, "the key file is encrypted, and no passphrase or age identity was given").
			WithHelp("give the passphrase file or the age identity file the key was encrypted for")
	}
	var src io.Reader = bytes.NewReader(data)
	if armored {
		src = armor.NewReader(bytes.NewReader(bytes.TrimLeft(data, " \t\r\n")))
	}
	r, err := age.Decrypt(src, ids...)
	if err != nil {
		var nomatch *age.NoIdentityMatchError
		if errors.As(err, &nomatch) {
			return nil, diag.New(diag.KeyFileUnreadable, path, "cannot decrypt the key file: wrong passphrase or age identity").
				WithHelp("give the passphrase or age identity the key was encrypted with")
		}
		return nil, diag.New(diag.KeyFileUnreadable, path, "cannot decrypt the key file: %v", err)
	}
	plain, err := io.ReadAll(io.LimitReader(r, maxKeyFile+1))
	if err != nil {
		return nil, diag.New(diag.KeyFileUnreadable, path, "cannot decrypt the key file: %v", err)
	}
	if len(plain) > maxKeyFile {
		clear(plain)
		return nil, diag.New(diag.KeyFileUnreadable, path, "the decrypted file is larger than any key file")
	}
	return plain, nil
}

func readAgeIdentities(path string) ([]age.Identity, error) {
	bad := func(format string, args ...any) error {
		return diag.New(diag.KeyEncryption, path, format, args...).
			WithHelp("give a file of age identities (AGE-SECRET-KEY-1…), as written by age-keygen")
	}
	f, _, err := safefile.Open(path, os.O_RDONLY, maxAgeIDFile)
	if err != nil {
		return nil, bad("cannot open the age identity file: %s", pathErr(err))
	}
	defer f.Close()
	ids, err := age.ParseIdentities(io.LimitReader(f, maxAgeIDFile))
	if err != nil {
		// age's parse errors never quote key material.
		return nil, bad("cannot read the age identity file: %v", err)
	}
	return ids, nil
}

// permissionDiag decides what a key file's mode means: nil when only the
// owner has access; an error for a plaintext key others can reach; a
// warning for a plaintext key the group can reach, or an encrypted key
// anyone but the owner can reach.
func permissionDiag(path string, perm fs.FileMode, encrypted bool) *diag.Diagnostic {
	if runtime.GOOS == "windows" || perm&0o077 == 0 {
		return nil
	}
	help := fmt.Sprintf("run: chmod 600 %s", path)
	if !encrypted && perm&0o007 != 0 {
		return diag.New(diag.KeyFileInsecure, path, "the private key is accessible to every user on this machine (mode %04o); refusing to use it", perm).
			WithHelp("%s, and consider the key exposed if others may have read it", help)
	}
	who := "its group"
	if perm&0o007 != 0 {
		who = "every user on this machine"
	}
	d := diag.New(diag.KeyFileInsecure, path, "the key file is accessible to %s (mode %04o)", who, perm).WithHelp("%s", help)
	d.Severity = diag.Warning
	return d
}

// ReadPassphraseFile reads a passphrase from a file, dropping one trailing
// newline ("\n" or "\r\n"). An unreadable or empty file is SC1112.
func ReadPassphraseFile(path string) (string, error) {
	f, _, err := safefile.Open(path, os.O_RDONLY, math.MaxInt64)
	if err != nil {
		return "", diag.New(diag.KeyEncryption, path, "cannot open the passphrase file: %s", pathErr(err))
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4<<10+1))
	if err != nil {
		return "", diag.New(diag.KeyEncryption, path, "cannot read the passphrase file: %s", pathErr(err))
	}
	defer clear(b)
	if len(b) > 4<<10 {
		return "", diag.New(diag.KeyEncryption, path, "the passphrase file is larger than 4 KiB").
			WithHelp("put only the passphrase in the file")
	}
	s := string(b)
	if t, ok := strings.CutSuffix(s, "\n"); ok {
		s = strings.TrimSuffix(t, "\r")
	}
	if s == "" {
		return "", diag.New(diag.KeyEncryption, path, "the passphrase file is empty").
			WithHelp("write the passphrase on the file's first line")
	}
	return s, nil
}

// pathErr drops the path from an *fs.PathError (the subject names it).
func pathErr(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
