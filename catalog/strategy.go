package catalog

import (
	"go.starlark.net/syntax"

	"github.com/scellis/scellis/diag"
)

// strategySignatures are the functions the federated engine calls on a
// strategy, with the positional arguments it passes; the first two are
// required (they give the entry its kind), the others optional.
var strategySignatures = []role{
	{"client_step", Strategy, 4, "client_step(global, data, params, state)"},
	{"server_step", Strategy, 4, "server_step(global, sum, total_weight, params)"},
	{"init", Strategy, 2, "init(params, dims)"},
	{"evaluate", Strategy, 3, "evaluate(global, data, params)"},
}

// CheckStrategy checks that e is a strategy whose functions accept the
// arguments the federated engine passes (see docs/content.md, Strategies):
// client_step(global, data, params, state), server_step(global, sum,
// total_weight, params), and if defined init(params, dims) and
// evaluate(global, data, params). An entry of another kind is
// diag.ContentKind; a wrong signature diag.MissingFunction at its def line.
//
// Parse deduces the strategy kind from client_step and server_step alone;
// this stricter check runs when a strategy is loaded to run a round.
func CheckStrategy(e *Entry) error {
	if e.Kind != Strategy {
		return diag.New(diag.ContentKind, e.Subject(), "%s is a %s, not a strategy", e.Name, e.Kind).
			At(e.Path, 0, 0).
			WithHelp("a strategy defines client_step(global, data, params, state) and server_step(global, sum, total_weight, params)")
	}
	f, err := Dialect().Parse(e.Path, e.Source, 0)
	if err != nil {
		return syntaxDiag(e, err)
	}
	defs := map[string]*syntax.DefStmt{}
	for _, stmt := range f.Stmts {
		if d, ok := stmt.(*syntax.DefStmt); ok {
			defs[d.Name.Name] = d
		}
	}
	var diags diag.List
	for _, r := range strategySignatures {
		d, ok := defs[r.fn]
		if !ok || acceptsPositional(d, r.arity) {
			continue
		}
		diags = append(diags, diag.New(diag.MissingFunction, e.Name,
			"%s must accept %d positional parameter(s): the engine calls %s", r.fn, r.arity, r.usage).
			At(e.Path, int(d.Def.Line), int(d.Def.Col)).WithSource(e.SourceLine(int(d.Def.Line))).
			WithHelp("define it as def %s", r.usage))
	}
	return diags.Err()
}
