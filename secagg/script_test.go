package secagg

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Script-driven tests of the state machines, in the style of etcd-io/raft's
// datadriven interaction tests. A script in testdata/*.txt is a sequence of
//
//	command args…
//	----
//	expected output
//	<blank line>
//
// Lines starting with # between blocks are comments. Commands:
//
//	clients N [t=T] [d=D] [clip=C] [maxweight=W] [prg=P] [round=R] [proto=P] [only=pairwise] [wire]
//	input cX v1 v2 … [w=W]     set a client's input (default: multiples of 1/4)
//	drop cX [after=STEP]       the client takes no part after STEP
//	                           (start, advertise, share, mask; default: now)
//	evil unsign|badsig|dup cX  the relay corrupts cX's advert in the key set
//	evil both cX               the unmask request also names cX as dropped
//	advertise | share | mask | unmask
//	run                        all four steps
//
// unmask checks the sum against the plaintext sum of the contributors
// itself (exactly in the ring); the script records what it printed.
// go test -run TestScripts -rewrite rewrites the expected outputs.
//
// Every script runs twice: as written (pairwise unless a clients command
// says proto=), and with every round forced to SecAgg+, which must print
// the same, save the protocol named on the clients line: the same sums,
// dropouts and refusals. A round marked only=pairwise (more dropouts than
// SecAgg+'s graph is sized for) is skipped in the forced run.

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata scripts")

type scriptBlock struct {
	line     int
	cmd      string
	expected string
	comments string // comment and blank lines before the block, kept on rewrite
}

func parseScript(t *testing.T, path string) []scriptBlock {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var blocks []scriptBlock
	var pre strings.Builder
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pre.WriteString(l + "\n")
			continue
		}
		b := scriptBlock{line: i + 1, cmd: strings.TrimSpace(l), comments: pre.String()}
		pre.Reset()
		i++
		if i >= len(lines) || lines[i] != "----" {
			t.Fatalf("%s:%d: command %q not followed by ----", path, b.line, b.cmd)
		}
		var exp strings.Builder
		for i++; i < len(lines) && lines[i] != ""; i++ {
			exp.WriteString(lines[i] + "\n")
		}
		b.expected = exp.String()
		blocks = append(blocks, b)
	}
	return blocks
}

func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scripts in testdata")
	}
	for _, f := range files {
		for _, force := range []Protocol{"", SecAggPlus} {
			name := filepath.Base(f)
			if force != "" {
				name += "/" + string(force)
			}
			t.Run(name, func(t *testing.T) { runScript(t, f, force) })
		}
	}
}

