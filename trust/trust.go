// Package trust holds the three trust regimes of a pool — own, consortium,
// open — and the admission rules that separate them (SPEC §3). Every job,
// round and charge passes Admit before anything executes; every refusal is a
// diag.Diagnostic with a stable code. The rules are enforced, never advisory.
package trust

import (
	"fmt"

	"github.com/scellis/scellis/diag"
)

// Regime is who is in a pool, which decides what is safe to run there.
type Regime string

const (
	// Own: your own machines. Anything goes; DP is optional.
	Own Regime = "own"
	// Consortium: named, authenticated members. Confidential data stays at
	// its owner; DP and secure aggregation are mandatory for training.
	Consortium Regime = "consortium"
	// Open: anyone who joins. Public inputs only; redundancy verification.
	Open Regime = "open"
)

// Class is the confidentiality class of an input or a piece of content.
type Class string

const (
	Public       Class = "public"
	Confidential Class = "confidential"
)

// ParseRegime checks a regime name.
func ParseRegime(s string) (Regime, error) {
	switch r := Regime(s); r {
	case Own, Consortium, Open:
		return r, nil
	}
	return "", diag.New(diag.UnknownRegime, "regime", "unknown trust regime %q", s).
		WithHelp("use one of: own, consortium, open")
}

// ParseClass checks a class name.
func ParseClass(s string) (Class, error) {
	switch c := Class(s); c {
	case Public, Confidential:
		return c, nil
	}
	return "", diag.New(diag.UnknownInputClass, "class", "unknown class %q", s).
		WithHelp("use public or confidential")
}

// Item is one input or piece of content a job reads, with its class.
type Item struct {
	Name  string
	Class Class
}

// Request is what admission looks at: a job's or round's declared regime,
// its inputs and models, and (for training) its protections.
type Request struct {
	Subject          string // e.g. "job sweep" — used in diagnostics
	Regime           Regime // the regime the job declares; empty means the pool's
	SecurityCritical bool
	Inputs           []Item // datasets and files the shards read
	Models           []Item // models or other content with a class
	Training         bool   // a federated training run or round
	DP               bool   // differential privacy on (training)
	SecureAgg        bool   // secure aggregation on (training)
}

// Admit checks req against the rules of a pool of regime pool and returns
// every violation (empty when admitted).
func Admit(pool Regime, req Request) diag.List {
	var out diag.List
	subject := req.Subject
	if req.Regime != "" && req.Regime != pool {
		out = append(out, diag.New(diag.RegimeMismatch, subject,
			"job declares regime %q but the pool is %q", req.Regime, pool).
			WithHelp("submit it to a %s pool, or change the job's regime", req.Regime))
	}
	switch pool {
	case Open:
		if req.SecurityCritical {
			out = append(out, diag.New(diag.OpenSecurityCritical, subject,
				"job is marked security_critical and the pool is open").
				WithHelp("results from anonymous peers cannot be trusted for security-critical work; use an own or consortium pool"))
		}
		for _, in := range req.Inputs {
			if in.Class != Public {
				out = append(out, diag.New(diag.OpenNonPublicInput, subject,
					"input %q is classed %s; an open pool may only read public inputs", in.Name, classOrUnset(in.Class)).
					WithHelp("class the input public only if it really is; otherwise use a consortium or own pool"))
			}
		}
		for _, m := range req.Models {
			if m.Class == Confidential {
				out = append(out, diag.New(diag.OpenConfidential, subject,
					"%q is confidential and executing peers would hold it", m.Name).
					WithHelp("use a consortium or own pool"))
			}
		}
	case Consortium:
		if req.Training && !req.DP {
			out = append(out, diag.New(diag.ConsortiumNoDP, subject,
				"training in a consortium pool requires differential privacy").
				WithHelp("enable DP (clipping and noise) for the run"))
		}
		if req.Training && !req.SecureAgg {
			out = append(out, diag.New(diag.ConsortiumNoSecAgg, subject,
				"training in a consortium pool requires secure aggregation").
				WithHelp("enable secure aggregation for the run"))
		}
	case Own:
	default:
		out = append(out, diag.New(diag.UnknownRegime, subject, "unknown pool regime %q", pool).
			WithHelp("use one of: own, consortium, open"))
	}
	return out
}

func classOrUnset(c Class) string {
	if c == "" {
		return "unclassified"
	}
	return fmt.Sprint(c)
}
