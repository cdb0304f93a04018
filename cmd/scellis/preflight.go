package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/scellis/scellis/catalog"
	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/silo"
)

// The start-up checks of the appliances, shared by `config check` and the
// aggregator, worker and silo commands, so that a config check passes
// exactly when start-up would get past its own inputs: the identity key
// loads (present, permissions, passphrase), the federation file loads, the
// named member exists with the appliance's role and the key is that
// member's, and the data folder can be written. Every problem is collected
// before any is reported.

// applianceMember is what an appliance config says about who it is.
type applianceMember struct {
	file, name, key, passphrase, federation string
	pos                                     config.Positions
	roles                                   []identity.Role // the first is the appliance's own
	// online: the appliance is starting, so it first follows the
	// membership changes made since the file (a member added through the
	// log is in them); a config check stays offline.
	online bool
}

// loadIdentity loads a key file, with the passphrase on the first line of
// passphraseFile if it is set.
func loadIdentity(path, passphraseFile string) (*identity.Identity, error) {
	opts := identity.LoadOptions{}
	if passphraseFile != "" {
		p, err := identity.ReadPassphraseFile(passphraseFile)
		if err != nil {
			return nil, err
		}
		opts.Passphrase = p
	}
	id, _, err := identity.Load(path, opts)
	return id, err
}

// checkMember loads and checks the appliance's identity and federation. It
// renders warnings (a group-readable key) to stderr.
func checkMember(m applianceMember, stderr io.Writer) (*identity.Identity, *identity.Federation, diag.List) {
	var ds diag.List
	at := func(err error, key string) {
		for _, d := range asList(err) {
			if d.Pos == nil {
				m.pos.At(d, m.file, key)
			}
			ds = append(ds, d)
		}
	}
	opts := identity.LoadOptions{}
	var id *identity.Identity
	passOK := true
	if m.passphrase != "" {
		p, err := identity.ReadPassphraseFile(m.passphrase)
		if err != nil {
			at(err, "passphrase_file")
			passOK = false
		}
		opts.Passphrase = p
	}
	if passOK {
		loaded, warnings, err := identity.Load(m.key, opts)
		if len(warnings) > 0 && stderr != nil {
			diag.Render(stderr, warnings)
		}
		if err != nil {
			at(err, "identity")
		}
		id = loaded
	}
	fed, err := identity.LoadFederation(m.federation)
	if err != nil {
		at(err, "federation")
	}
	if id == nil || fed == nil {
		return nil, nil, ds
	}
	if m.online && len(ds) == 0 {
		if err := followLog(id, fed, m.name, m.roles[0]); err != nil {
			return nil, nil, asList(err)
		}
	}
	entry, named := fed.Member(m.name)
	owner, known := fed.Lookup(id.Public())
	switch {
	case !named:
		ds = append(ds, m.pos.At(diag.New(diag.NotAMember, "name", "%q is not a member of %s", m.name, fed.File), m.file, "name").
			WithHelp("name this node as the federation file does, or add it (scellis federation add, or its entry in the file; scellis keygen prints it)"))
	case !slices.Contains(m.roles, entry.Role):
		ds = append(ds, m.pos.At(diag.New(diag.WorkerConfig, "name", "member %q is a%s %s in %s, not a%s %s", m.name, article(string(entry.Role)), entry.Role, fed.File, article(string(m.roles[0])), m.roles[0]), m.file, "name").
			WithHelp("start a %s with the name and key of a member listed with role: %s", m.roles[0], m.roles[0]))
	case !known:
		ds = append(ds, m.pos.At(diag.New(diag.WorkerConfig, "identity", "the identity key %s is not member %q's key, nor any member's", id.Public(), m.name), m.file, "identity").
			WithHelp("point identity at %s's key file, or list this key for the member in the federation file", m.name))
	case owner.Name != m.name:
		ds = append(ds, m.pos.At(diag.New(diag.WorkerConfig, "identity", "the identity key is member %q's (a%s %s), not %q's", owner.Name, article(string(owner.Role)), owner.Role, m.name), m.file, "identity").
			WithHelp("each node runs with its own key: point identity at %s's key file", m.name))
	}
	if len(ds) > 0 {
		return nil, nil, ds
	}
	return id, fed, nil
}

func article(word string) string {
	if word != "" && (word[0] == 'a' || word[0] == 'e' || word[0] == 'i' || word[0] == 'o' || word[0] == 'u') {
		return "n"
	}
	return ""
}

func asList(err error) diag.List {
	if ds, ok := diag.As(err); ok {
		return ds
	}
	return diag.List{diag.New(diag.FileUnreadable, "", "%v", err)}
}