func runScript(t *testing.T, f string, force Protocol) {
	blocks := parseScript(t, f)
	if len(blocks) == 0 {
		t.Fatalf("%s has no commands", f)
	}
	s := &script{t: t, force: force}
	var out strings.Builder
	skip := false
	for _, b := range blocks {
		if force != "" && strings.HasPrefix(b.cmd, "clients ") {
			// Rounds already SecAgg+ ran as written.
			skip = strings.Contains(b.cmd, " only=pairwise") || scriptProto(b.cmd) == force
		}
		if skip {
			continue
		}
		got := s.exec(b)
		if force != "" {
			if *rewrite {
				return
			}
			if scriptProto(b.cmd) != force {
				got = strings.Replace(got, ", protocol "+string(force), ", protocol "+string(scriptProto(b.cmd)), 1)
				got, _, _ = strings.Cut(got, "masking graph:")
			}
		}
		if *rewrite {
			fmt.Fprintf(&out, "%s%s\n----\n%s\n", b.comments, b.cmd, got)
			continue
		}
		if got != b.expected {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", f, b.line, b.cmd, got, b.expected)
		}
	}
	if *rewrite && force == "" {
		if err := os.WriteFile(f, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// scriptProto is the protocol a clients command asks for.
func scriptProto(cmd string) Protocol {
	for _, a := range strings.Fields(cmd) {
		if v, ok := strings.CutPrefix(a, "proto="); ok {
			return Protocol(v)
		}
	}
	return Pairwise
}

type script struct {
	t     *testing.T
	h     *harness
	force Protocol // run every round with this protocol
}

// exec runs one command and returns what it printed.
func (s *script) exec(b scriptBlock) string {
	f := strings.Fields(b.cmd)
	args, opts := []string{}, map[string]string{}
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			opts[k] = v
		} else {
			args = append(args, a)
		}
	}
	fail := func(format string, a ...any) string {
		s.t.Fatalf("line %d: %s: %s", b.line, b.cmd, fmt.Sprintf(format, a...))
		return ""
	}
	num := func(k string, def float64) float64 {
		v, ok := opts[k]
		if !ok {
			return def
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			fail("bad %s=%q", k, v)
		}
		return x
	}
	if f[0] != "clients" && s.h == nil {
		return fail("no clients yet")
	}
	h := s.h
	if h != nil {
		h.out.Reset()
	}
	switch f[0] {
	case "clients":
		if len(args) < 1 || len(args) > 2 || (len(args) == 2 && args[1] != "wire") {
			return fail("want clients N [wire]")
		}
		n, err := strconv.Atoi(args[0])
		if err != nil {
			return fail("bad N")
		}
		round := opts["round"]
		if round == "" {
			round = "r1"
		}
		p := testParams(round, n, int(num("t", 0)), int(num("d", 4)), num("clip", 10))
		if _, ok := opts["maxweight"]; ok {
			p.Weighted = true
			p.MaxWeight = num("maxweight", 0)
		}
		p.PRG = PRG(opts["prg"])
		p.Protocol = scriptProto(b.cmd)
		if s.force != "" {
			p.Protocol = s.force
		}
		hh, err := newHarness(s.t, p)
		if err != nil {
			s.h = nil
			return refusal(err) + "\n"
		}
		s.h = hh
		hh.wire = len(args) == 2
		r, _ := newRound(p)
		out := fmt.Sprintf("round %q: %d clients, threshold %d, dim %d, frac bits %d, prg %s, protocol %s\n", p.Round, n, r.t, p.Dim, r.fracBits, r.prg, r.proto)
		if p.Protocol == SecAggPlus {
			out += fmt.Sprintf("masking graph: degree %d, shares %d-of-neighbourhood\n", r.k, r.st)
		}
		return out
	case "input":
		if len(args) != len(h.inputs[args[0]])+1 {
			return fail("want input cX and %d values", h.p.Dim)
		}
		x := make([]float64, 0, len(args)-1)
		for _, a := range args[1:] {
			v, err := strconv.ParseFloat(a, 64)
			if err != nil {
				return fail("bad value %q", a)
			}
			x = append(x, v)
		}
		h.inputs[args[0]] = x
		h.weights[args[0]] = num("w", h.weights[args[0]])
		return "ok\n"
	case "drop":
		if len(args) != 1 || h.clients[args[0]] == nil {
			return fail("want drop cX")
		}
		st := h.lastStep()
		if a, ok := opts["after"]; ok {
			var known bool
			if st, known = stepNames[a]; !known {
				return fail("unknown step %q", a)
			}
		}
		h.stop[args[0]] = st
		return fmt.Sprintf("%s takes no part after %s\n", args[0], st)
	case "evil":
		if len(args) != 2 {
			return fail("want evil KIND cX")
		}
		if args[0] == "both" {
			h.evil["both"] = args[1]
		} else {
			h.evil[args[1]] = args[0]
		}
		return "ok\n"
	case "advertise":
		h.advertise()
	case "share":
		h.share()
	case "mask":
		h.mask()
	case "unmask":
		h.unmask()
	case "run":
		h.run()
	default:
		return fail("unknown command")
	}
	return h.out.String()
}

// lastStep is the last step the server has completed, for "drop cX".
func (h *harness) lastStep() step {
	switch h.server.Phase() {
	case PhaseAdvertise:
		if len(h.server.Missing()) < len(h.ids) {
			return stepAdvertise
		}
		return stepStart
	case PhaseShare:
		return stepShare
	case PhaseMask:
		return stepMask
	default:
		return stepUnmask
	}
}
