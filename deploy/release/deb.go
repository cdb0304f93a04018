package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
)

// roles are the long-running processes, each a templated systemd unit.
var roles = []string{"aggregator", "silo", "worker"}

// debDescription is the package's description: a synopsis line, then the
// long text (each line indented one space, as deb's control file wants).
const debDescription = `federated compute for hospitals: aggregators, silos, workers
 Scellis runs federated learning and pooled jobs across hospitals' data
 without moving it: a silo next to each hospital's data keeps its privacy
 ledger and policy, a replicated aggregator cluster coordinates them.
 .
 This package holds the scellis binary, templated systemd units (one
 instance per member: scellis-aggregator@NAME, scellis-silo@NAME,
 scellis-worker@NAME reading /etc/scellis/NAME), the scellis system user,
 config examples in /usr/share/doc/scellis/examples, and
 /usr/share/scellis/silo-trainers.conf, the drop-in a silo that runs
 trainers needs.`

// debContents is what the package installs: sources under the checkout,
// destinations on the target machine.
func debContents(root, bin string) files.Contents {
	file := func(src, dst string, mode os.FileMode) *files.Content {
		return &files.Content{Source: src, Destination: dst, FileInfo: &files.ContentFileInfo{Mode: mode}}
	}
	deploy := filepath.Join(root, "deploy")
	c := files.Contents{
		file(bin, "/usr/bin/scellis", 0o755),
		file(filepath.Join(deploy, "systemd", "scellis.sysusers.conf"), "/usr/lib/sysusers.d/scellis.conf", 0o644),
		file(filepath.Join(deploy, "systemd", "scellis.tmpfiles.conf"), "/usr/lib/tmpfiles.d/scellis.conf", 0o644),
		file(filepath.Join(deploy, "README.md"), "/usr/share/doc/scellis/README.md", 0o644),
		// Inactive: the drop-in an operator installs to let a silo run
		// trainers (not under /usr/share/doc, which a minimal install may
		// leave out).
		file(filepath.Join(deploy, "systemd", "scellis-silo-trainers.conf"), "/usr/share/scellis/silo-trainers.conf", 0o644),
	}
	for _, r := range roles {
		unit := "scellis-" + r + "@.service"
		c = append(c,
			file(filepath.Join(deploy, "systemd", unit), "/usr/lib/systemd/system/"+unit, 0o644),
			file(filepath.Join(deploy, "examples", r+".yaml"), "/usr/share/doc/scellis/examples/"+r+".yaml", 0o644))
	}
	return c
}

// writeDeb packages the binary for arch as
// OUT/scellis_VERSION-1_ARCH.deb.
func writeDeb(o options, arch, bin string) (string, error) {
	scripts := filepath.Join(o.root, "deploy", "debian")
	info := &nfpm.Info{
		Name:          "scellis",
		Arch:          arch,
		Platform:      "linux",
		Version:       debianVersion(o.version),
		VersionSchema: "none", // debianVersion already maps pre-releases
		Release:       "1",
		Section:       "net",
		Priority:      "optional",
		Maintainer:    o.maintainer,
		Description:   debDescription,
		Homepage:      "https://github.com/scellis/scellis",
		MTime:         o.stamp.time,
		Overridables: nfpm.Overridables{
			// systemd-sysusers and systemd-tmpfiles make the user and
			// folders; the units are the way to run it.
			Depends:  []string{"systemd"},
			Contents: debContents(o.root, bin),
			Umask:    0o022,
			Scripts: nfpm.Scripts{
				PostInstall: filepath.Join(scripts, "postinst"),
				PreRemove:   filepath.Join(scripts, "prerm"),
				PostRemove:  filepath.Join(scripts, "postrm"),
			},
		},
	}
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return "", fmt.Errorf("deb for %s: %w", arch, err)
	}
	p := filepath.Join(o.out, fmt.Sprintf("scellis_%s-1_%s.deb", fileVersion(o.version), arch))
	f, err := os.Create(p)
	if err != nil {
		return "", err
	}
	if err := deb.Default.Package(info, f); err != nil {
		f.Close()
		return "", fmt.Errorf("deb for %s: %w", arch, err)
	}
	return p, f.Close()
}
