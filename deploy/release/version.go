package main

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// buildTime is what the artefacts say about when and from what they were
// made: the one timestamp every file carries, and the commit.
type buildTime struct {
	time   time.Time
	commit string // empty outside a git checkout
}

// versionPattern is what -version accepts: a semantic version with an
// optional v, pre-release and build metadata (v0.2.0, 0.2.0-rc.1,
// 0.0.0-20261201120000-abcdef123456+dirty).
var versionPattern = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

func checkVersion(v string) error {
	if !versionPattern.MatchString(v) {
		return fmt.Errorf("not a semantic version: give one such as v0.2.0 or 0.2.0-rc.1")
	}
	return nil
}

// git runs git in the checkout and returns its trimmed output.
func git(root string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// gitVersion is the checkout's version: its tag (v0.2.0) when HEAD is
// tagged, else a Go pseudo-version of the commit
// (0.0.0-20261201120000-abcdef123456), with +dirty for uncommitted
// changes.
func gitVersion(root string) (string, error) {
	dirty := ""
	if _, err := git(root, "diff", "--quiet", "HEAD"); err != nil {
		dirty = "+dirty"
	}
	if tag, err := git(root, "describe", "--tags", "--exact-match", "--match", "v[0-9]*"); err == nil && checkVersion(tag) == nil {
		return tag + dirty, nil
	}
	out, err := git(root, "log", "-1", "--format=%ct %H")
	if err != nil {
		return "", fmt.Errorf("no -version given and %v", err)
	}
	ct, sha, _ := strings.Cut(out, " ")
	sec, err := strconv.ParseInt(ct, 10, 64)
	if err != nil || len(sha) < 12 {
		return "", fmt.Errorf("git log printed %q", out)
	}
	return fmt.Sprintf("0.0.0-%s-%s%s", time.Unix(sec, 0).UTC().Format("20060102150405"), sha[:12], dirty), nil
}

// sourceDate is SOURCE_DATE_EPOCH (reproducible-builds.org) when set,
// else the commit's time.
func sourceDate(root string) (buildTime, error) {
	var b buildTime
	b.commit, _ = git(root, "rev-parse", "HEAD")
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return b, fmt.Errorf("%w: SOURCE_DATE_EPOCH=%q is not a number of seconds", errUsage, s)
		}
		b.time = time.Unix(sec, 0).UTC()
		return b, nil
	}
	ct, err := git(root, "log", "-1", "--format=%ct")
	if err != nil {
		return b, fmt.Errorf("no SOURCE_DATE_EPOCH and %v", err)
	}
	sec, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		return b, fmt.Errorf("git log printed %q", ct)
	}
	b.time = time.Unix(sec, 0).UTC()
	return b, nil
}

// debianVersion maps a semantic version to a Debian upstream version that
// sorts the same way: the pre-release after ~ (which sorts before the
// release), further hyphens as dots.
func debianVersion(v string) string {
	v = strings.TrimPrefix(v, "v")
	core, pre, ok := strings.Cut(v, "-")
	if !ok {
		return v
	}
	return core + "~" + strings.ReplaceAll(pre, "-", ".")
}

// fileVersion is the version as it appears in file names and image tags,
// which allow [A-Za-z0-9_.-]: no leading v, + as -.
func fileVersion(v string) string {
	return strings.ReplaceAll(strings.TrimPrefix(v, "v"), "+", "-")
}

// goVersion is the toolchain that builds the binaries (part of what makes
// them reproducible).
func goVersion() string {
	out, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		return "go: " + err.Error()
	}
	return strings.TrimSpace(string(out))
}
