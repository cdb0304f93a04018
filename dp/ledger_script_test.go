package dp

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// The ledger's script-driven tests (in the style of etcd-io/raft's
// datadriven interaction tests) live in testdata/ledger/*.txt. Each case is
//
//	command key=value ...
//	----
//	expected output
//	<blank line>
//
// and lines starting with # are comments. Run with -rewrite to regenerate
// the expected output after a deliberate change (then review the diff).
//
// Commands:
//
//	init [orders=1.5,2,4] [conversion=improved|classic]
//	budget dataset=D eps=E delta=D
//	charge dataset=D consumer=C sigma=S q=Q steps=T [sigma2= q2= steps2=]
//	status dataset=D
//	max-steps dataset=D sigma=S q=Q
//	crash-mid-write bytes=N|all-K dataset=… (a charge's frame cut after N bytes)
//	crash-zero-fill bytes=N            (the filesystem extended the file, data lost)
//	reopen                             (open again, as after a restart)
//	save name=X / restore name=X       (copy the ledger file aside and back)
//	tamper entry=N how=flip|edit-body|edit-rehash|resign|delete|swap|truncate|resign-all|forge-curve
//	verify [pubkey=ledger|other]

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/ledger scripts")

type scriptCase struct {
	line     int
	cmd      string
	args     map[string]string
	expected string
}

func parseScript(t *testing.T, path string) []scriptCase {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []scriptCase
	sc := bufio.NewScanner(bytes.NewReader(data))
	ln := 0
	for sc.Scan() {
		ln++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		c := scriptCase{line: ln, cmd: fields[0], args: map[string]string{}}
		for _, f := range fields[1:] {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				t.Fatalf("%s:%d: argument %q is not key=value", path, ln, f)
			}
			c.args[k] = v
		}
		if !sc.Scan() || strings.TrimSpace(sc.Text()) != "----" {
			t.Fatalf("%s:%d: command not followed by ----", path, ln)
		}
		ln++
		var out []string
		for sc.Scan() {
			ln++
			if sc.Text() == "" {
				break
			}
			out = append(out, sc.Text())
		}
		c.expected = strings.Join(out, "\n")
		cases = append(cases, c)
	}
	return cases
}

func writeScript(path string, cases []scriptCase, got []string) error {
	// Keep comments: rebuild from the original, replacing expected blocks.
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var b strings.Builder
	lines := strings.Split(string(data), "\n")
	ci := 0
	for i := 0; i < len(lines); i++ {
		b.WriteString(lines[i])
		b.WriteByte('\n')
		if ci < len(cases) && i+1 == cases[ci].line {
			b.WriteString("----\n")
			if got[ci] != "" {
				b.WriteString(got[ci])
				b.WriteByte('\n')
			}
			i++ // skip ----
			for i+1 < len(lines) && lines[i+1] != "" {
				i++
			}
			ci++
		}
	}
	return os.WriteFile(path, []byte(strings.TrimRight(b.String(), "\n")+"\n"), 0o644)
}

