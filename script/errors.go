package script

import (
	"errors"
	"fmt"
	"strings"

	"go.starlark.net/resolve"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/scellis/scellis/diag"
)

// mapError turns whatever a Starlark execution returned into a diagnostic
// positioned at the innermost frame inside a content file.
func (st *callState) mapError(err error) error {
	subject := st.entry.Subject()
	ev := deepestEvalError(err)
	pos, trace := st.contentFrame(ev)

	switch st.reason.Load() {
	case stopSteps:
		return st.at(diag.New(diag.StepBudget, subject, "used more than %d steps%s", st.limits.Steps, trace), pos).
			WithHelp("the content ran too long (an endless loop?); raise limits.steps in the job if the work is genuine")
	case stopMemory:
		return st.at(diag.New(diag.MemoryBudget, subject, "%s%s", *st.detail.Load(), trace), pos).
			WithHelp("the content holds too much memory; raise limits.memory_mb in the job or use smaller shards")
	case stopCancelled:
		return st.at(diag.New(diag.ContentCancelled, subject, "%s", *st.detail.Load()), pos).
			WithHelp("the run was interrupted; run it again")
	}

	var d *diag.Diagnostic
	if errors.As(err, &d) {
		c := *d
		if c.Subject == "" {
			c.Subject = subject
		}
		if c.Pos == nil {
			st.at(&c, pos)
		}
		if trace != "" && c.Code != diag.ForbiddenLoad {
			c.Message += trace
		}
		return &c
	}
	var se syntax.Error
	if errors.As(err, &se) {
		return st.syntaxDiag(se.Pos, se.Msg)
	}
	var rl resolve.ErrorList
	if errors.As(err, &rl) {
		var ds diag.List
		for _, r := range rl {
			ds = append(ds, st.syntaxDiag(r.Pos, r.Msg))
		}
		if len(ds) == 1 {
			return ds[0]
		}
		return ds
	}
	if ev != nil {
		return st.at(diag.New(diag.StarlarkRuntime, subject, "%s%s", ev.Msg, trace), pos).
			WithHelp("the content failed at the quoted line")
	}
	return st.at(diag.New(diag.StarlarkRuntime, subject, "%v", err), pos)
}

func (st *callState) syntaxDiag(pos syntax.Position, msg string) *diag.Diagnostic {
	return st.at(diag.New(diag.StarlarkSyntax, st.entry.Subject(), "%s", msg), pos)
}

// at positions d at pos and quotes the source line when the file is known
// (built-in entries are embedded, so the renderer could not read them).
func (st *callState) at(d *diag.Diagnostic, pos syntax.Position) *diag.Diagnostic {
	if !pos.IsValid() {
		return d.At(st.entry.Path, 0, 0)
	}
	file := pos.Filename()
	d.At(file, int(pos.Line), int(pos.Col))
	if e, ok := st.paths[file]; ok {
		d.WithSource(e.SourceLine(int(pos.Line)))
	}
	return d
}

// deepestEvalError returns the innermost *starlark.EvalError in err's chain
// (a failure inside a loaded module is wrapped by the load statement's).
func deepestEvalError(err error) *starlark.EvalError {
	var last *starlark.EvalError
	for e := err; e != nil; e = errors.Unwrap(e) {
		if ev, ok := e.(*starlark.EvalError); ok {
			last = ev
		}
	}
	return last
}

// contentFrame returns the position of the innermost frame that lies in a
// content file, and the Starlark traceback as a message suffix.
func (st *callState) contentFrame(ev *starlark.EvalError) (syntax.Position, string) {
	if ev == nil {
		return syntax.Position{}, ""
	}
	var pos syntax.Position
	for i := len(ev.CallStack) - 1; i >= 0; i-- {
		p := ev.CallStack[i].Pos
		if p.IsValid() && p.Filename() != "<builtin>" {
			pos = p
			break
		}
	}
	var b strings.Builder
	b.WriteString("\nTraceback (most recent call last):")
	for _, fr := range ev.CallStack {
		if fr.Pos.Filename() == "<builtin>" {
			if fr.Name == repeatName {
				continue // the multiplication itself; its line is above
			}
			fmt.Fprintf(&b, "\n  in %s (native)", fr.Name)
			continue
		}
		fmt.Fprintf(&b, "\n  %s: in %s", fr.Pos, fr.Name)
	}
	return pos, b.String()
}