// checkWritableDir reports whether dir (config key key) can hold the
// appliance's data: it is a writable folder, or does not exist yet and its
// nearest existing parent is a writable folder. Nothing is created.
func checkWritableDir(file string, pos config.Positions, key, dir string) *diag.Diagnostic {
	bad := func(format string, args ...any) *diag.Diagnostic {
		return pos.At(diag.New(diag.WorkerConfig, key, format, args...), file, key).
			WithHelp("give %s a folder this user may write (it is created when missing)", key)
	}
	p := dir
	for {
		st, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			parent := filepath.Dir(p)
			if parent == p {
				return bad("%s %s cannot be created", key, dir)
			}
			p = parent
			continue
		}
		if err != nil {
			return bad("%s %s cannot be used: %v", key, dir, configPathErr(err))
		}
		if !st.IsDir() {
			return bad("%s %s: %s is not a folder", key, dir, p)
		}
		break
	}
	f, err := os.CreateTemp(p, ".scellis-check-*")
	if err != nil {
		if p == dir {
			return bad("%s %s is not writable: %v", key, dir, configPathErr(err))
		}
		return bad("%s %s cannot be created: %s is not writable", key, dir, p)
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// checkAggregator is the aggregator's start-up check.
func checkAggregator(c *config.Aggregator, stderr io.Writer, online bool) (*identity.Identity, *identity.Federation, error) {
	id, fed, ds := checkMember(applianceMember{file: c.File, name: c.Name, key: c.Identity, passphrase: c.PassphraseFile,
		federation: c.Federation, pos: c.Pos, roles: []identity.Role{identity.Aggregator}, online: online}, stderr)
	if fed != nil {
		if m, _ := fed.Member(c.Name); m.RaftAddress == "" {
			ds = append(ds, c.Pos.At(diag.New(diag.WorkerConfig, "name", "aggregator %s has no raft_address in %s", c.Name, fed.File), c.File, "name").
				WithHelp("give the member a raft_address: host:port in the federation file"))
		}
	}
	if d := checkWritableDir(c.File, c.Pos, "data_dir", c.DataDir); d != nil {
		ds = append(ds, d)
	}
	return id, fed, ds.Err()
}

// checkWorker is the worker's start-up check.
func checkWorker(c *config.Worker, stderr io.Writer, online bool) (*identity.Identity, *identity.Federation, error) {
	id, fed, ds := checkMember(applianceMember{file: c.File, name: c.Name, key: c.Identity, passphrase: c.PassphraseFile,
		federation: c.Federation, pos: c.Pos, roles: []identity.Role{identity.Worker, identity.Silo}, online: online}, stderr)
	if d := checkWritableDir(c.File, c.Pos, "cache_dir", c.CacheDir); d != nil {
		ds = append(ds, d)
	}
	return id, fed, ds.Err()
}

// checkSilo is the silo's start-up check of what silo.Open does not check
// itself before it touches anything: identity, membership, data_dir and its
// policy's strategies (datasets are parsed in full by config.LoadSilo).
func checkSilo(c *config.Silo, stderr io.Writer, online bool) (*identity.Identity, *identity.Federation, error) {
	// parent_federation (a silo led by a child cluster) must list the
	// silo under a child (SC7610); checked first, so that a refused
	// config does not go online.
	var pds diag.List
	if c.ParentFederation != "" {
		parent, err := identity.LoadFederation(c.ParentFederation)
		if err == nil {
			if _, d := silo.ParentListing(parent, c.Name); d != nil {
				err = c.Pos.At(d, c.File, "parent_federation")
			}
		}
		if err != nil {
			for _, d := range asList(err) {
				if d.Pos == nil {
					c.Pos.At(d, c.File, "parent_federation")
				}
				pds = append(pds, d)
			}
		}
	}
	id, fed, ds := checkMember(applianceMember{file: c.File, name: c.Name, key: c.Identity, passphrase: c.PassphraseFile,
		federation: c.Federation, pos: c.Pos, roles: []identity.Role{identity.Silo}, online: online && len(pds) == 0}, stderr)
	ds = append(ds, pds...)
	if id != nil && len(pds) == 0 && c.ParentFederation != "" {
		if _, err := silo.OpenParent(c, id); err != nil { // the parent's entry carries this silo's key
			ds = append(ds, asList(err)...)
		}
	}
	if d := checkWritableDir(c.File, c.Pos, "data_dir", c.DataDir); d != nil {
		ds = append(ds, d)
	}
	cat, err := catalog.Builtin()
	if err != nil {
		return nil, nil, fmt.Errorf("built-in catalog: %w", err)
	}
	if _, err := silo.NewPolicy(c, &silo.MemoryRoundLog{}).Pin(cat); err != nil {
		for _, d := range asList(err) {
			if d.Pos == nil {
				c.Pos.At(d, c.File, "policy")
			}
			ds = append(ds, d)
		}
	}
	return id, fed, ds.Err()
}
