package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
)

// progress draws a bar with count and ETA on a terminal and plain lines
// (every tenth of the work) otherwise, so logs stay readable.
type progress struct {
	w        io.Writer
	label    string
	tty      bool
	start    time.Time
	lastTick int
}

func newProgress(w io.Writer, label string) *progress {
	tty, _ := terminal(w)
	return &progress{w: w, label: label, tty: tty, start: time.Now()}
}

// terminal says whether w is a terminal and, if so, its width in columns
// (0 if unknown): lines rewritten in place with \r must not wrap.
func terminal(w io.Writer) (bool, int) {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return false, 0
	}
	width, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return true, 0
	}
	return true, width
}

func (p *progress) update(done, total int) {
	if total <= 0 {
		return
	}
	elapsed := time.Since(p.start)
	eta := "?"
	if done > 0 {
		eta = (time.Duration(float64(elapsed) / float64(done) * float64(total-done))).Round(time.Second).String()
	}
	if p.tty {
		const width = 30
		filled := done * width / total
		bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
		fmt.Fprintf(p.w, "\r%s [%s] %d/%d  ETA %s   ", p.label, bar, done, total, eta)
		if done == total {
			fmt.Fprintf(p.w, "\r%s [%s] %d/%d  in %s   \n", p.label, bar, done, total, elapsed.Round(time.Millisecond))
		}
		return
	}
	tick := done * 10 / total
	if tick > p.lastTick || done == total {
		p.lastTick = tick
		fmt.Fprintf(p.w, "%s: %d/%d done (%d%%), eta %s\n", p.label, done, total, done*100/total, eta)
	}
}
