package diag

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/scellis/scellis/internal/safefile"
)

// Render writes ds for a person, like a compiler error:
//
//	error[SC1003]: job.yaml:4:3: unknown key "reduce"
//	  |
//	4 |   reduce: sum
//	  |   ^
//	  = help: did you mean "reducer"?
//
// When a diagnostic has a position but no Source line, Render reads the line
// from the file if it can; failure to read it is not an error.
func Render(w io.Writer, ds List) {
	for i, d := range ds {
		if i > 0 {
			fmt.Fprintln(w)
		}
		renderOne(w, d)
	}
}

func renderOne(w io.Writer, d *Diagnostic) {
	fmt.Fprintf(w, "%s[%s]: ", d.Severity, d.Code)
	if d.Pos != nil {
		fmt.Fprintf(w, "%s: ", printable(d.Pos.String(), false))
	}
	if d.Subject != "" {
		fmt.Fprintf(w, "%s: ", printable(d.Subject, false))
	}
	fmt.Fprintln(w, printable(d.Message, true))
	src := d.Source
	if src == "" && d.Pos != nil && d.Pos.Line > 0 {
		src = readLine(d.Pos.File, d.Pos.Line)
	}
	if src != "" && d.Pos != nil && d.Pos.Line > 0 {
		num := fmt.Sprint(d.Pos.Line)
		pad := strings.Repeat(" ", len(num))
		fmt.Fprintf(w, "%s |\n%s | %s\n", pad, num, printable(strings.TrimRight(src, "\r\n"), false))
		if d.Pos.Col > 0 {
			fmt.Fprintf(w, "%s | %s^\n", pad, caretIndent(src, d.Pos.Col))
		}
	}
	if d.Help != "" {
		fmt.Fprintf(w, "  = help: %s\n", printable(d.Help, true))
	}
}

// printable replaces control characters (but tabs, and newlines when
// lines is set) and invalid UTF-8 with U+FFFD, one for one so a caret
// still lines up: a quoted line or a message can come from hostile
// content (a binary file given as a .star, a fail() message), and raw
// escape sequences would drive the terminal that shows the diagnostic.
func printable(s string, lines bool) string {
	return strings.Map(func(r rune) rune {
		if r == '\t' || (lines && r == '\n') || !unicode.IsControl(r) {
			return r // an invalid byte arrives as utf8.RuneError and is written as U+FFFD
		}
		return utf8.RuneError
	}, s)
}

// caretIndent keeps tabs so the caret lines up under the column.
func caretIndent(src string, col int) string {
	var b strings.Builder
	for i, r := range src {
		if i >= col-1 {
			break
		}
		if r == '\t' {
			b.WriteByte('\t')
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// maxSourceRead bounds how much of a file Render reads to quote one line.
const maxSourceRead = 4 << 20

func readLine(file string, line int) string {
	// The file may be what was refused: a FIFO or device must not hang
	// the rendering of the diagnostic that refused it.
	f, _, err := safefile.Open(file, os.O_RDONLY, math.MaxInt64)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSourceRead))
	if err != nil {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	if line-1 < len(lines) {
		return lines[line-1]
	}
	return ""
}

// RenderJSON writes ds as {"diagnostics": [...]}, the form the API returns.
func RenderJSON(w io.Writer, ds List) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if ds == nil {
		ds = List{}
	}
	return enc.Encode(struct {
		Diagnostics List `json:"diagnostics"`
	}{ds})
}