func TestLedgerScripts(t *testing.T) {
	files, _ := filepath.Glob("testdata/ledger/*.txt")
	if len(files) == 0 {
		t.Fatal("no ledger scripts found: the test corpus vanished")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			cases := parseScript(t, f)
			if len(cases) == 0 {
				t.Fatal("script has no commands")
			}
			defer func(old func([]byte)) { readNonce = old }(readNonce)
			readNonce = func(b []byte) { clear(b) } // reproducible hashes
			h := &harness{t: t, dir: t.TempDir()}
			h.path = filepath.Join(h.dir, "privacy.ledger")
			defer h.close()
			got := make([]string, len(cases))
			for i, c := range cases {
				got[i] = strings.TrimRight(h.run(c), "\n")
				if !*rewrite && got[i] != c.expected {
					t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", f, c.line, c.cmd, got[i], c.expected)
				}
			}
			if *rewrite {
				if err := writeScript(f, cases, got); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

type harness struct {
	t     *testing.T
	dir   string
	path  string
	l     *Ledger
	clock func() time.Time
}

func (h *harness) close() {
	if h.l != nil {
		h.l.Close()
		h.l = nil
	}
}

func (h *harness) num(c scriptCase, k string) float64 {
	v, err := strconv.ParseFloat(c.args[k], 64)
	if err != nil {
		h.t.Fatalf("line %d: %s=%q: %v", c.line, k, c.args[k], err)
	}
	return v
}

func (h *harness) request(c scriptCase) ChargeRequest {
	req := ChargeRequest{Dataset: c.args["dataset"], Consumer: c.args["consumer"]}
	for _, sfx := range []string{"", "2", "3"} {
		if _, ok := c.args["sigma"+sfx]; !ok {
			continue
		}
		req.Mechanisms = append(req.Mechanisms, SubsampledGaussian(h.num(c, "sigma"+sfx), h.num(c, "q"+sfx), int64(h.num(c, "steps"+sfx))))
	}
	return req
}

func describe(err error) string {
	if ds, ok := diag.As(err); ok {
		return fmt.Sprintf("refused %s: %s", ds[0].Code, ds[0].Message)
	}
	var ve *VerifyError
	if errors.As(err, &ve) {
		return "bad: " + ve.Error()
	}
	return "error: " + err.Error()
}

func (h *harness) run(c scriptCase) string {
	switch c.cmd {
	case "init":
		h.clock = stepClock()
		opts := &Options{Now: h.clock}
		if o, ok := c.args["orders"]; ok {
			for _, s := range strings.Split(o, ",") {
				v, _ := strconv.ParseFloat(s, 64)
				opts.Orders = append(opts.Orders, v)
			}
		}
		if cv, ok := c.args["conversion"]; ok {
			conv, err := ParseConversion(cv)
			if err != nil {
				return describe(err)
			}
			opts.Conversion = conv
		}
		l, err := Create(h.path, testKey(1), opts)
		if err != nil {
			return describe(err)
		}
		h.l = l
		return fmt.Sprintf("created: %d orders, %s conversion", len(l.c.orders), l.c.conv)
	case "budget":
		e, err := h.l.DeclareBudget(c.args["dataset"], h.num(c, "eps"), h.num(c, "delta"))
		if err != nil {
			return describe(err)
		}
		return fmt.Sprintf("ok seq=%d", e.Seq)
	case "charge":
		e, err := h.l.Charge(h.request(c))
		if err != nil {
			return describe(err)
		}
		st, _ := h.l.Status(e.Charge.Dataset)
		return fmt.Sprintf("ok seq=%d eps=%.6g cumulative=%.6g remaining=%.6g order=%g",
			e.Seq, e.Charge.Epsilon, e.Charge.Cumulative, st.Remaining, e.Charge.Order)
	case "status":
		st, err := h.l.Status(c.args["dataset"])
		if err != nil {
			return describe(err)
		}
		return fmt.Sprintf("budget=%g delta=%g spent=%.6g remaining=%.6g charges=%d", st.Budget, st.Delta, st.Spent, st.Remaining, st.Charges)
	case "max-steps":
		n, err := h.l.MaxSteps(c.args["dataset"], h.num(c, "q"), h.num(c, "sigma"))
		if err != nil {
			return describe(err)
		}
		return fmt.Sprintf("max-steps=%d", n)
	case "crash-mid-write":
		return h.crashMidWrite(c)
	case "crash-zero-fill":
		n := int(h.num(c, "bytes"))
		h.close()
		appendBytes(h.t, h.path, make([]byte, n))
		return fmt.Sprintf("appended %d zero bytes; process gone", n)
	case "reopen":
		h.close()
		l, err := Open(h.path, testKey(1), &Options{Now: h.clock})
		if err != nil {
			return describe(err)
		}
		h.l = l
		out := fmt.Sprintf("opened: %d entries", len(l.c.entries))
		for _, t := range l.TornTails() {
			out += "\ncut torn tail: " + strings.ReplaceAll(t, h.dir+"/", "")
		}
		return out
	case "save", "restore":
		h.close()
		from, to := h.path, h.path+".saved-"+c.args["name"]
		if c.cmd == "restore" {
			from, to = to, from
		}
		data, err := os.ReadFile(from)
		if err != nil {
			h.t.Fatal(err)
		}
		os.WriteFile(to, data, 0o644)
		return c.cmd + "d " + c.args["name"]
	case "tamper":
		h.close()
		return h.tamper(c)
	case "verify":
		var pub ed25519.PublicKey
		switch c.args["pubkey"] {
		case "ledger":
			pub = testKey(1).Public().(ed25519.PublicKey)
		case "other":
			pub = testKey(9).Public().(ed25519.PublicKey)
		}
		s, err := Verify(h.path, pub)
		if err != nil {
			return describe(err)
		}
		out := fmt.Sprintf("ok: %d entries", s.Len())
		if s.TornBytes > 0 {
			out += fmt.Sprintf(", torn tail of %d bytes", s.TornBytes)
		}
		for _, d := range s.Datasets() {
			out += fmt.Sprintf("\n%s spent=%.6g of %g", d.Dataset, d.Spent, d.Budget)
		}
		return out
	}
	h.t.Fatalf("line %d: unknown command %q", c.line, c.cmd)
	return ""
}

func appendBytes(t *testing.T, path string, b []byte) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

// crashMidWrite builds the frame the ledger would append for a charge and
// writes only its first bytes, as a power loss mid-write would leave it; the
// process "dies" (the handle is dropped without any cleanup).
func (h *harness) crashMidWrite(c scriptCase) string {
	req := h.request(c)
	ds := h.l.c.datasets[req.Dataset]
	curve, _, err := h.l.c.curveOf(req.Mechanisms)
	if err != nil {
		return describe(err)
	}
	alone, _, _ := Epsilon(h.l.c.orders, curve, ds.budget.Delta, h.l.c.conv)
	cum, order, _ := Epsilon(h.l.c.orders, addCurves(ds.rdp, curve), ds.budget.Delta, h.l.c.conv)
	e := &Entry{Seq: uint64(len(h.l.c.entries)), Kind: KindCharge, Prev: h.l.c.head, Time: h.clock().UnixNano(),
		Charge: &Charge{Dataset: req.Dataset, Consumer: req.Consumer, Mechanisms: req.Mechanisms, RDP: curve, Epsilon: alone, Cumulative: cum, Order: order}}
	p, err := sealEntry(e, h.l.key, FormatVersion)
	if err != nil {
		h.t.Fatal(err)
	}
	frame := appendFrame(nil, p, FormatVersion)
	n := 0
	if s, ok := strings.CutPrefix(c.args["bytes"], "all-"); ok {
		k, _ := strconv.Atoi(s)
		n = len(frame) - k
	} else {
		n, _ = strconv.Atoi(c.args["bytes"])
	}
	h.close()
	appendBytes(h.t, h.path, frame[:n])
	return fmt.Sprintf("wrote %d of %d bytes of entry %d; process gone", n, len(frame), e.Seq)
}

type rawFrame struct {
	off  int
	data []byte // the whole frame
	e    *Entry
}

func readFrames(t *testing.T, path string) []rawFrame {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []rawFrame
	off := len(fileMagic)
	for {
		p, size, res, _ := nextFrame(data[off:], FormatVersion)
		if res != frameOK {
			return out
		}
		e, err := decodeRecord(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rawFrame{off: off, data: data[off : off+size], e: e})
		off += size
	}
}

func writeFrames(t *testing.T, path string, frames [][]byte) {
	b := []byte(fileMagic)
	for _, f := range frames {
		b = append(b, f...)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// reframe encodes e's body unchanged in meaning but with the given hash and
// signature, in a frame with a valid CRC: a careful attacker's bytes.
func reframe(t *testing.T, e *Entry, hash content.Ref, sig []byte) []byte {
	body, err := content.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	p, err := content.Encode(record{Body: body, Hash: hash, Sig: sig})
	if err != nil {
		t.Fatal(err)
	}
	return appendFrame(nil, p, FormatVersion)
}

func (h *harness) tamper(c scriptCase) string {
	frames := readFrames(h.t, h.path)
	n := int(h.num(c, "entry"))
	if n >= len(frames) {
		h.t.Fatalf("line %d: no entry %d", c.line, n)
	}
	raw := make([][]byte, len(frames))
	for i, f := range frames {
		raw[i] = bytes.Clone(f.data)
	}
	e := frames[n].e
	edit := func() {
		if e.Charge != nil {
			e.Charge.Consumer += "-edited"
		} else if e.Budget != nil {
			e.Budget.Epsilon *= 10
		} else {
			e.Genesis.Silo = "edited"
		}
	}
	mallory := testKey(66)
	switch how := c.args["how"]; how {
	case "flip":
		raw[n][len(raw[n])/2] ^= 0x01
	case "edit-body":
		edit()
		raw[n] = reframe(h.t, e, e.Hash, e.Sig)
	case "edit-rehash":
		edit()
		body, _ := content.Encode(e)
		raw[n] = reframe(h.t, e, content.Hash(body), e.Sig)
	case "resign":
		edit()
		p, _ := sealEntry(e, mallory, FormatVersion)
		raw[n] = appendFrame(nil, p, FormatVersion)
	case "delete":
		raw = append(raw[:n], raw[n+1:]...)
	case "swap":
		raw[n], raw[n+1] = raw[n+1], raw[n]
	case "truncate":
		raw = raw[:n]
	case "resign-all", "forge-curve":
		// Rewrite the chain from entry n on with a key: mallory's (a forger
		// without the silo key), or the silo's own for forge-curve (a key
		// holder halving a charge's RDP curve to hide spending).
		key := mallory
		if how == "forge-curve" {
			key = testKey(1)
		}
		prev := content.Ref("")
		if n > 0 {
			prev = frames[n-1].e.Hash
		}
		for i := n; i < len(frames); i++ {
			fe := frames[i].e
			fe.Prev = prev
			if fe.Genesis != nil && how == "resign-all" {
				fe.Genesis.PublicKey = key.Public().(ed25519.PublicKey)
			}
			if i == n && how == "forge-curve" {
				for j := range fe.Charge.RDP {
					fe.Charge.RDP[j] /= 2
				}
			}
			p, _ := sealEntry(fe, key, FormatVersion)
			raw[i] = appendFrame(nil, p, FormatVersion)
			prev = fe.Hash
		}
	default:
		h.t.Fatalf("line %d: unknown tamper %q", c.line, how)
	}
	writeFrames(h.t, h.path, raw)
	return fmt.Sprintf("tampered entry %d (%s)", n, c.args["how"])
}
