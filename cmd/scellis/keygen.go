package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

func init() { commands = append(commands, newKeygenCmd) }

// Files keygen writes in its --out folder.
const (
	keyFileName    = "identity.key"
	pubKeyFileName = "identity.pub"
)

type keygenOptions struct {
	out            string
	name           string
	role           string
	address        string
	raftAddress    string
	passphraseFile string
	recipient      string
	publicOf       string
	ageIdentity    string
}

func newKeygenCmd() *cobra.Command {
	var o keygenOptions
	cmd := &cobra.Command{
		Use:   "keygen --out DIR",
		Short: "Make this node's Ed25519 identity key",
		Long: `Make a new Ed25519 identity: DIR/identity.key holds the private key (mode
0600, PKCS#8 PEM, or age-encrypted with --passphrase-file or --recipient) and
DIR/identity.pub the public key. It prints the member entry to add under
"members:" in the federation file; joining a federation is adding that entry.

keygen never overwrites a key: a replaced key is a new identity.

With --public-of FILE it makes nothing: it loads an existing key file
(decrypting it with --passphrase-file or --age-identity) and prints its
public key, which also checks the passphrase and the file's permissions.`,
		Example: "  scellis keygen --out /etc/scellis --name hospital-a --role silo\n" +
			"  scellis keygen --out keys/agg-1 --name agg-1 --role aggregator --address agg-1.example.org:7400 --passphrase-file pass.txt\n" +
			"  scellis keygen --public-of keys/agg-1/identity.key --passphrase-file pass.txt",
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.publicOf != "" {
				return runPublicOf(o, cmd.OutOrStdout())
			}
			return runKeygen(o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.out, "out", "", "folder to write identity.key and identity.pub to (created if missing)")
	f.StringVar(&o.name, "name", "", "member name for the printed entry (default: this host's name)")
	f.StringVar(&o.role, "role", string(identity.Silo), "member role for the printed entry: aggregator, silo, worker, cluster (machines), researcher or operator (people)")
	f.StringVar(&o.address, "address", "", "host:port this member serves on, for the printed entry (required for an aggregator)")
	f.StringVar(&o.raftAddress, "raft-address", "", "host:port of an aggregator's Raft replication, for the printed entry (required for an aggregator)")
	f.StringVar(&o.passphraseFile, "passphrase-file", "", "encrypt the key with age under the passphrase on this file's first line")
	f.StringVar(&o.recipient, "recipient", "", "encrypt the key with age to this recipient (age1…)")
	f.StringVar(&o.publicOf, "public-of", "", "print the public key of this existing key file instead of making one")
	f.StringVar(&o.ageIdentity, "age-identity", "", "with --public-of: file of age identities (AGE-SECRET-KEY-1…) that decrypts the key")
	return cmd
}

// keygenResult is what --json prints.
type keygenResult struct {
	Name          string `json:"name"`
	Role          string `json:"role"`
	PublicKey     string `json:"public_key"`
	Address       string `json:"address,omitempty"`
	RaftAddress   string `json:"raft_address,omitempty"`
	KeyFile       string `json:"key_file"`
	PublicKeyFile string `json:"public_key_file"`
	Encryption    string `json:"encryption"`
}

func runKeygen(o keygenOptions, stdout, stderr io.Writer) error {
	if o.out == "" {
		return usageError{errors.New("keygen needs --out DIR, the folder for the key files")}
	}
	if o.ageIdentity != "" {
		return usageError{errors.New("--age-identity only goes with --public-of; to encrypt to an age key, give --recipient")}
	}
	if o.passphraseFile != "" && o.recipient != "" {
		return usageError{errors.New("give --passphrase-file or --recipient, not both")}
	}
	var refused diag.List
	name := o.name
	if name == "" {
		name = defaultMemberName()
	}
	if err := identity.CheckName(name); err != nil {
		refused = append(refused, subjectOf(err, "--name"))
	}
	role, err := identity.ParseRole(o.role)
	if err != nil {
		refused = append(refused, subjectOf(err, "--role"))
	}
	if o.address != "" {
		if err := identity.CheckAddress(o.address); err != nil {
			refused = append(refused, subjectOf(err, "--address"))
		}
		if role.Person() {
			refused = append(refused, diag.New(diag.MemberAddress, "--address", "a person (%s) serves nothing and has no address", role).
				WithHelp("drop --address; researchers and operators only call the aggregators"))
		}
	} else if role == identity.Aggregator {
		refused = append(refused, diag.New(diag.MemberAddress, "--address", "an aggregator needs an address").
			WithHelp("give --address host:port, where this aggregator will serve"))
	}
	switch {
	case o.raftAddress != "" && role != identity.Aggregator:
		refused = append(refused, diag.New(diag.MemberAddress, "--raft-address", "a %s has no Raft address", role).
			WithHelp("drop --raft-address: only aggregators take part in Raft"))
	case o.raftAddress != "":
		if err := identity.CheckAddress(o.raftAddress); err != nil {
			refused = append(refused, subjectOf(err, "--raft-address"))
		} else if o.raftAddress == o.address {
			refused = append(refused, diag.New(diag.MemberAddress, "--raft-address", "the Raft address %s is the API address too", o.raftAddress).
				WithHelp("give Raft its own port, such as the API port + 1"))
		}
	case role == identity.Aggregator:
		refused = append(refused, diag.New(diag.MemberAddress, "--raft-address", "an aggregator needs a Raft address").
			WithHelp("give --raft-address host:port, where this aggregator replicates with the others (its own port, such as the API port + 1); an aggregator started without one is refused"))
	}
	opts := identity.SaveOptions{Recipient: o.recipient}
	encryption := "none"
	switch {
	case o.passphraseFile != "":
		encryption = "passphrase"
		opts.Passphrase, err = identity.ReadPassphraseFile(o.passphraseFile)
		if err != nil {
			refused = append(refused, subjectOf(err, ""))
		}
	case o.recipient != "":
		encryption = "recipient"
	}
	keyPath := filepath.Join(o.out, keyFileName)
	pubPath := filepath.Join(o.out, pubKeyFileName)
	for _, p := range []string{keyPath, pubPath} {
		if _, err := os.Lstat(p); err == nil {
			refused = append(refused, diag.New(diag.KeyFileExists, p, "a key file already exists here").
				WithHelp("keep the existing identity, or choose another --out folder"))
		}
	}
	if len(refused) > 0 {
		return refused
	}

	if err := os.MkdirAll(o.out, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", o.out, err)
	}
	id, err := identity.Generate()
	if err != nil {
		return err
	}
	if err := identity.Save(keyPath, id, opts); err != nil {
		return err
	}
	pub := id.Public().String()
	if err := writeNewFile(pubPath, []byte(pub+"\n"), 0o644); err != nil {
		os.Remove(keyPath) // no half-made identity
		return err
	}

	res := keygenResult{Name: name, Role: string(role), PublicKey: pub, Address: o.address, RaftAddress: o.raftAddress,
		KeyFile: keyPath, PublicKeyFile: pubPath, Encryption: encryption}
	if jsonOutput {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	how := ""
	switch encryption {
	case "passphrase":
		how = ", encrypted under the passphrase"
	case "recipient":
		how = ", encrypted to " + o.recipient
	}
	fmt.Fprintf(stderr, "scellis: wrote %s (private, mode 0600%s) and %s\n", keyPath, how, pubPath)
	fmt.Fprintf(stdout, "# add this entry under \"members:\" in the federation file\n")
	// Indented as the federation file's members are, so it pastes as is.
	fmt.Fprintf(stdout, "  - name: %s\n    role: %s\n    public_key: %s\n", name, role, pub)
	if o.address != "" {
		fmt.Fprintf(stdout, "    address: %s\n", yamlString(o.address))
	}
	if o.raftAddress != "" {
		fmt.Fprintf(stdout, "    raft_address: %s\n", yamlString(o.raftAddress))
	}
	return nil
}

// runPublicOf loads an existing key file and prints its public key.
// Warnings about the file (its permissions) go to stderr; exit code 0.
func runPublicOf(o keygenOptions, stdout io.Writer) error {
	if o.out != "" || o.recipient != "" {
		return usageError{errors.New("--public-of reads a key; it does not go with --out or --recipient")}
	}
	opts := identity.LoadOptions{AgeIdentityFile: o.ageIdentity}
	if o.passphraseFile != "" {
		pass, err := identity.ReadPassphraseFile(o.passphraseFile)
		if err != nil {
			return err
		}
		opts.Passphrase = pass
	}
	id, warnings, err := identity.Load(o.publicOf, opts)
	if err != nil {
		return err
	}
	pub := id.Public().String()
	if jsonOutput {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			PublicKey string `json:"public_key"`
		}{pub}); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(stdout, pub)
	}
	if len(warnings) > 0 {
		return warnings // rendered on stderr; warnings alone exit 0
	}
	return nil
}

