// Package diag is the one diagnostic format of Scellis: every refusal of a
// config, job, round or ledger charge is a Diagnostic with a stable code, the
// subject it concerns, where (file:line:col when there is a file), what was
// wrong and what to do. It renders for terminals like a compiler error and as
// JSON for the API. Codes are stable: once published, a code keeps its meaning.
package diag

import (
	"errors"
	"fmt"
	"strings"
)

// Severity says whether a diagnostic refuses the input or only warns.
type Severity string

const (
	Error   Severity = "error"
	Warning Severity = "warning"
	Note    Severity = "note"
)

// Position is a place in a source file (YAML config, Starlark content, CSV).
// Line and Col are 1-based; zero means unknown.
type Position struct {
	File string `json:"file"`
	Line int    `json:"line,omitempty"`
	Col  int    `json:"col,omitempty"`
}

func (p Position) String() string {
	s := p.File
	if p.Line > 0 {
		s += fmt.Sprintf(":%d", p.Line)
		if p.Col > 0 {
			s += fmt.Sprintf(":%d", p.Col)
		}
	}
	return s
}

// Diagnostic is one problem a person must act on.
type Diagnostic struct {
	Code     Code      `json:"code"`
	Severity Severity  `json:"severity"`
	Subject  string    `json:"subject"`
	Pos      *Position `json:"position,omitempty"`
	Message  string    `json:"message"`
	Help     string    `json:"help,omitempty"`
	// Source is the offending source line, when known; rendered under the
	// header so a terminal user sees what is wrong without opening the file.
	Source string `json:"source,omitempty"`
}

// New returns an error-severity diagnostic. The message is formatted with args.
func New(code Code, subject, format string, args ...any) *Diagnostic {
	return &Diagnostic{Code: code, Severity: Error, Subject: subject, Message: fmt.Sprintf(format, args...)}
}

// At sets the position and returns d for chaining.
func (d *Diagnostic) At(file string, line, col int) *Diagnostic {
	d.Pos = &Position{File: file, Line: line, Col: col}
	return d
}

// WithHelp sets the help text (what to do) and returns d for chaining.
func (d *Diagnostic) WithHelp(format string, args ...any) *Diagnostic {
	d.Help = fmt.Sprintf(format, args...)
	return d
}

// WithSource sets the offending source line and returns d for chaining.
func (d *Diagnostic) WithSource(line string) *Diagnostic {
	d.Source = line
	return d
}

// Error renders the diagnostic on one line (plus help), so a Diagnostic can
// travel as an ordinary error and still be recognised with As.
func (d *Diagnostic) Error() string {
	var b strings.Builder
	if d.Pos != nil {
		b.WriteString(d.Pos.String())
		b.WriteString(": ")
	}
	fmt.Fprintf(&b, "%s[%s]: ", d.Severity, d.Code)
	if d.Subject != "" {
		fmt.Fprintf(&b, "%s: ", d.Subject)
	}
	b.WriteString(d.Message)
	if d.Help != "" {
		fmt.Fprintf(&b, " (hint: %s)", d.Help)
	}
	return b.String()
}

// List is several diagnostics reported together (a config check reports
// every problem at once). A List with at least one error is itself an error.
type List []*Diagnostic

func (l List) Error() string {
	parts := make([]string, len(l))
	for i, d := range l {
		parts[i] = d.Error()
	}
	return strings.Join(parts, "\n")
}

// HasErrors reports whether any diagnostic in l has Error severity.
func (l List) HasErrors() bool {
	for _, d := range l {
		if d.Severity == Error {
			return true
		}
	}
	return false
}

// Err returns l as an error when it holds an error-severity diagnostic, else nil.
func (l List) Err() error {
	if l.HasErrors() {
		return l
	}
	return nil
}

// As extracts the diagnostics carried by err (a *Diagnostic or a List,
// possibly wrapped). ok is false when err carries none.
func As(err error) (List, bool) {
	var l List
	if errors.As(err, &l) {
		return l, len(l) > 0
	}
	var d *Diagnostic
	if errors.As(err, &d) {
		return List{d}, true
	}
	return nil, false
}
