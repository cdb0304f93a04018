package main

import (
	"context"
	"strings"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// minPrefix is the shortest ID prefix accepted: the CLI prints 12 hex
// digits, and fewer than 6 would match too often to be worth typing.
const minPrefix = 6

// idKind is what an ID argument names: a job or a training run.
type idKind string

const (
	jobID idKind = "job"
	runID idKind = "run"
)

// resolveID turns a command-line ID into a full ref: a full
// sha256:<64 hex> ref as it is, or a prefix of one (with or without
// "sha256:", at least minPrefix hex digits — the 12 the CLI prints will
// do) looked up among the pool's jobs or runs. An unknown or ambiguous
// prefix is a diagnostic.
func resolveID(ctx context.Context, c *api.Client, s string, kind idKind) (content.Ref, error) {
	if id, err := content.ParseRef(s); err == nil {
		return id, nil
	}
	prefix := strings.TrimPrefix(s, "sha256:")
	if !isHexPrefix(prefix) {
		return "", diag.New(diag.InvalidValue, string(kind), "%q is not a %s ID", s, kind).
			WithHelp("give the ID the CLI printed (12 hex digits will do) or the full sha256:<64 hex digits>; scellis %s lists them", lsCommand(kind))
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var refs []content.Ref
	switch kind {
	case runID:
		runs, err := c.Runs(ctx)
		if err != nil {
			return "", err
		}
		for _, r := range runs {
			refs = append(refs, r.ID)
		}
	default:
		jobs, err := c.Jobs(ctx)
		if err != nil {
			return "", err
		}
		for _, j := range jobs {
			refs = append(refs, j.ID)
		}
	}
	var match []content.Ref
	for _, r := range refs {
		if strings.HasPrefix(strings.TrimPrefix(string(r), "sha256:"), prefix) {
			match = append(match, r)
		}
	}
	switch len(match) {
	case 1:
		return match[0], nil
	case 0:
		code := diag.PoolUnknownJob
		if kind == runID {
			code = diag.RunUnknown
		}
		return "", diag.New(code, string(kind), "no %s in this pool has an ID starting with %s", kind, prefix).
			WithHelp("scellis %s lists them", lsCommand(kind))
	default:
		var ids []string
		for _, m := range match {
			ids = append(ids, m.Short())
		}
		return "", diag.New(diag.InvalidValue, string(kind), "%s is the start of %d %s IDs (%s)", prefix, len(match), kind, strings.Join(ids, ", ")).
			WithHelp("give more hex digits of the ID")
	}
}

func isHexPrefix(s string) bool {
	if len(s) < minPrefix || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

func lsCommand(kind idKind) string {
	if kind == runID {
		return "fl ls"
	}
	return "job ls"
}