// subjectOf returns err's diagnostic with its subject set to subject (the
// flag it came from) when subject is not empty.
func subjectOf(err error, subject string) *diag.Diagnostic {
	var d *diag.Diagnostic
	if !errors.As(err, &d) {
		d = diag.New(diag.InvalidValue, subject, "%v", err)
	}
	if subject != "" {
		d.Subject = subject
	}
	return d
}

// defaultMemberName turns this host's name into a valid member name, or
// "member" when nothing usable is left.
func defaultMemberName() string {
	h, _ := os.Hostname()
	h, _, _ = strings.Cut(strings.ToLower(h), ".")
	var b strings.Builder
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	name := strings.TrimLeft(b.String(), "-_")
	if len(name) > 63 {
		name = name[:63]
	}
	if identity.CheckName(name) != nil {
		return "member"
	}
	return name
}

// yamlString quotes s when YAML would not read it back as the same plain
// string ("[::1]:7400" starts a flow sequence).
func yamlString(s string) string {
	if strings.ContainsAny(s[:1], "[]{}&*!|>'\"%@`#,?:-") || strings.Contains(s, ": ") || strings.Contains(s, " #") {
		b, _ := json.Marshal(s)
		return string(b)
	}
	return s
}

// writeNewFile creates path with perm, refusing to replace a file.
func writeNewFile(path string, data []byte, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if errors.Is(err, fs.ErrExist) {
		return diag.New(diag.KeyFileExists, path, "a key file already exists here").
			WithHelp("keep the existing identity, or choose another --out folder")
	}
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}
