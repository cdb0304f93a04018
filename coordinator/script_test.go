package coordinator

import (
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// Script-driven tests in the style of etcd-io/raft's datadriven
// interaction tests. Each testdata/*.txt file is a sequence of cases:
//
//	# a comment
//	lease w1 now=100 ttl=30
//	----
//	granted j1/0 until 130
//	event shard-leased j1/0 w1 until 130
//
// A case is one command (a batch: "batch" then one command per line) and,
// after "----", its expected output up to a blank line. Run with -rewrite to
// regenerate the expected output. Every command goes through EncodeCommand
// and DecodeCommand before it is applied, and a refused command must leave
// the state hash unchanged.
//
// Names stand for refs: job j1 is hash("job:j1"), its shard 3 is
// hash("shard:j1/3"), hash=aa is hash("result:aa").

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/*.txt")

func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scripts in testdata")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type scriptCase struct {
	line   int
	input  []string
	want   []string
	before []string // comments and blank lines before the case
}

func parseScript(t *testing.T, path string) (cases []scriptCase, trailer []string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var pending []string
	for i := 0; i < len(lines); {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pending = append(pending, l)
			i++
			continue
		}
		c := scriptCase{line: i + 1, before: pending}
		pending = nil
		for i < len(lines) && lines[i] != "----" {
			if strings.TrimSpace(lines[i]) == "" {
				t.Fatalf("%s:%d: command without ---- and expected output", path, c.line)
			}
			c.input = append(c.input, lines[i])
			i++
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: command without ----", path, c.line)
		}
		i++ // ----
		for i < len(lines) && strings.TrimSpace(lines[i]) != "" {
			c.want = append(c.want, lines[i])
			i++
		}
		cases = append(cases, c)
	}
	return cases, pending
}

func runScript(t *testing.T, path string) {
	cases, trailer := parseScript(t, path)
	h := newHarness(t)
	var out strings.Builder
	for _, c := range cases {
		got := h.run(c)
		for _, l := range c.before {
			out.WriteString(l + "\n")
		}
		for _, l := range c.input {
			out.WriteString(l + "\n")
		}
		out.WriteString("----\n")
		for _, l := range got {
			out.WriteString(l + "\n")
		}
		if !*rewrite && strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("%s:%d: %s\n got:\n\t%s\nwant:\n\t%s", path, c.line, c.input[0],
				strings.Join(got, "\n\t"), strings.Join(c.want, "\n\t"))
		}
	}
	for _, l := range trailer {
		out.WriteString(l + "\n")
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// harness runs script commands against a machine.
type harness struct {
	t     *testing.T
	m     *Machine
	names map[content.Ref]string
}

func newHarness(t *testing.T) *harness {
	m, err := New(Config{Regime: trust.Consortium})
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, m: m, names: map[content.Ref]string{}}
}

func (h *harness) ref(kind, name string) content.Ref {
	r := content.Hash([]byte(kind + ":" + name))
	h.names[r] = name
	return r
}

func (h *harness) name(r content.Ref) string {
	if n, ok := h.names[r]; ok {
		return n
	}
	return r.Short()
}

func (h *harness) run(c scriptCase) []string {
	cmd, args := splitArgs(c.input[0])
	switch cmd {
	case "pool", "status", "receipts", "contributions", "peers", "snapshot", "leases", "leasable":
		if len(c.input) > 1 {
			h.t.Fatalf("line %d: %s takes one line", c.line, cmd)
		}
		return h.query(c.line, cmd, args)
	case "batch":
		var b Batch
		for _, l := range c.input[1:] {
			b.Commands = append(b.Commands, h.command(c.line, l))
		}
		return h.apply(b)
	}
	if len(c.input) > 1 {
		h.t.Fatalf("line %d: %s takes one line", c.line, cmd)
	}
	return h.apply(h.command(c.line, c.input[0]))
}

// apply encodes, decodes and applies a command and formats the result.
func (h *harness) apply(c Command) []string {
	b, err := EncodeCommand(c)
	if err != nil {
		h.t.Fatalf("encoding %T: %v", c, err)
	}
	dc, err := DecodeCommand(b)
	if err != nil {
		h.t.Fatalf("decoding %T: %v", c, err)
	}
	before, captured := captureProbe(h.t, h.m)
	r := h.m.Apply(dc)
	captured()
	if r.Refused() && h.m.StateHash() != before {
		h.t.Errorf("refused %T changed the state", c)
	}
	return h.result(r)
}

func (h *harness) result(r Result) []string {
	var out []string
	if r.Refused() {
		for _, d := range r.Refusal {
			out = append(out, fmt.Sprintf("refused %s: %s: %s", d.Code, d.Subject, d.Message))
		}
		return out
	}
	switch resp := r.Response.(type) {
	case *SubmitResponse:
		p := resp.Policy
		s := fmt.Sprintf("submitted %s: %d shards, replicas=%d attempts=%d ttl=%d, %s",
			h.name(resp.Job), resp.Shards, p.Replicas, p.Attempts, p.LeaseTTL, resp.Method)
		if resp.Existing {
			s += " (existing)"
		}
		out = append(out, s)
	case *LeaseResponse:
		var gs []string
		for _, g := range resp.Grants {
			gs = append(gs, fmt.Sprintf("%s/%d", h.name(g.Job), g.Shard))
		}
		if len(gs) == 0 {
			gs = []string{"nothing"}
		}
		out = append(out, "granted "+strings.Join(gs, " "))
	case *RenewResponse:
		out = append(out, fmt.Sprintf("renewed %s/%d until %d", h.name(resp.Grant.Job), resp.Grant.Shard, resp.Grant.Expiry))
	case *ReleaseResponse:
		var rs []string
		for _, s := range resp.Released {
			rs = append(rs, fmt.Sprintf("%s/%d", h.name(s.Job), s.Shard))
		}
		if len(rs) == 0 {
			rs = []string{"nothing"}
		}
		out = append(out, "released "+strings.Join(rs, " "))
	case *TickResponse:
		out = append(out, fmt.Sprintf("now %d, %d leases expired", resp.Now, len(resp.Expired)))
	case *ReportResponse:
		s := fmt.Sprintf("report %s/%d from %s hash=%s: %s", h.name(resp.Job), resp.Shard, resp.Peer, h.name(resp.Result), resp.Outcome)
		if resp.Late {
			s += " (late)"
		}
		out = append(out, s)
	case *CommitResponse:
		s := fmt.Sprintf("committed %s/%d: %d commitments, reveal ", h.name(resp.Job), resp.Shard, resp.Commits)
		if resp.Reveal {
			s += "open"
		} else {
			s += fmt.Sprintf("at %d", resp.RevealAt)
		}
		out = append(out, s)
	case *ReducedResponse:
		s := fmt.Sprintf("reduced %s = %s by %s", h.name(resp.Job), h.name(resp.Reduced), resp.Reducer)
		if resp.Existing {
			s += " (existing)"
		}
		if resp.Check != "" {
			s += " " + resp.Check
		}
		out = append(out, s)
	case *VerdictResponse:
		out = append(out, fmt.Sprintf("verdict %s/%d: %s", h.name(resp.Job), resp.Shard, resp.Outcome))
	case *BatchResponse:
		for i, sub := range resp.Results {
			for _, l := range h.result(Result{Response: sub.Response, Refusal: sub.Refusal}) {
				out = append(out, fmt.Sprintf("[%d] %s", i, l))
			}
		}
	default:
		h.t.Fatalf("unexpected response %T", r.Response)
	}
	for _, e := range r.Events {
		out = append(out, "event "+h.event(e))
	}
	return out
}

func (h *harness) event(e Event) string {
	switch e := e.(type) {
	case JobSubmitted:
		return fmt.Sprintf("job-submitted %s shards=%d", h.name(e.Job), e.Shards)
	case ShardLeased:
		return fmt.Sprintf("shard-leased %s/%d %s until %d", h.name(e.Job), e.Shard, e.Peer, e.Expiry)
	case LeaseEnded:
		return fmt.Sprintf("lease-ended %s/%d %s %s", h.name(e.Job), e.Shard, e.Peer, e.Reason)
	case ResultReported:
		s := fmt.Sprintf("result-reported %s/%d %s hash=%s %s", h.name(e.Job), e.Shard, e.Peer, h.name(e.Result), e.Outcome)
		if e.Late {
			s += " late"
		}
		return s
	case ResultCommitted:
		return fmt.Sprintf("result-committed %s/%d %s", h.name(e.Job), e.Shard, e.Peer)
	case ShardVerified:
		s := fmt.Sprintf("shard-verified %s/%d result=%s agreeing=%s", h.name(e.Job), e.Shard, h.name(e.Result), strings.Join(e.Agreeing, ","))
		if len(e.Losers) > 0 {
			s += " losers=" + strings.Join(e.Losers, ",")
		}
		return s + fmt.Sprintf(" receipt=#%d", e.Receipt)
	case ShardFlagged:
		return fmt.Sprintf("shard-flagged %s/%d reports=%d: %s", h.name(e.Job), e.Shard, e.Reports, e.Reason)
	case AllShardsDecided:
		return fmt.Sprintf("job-decided %s verified=%d unverified=%d", h.name(e.Job), e.Verified, e.Unverified)
	case ReductionChecked:
		return fmt.Sprintf("reduction-checked %s by %s reduced=%s agrees=%v", h.name(e.Job), e.Peer, h.name(e.Reduced), e.Agrees)
	case VerdictDue:
		return fmt.Sprintf("verdict-due %s/%d reports=%d", h.name(e.Job), e.Shard, e.Reports)
	case VerdictRecorded:
		return fmt.Sprintf("verdict-recorded %s/%d by %s agreeing=%s of %d", h.name(e.Job), e.Shard, e.Verifier, strings.Join(e.Agreeing, ","), e.Reports)
	case JobComplete:
		return fmt.Sprintf("job-complete %s reduced=%s by %s", h.name(e.Job), h.name(e.Reduced), e.Reducer)
	}
	h.t.Fatalf("unexpected event %T", e)
	return ""
}

// command parses one command line.
func (h *harness) command(line int, text string) Command {
	cmd, a := splitArgs(text)
	fail := func(format string, args ...any) {
		h.t.Helper()
		h.t.Fatalf("line %d: %s: %s", line, text, fmt.Sprintf(format, args...))
	}
	switch cmd {
	case "submit":
		name := a.str("job", "")
		if name == "" {
			fail("submit needs job=NAME")
		}
		n := a.int("shards", 1)
		c := SubmitJob{
			Job: h.ref("job", name), Name: a.str("name", name), Regime: trust.Regime(a.str("regime", "")),
			SecurityCritical: a.flag("critical"), Now: a.int64("now", 0),
			Policy: Policy{Replicas: a.int("replicas", 0), Attempts: a.int("attempts", 0), LeaseTTL: a.int64("ttl", 0),
				Check: a.str("check", ""), Tolerance: a.str("tol", ""), Rounds: a.int("rounds", 0)},
		}
		prices := strings.Split(a.str("price", "1"), ",")
		for i := 0; i < n; i++ {
			p, err := strconv.ParseInt(prices[min(i, len(prices)-1)], 10, 64)
			if err != nil {
				fail("price: %v", err)
			}
			c.Shards = append(c.Shards, ShardPlan{
				Index: i, ID: h.ref("shard", fmt.Sprintf("%s/%d", name, i)),
				Price: p, PriceBasis: a.str("basis", "flat 1 per shard"),
			})
		}
		// peers=s1,s2,…: shard i may be leased only by the i-th peer.
		for i, p := range a.list("peers") {
			if i < len(c.Shards) {
				c.Shards[i].Peer = p
			}
		}
		if a.flag("dupshard") && n > 1 {
			c.Shards[1].ID = c.Shards[0].ID
		}
		for _, in := range a.list("inputs") {
			nm, cl, _ := strings.Cut(in, ":")
			c.Inputs = append(c.Inputs, trust.Item{Name: nm, Class: trust.Class(cl)})
		}
		for _, in := range a.list("models") {
			nm, cl, _ := strings.Cut(in, ":")
			c.Models = append(c.Models, trust.Item{Name: nm, Class: trust.Class(cl)})
		}
		return c
	case "lease":
		c := Lease{Peer: a.pos(0), Now: a.int64("now", 0), TTL: a.int64("ttl", 0), Max: a.int("max", 0), RequestID: a.str("req", "")}
		if j := a.str("job", ""); j != "" {
			c.Job = h.ref("job", j)
		}
		return c
	case "renew":
		j, s := h.shardArg(a.pos(1))
		return RenewLease{Peer: a.pos(0), Job: j, Shard: s, Now: a.int64("now", 0), TTL: a.int64("ttl", 0)}
	case "release":
		c := ReleaseLeases{Peer: a.pos(0), Now: a.int64("now", 0)}
		for _, p := range a.positional[1:] {
			j, s := h.shardArg(p)
			c.Shards = append(c.Shards, ShardRef{Job: j, Shard: s})
		}
		return c
	case "expire", "tick":
		return Tick{Now: a.int64("now", 0)}
	case "report":
		j, s := h.shardArg(a.pos(1))
		return ReportResult{Peer: a.pos(0), Job: j, Shard: s, Result: h.ref("result", a.str("hash", "")), Now: a.int64("now", 0)}
	case "commit":
		// commit PEER JOB/I hash=H nonce=N: commits to result H with a
		// nonce of 32 bytes N (copied=OTHER commits OTHER's commitment).
		j, s := h.shardArg(a.pos(1))
		who := a.str("copied", a.pos(0))
		return CommitResult{Peer: a.pos(0), Job: j, Shard: s, Now: a.int64("now", 0),
			Commitment: Commitment(h.ref("result", a.str("hash", "")), who, j, s, scriptNonce(a.str("nonce", "0")))}
	case "reveal":
		j, s := h.shardArg(a.pos(1))
		return ReportResult{Peer: a.pos(0), Job: j, Shard: s, Result: h.ref("result", a.str("hash", "")),
			Nonce: hex.EncodeToString(scriptNonce(a.str("nonce", "0"))), Now: a.int64("now", 0)}
	case "verdict":
		// verdict VERIFIER JOB/I judged=N agree=p1,p2 hash=H
		j, sh := h.shardArg(a.pos(1))
		c := ReportVerdict{Verifier: a.pos(0), Job: j, Shard: sh, Judged: a.int("judged", 0), Agreeing: a.list("agree"), Now: a.int64("now", 0), Detail: a.str("detail", "")}
		if hs := a.str("hash", ""); hs != "" {
			c.Canonical = h.ref("result", hs)
		}
		return c
	case "reduced":
		return ReportReduced{Job: h.ref("job", a.pos(0)), Peer: a.str("by", ""), Reduced: h.ref("result", a.str("hash", "")), Now: a.int64("now", 0), Within: a.flag("within")}
	}
	fail("unknown command %q", cmd)
	return nil
}

func (h *harness) shardArg(s string) (content.Ref, int) {
	j, idx, ok := strings.Cut(s, "/")
	i, err := strconv.Atoi(idx)
	if !ok || err != nil {
		h.t.Fatalf("%q is not JOB/INDEX", s)
	}
	return h.ref("job", j), i
}

func (h *harness) query(line int, cmd string, a args) []string {
	var out []string
	switch cmd {
	case "pool":
		m, err := New(Config{Regime: trust.Regime(a.str("regime", "consortium")), DefaultLeaseTTL: a.int64("ttl", 0), CommitReveal: a.flag("commit-reveal")})
		if err != nil {
			return []string{"error: " + err.Error()}
		}
		h.m = m
		return []string{fmt.Sprintf("pool %s", m.Regime())}
	case "status":
		js, err := h.m.Job(h.ref("job", a.pos(0)))
		if err != nil {
			d, _ := diag.As(err)
			return []string{fmt.Sprintf("error %s: %s", d[0].Code, d[0].Message)}
		}
		c := js.Counts
		s := fmt.Sprintf("job %s %s: pending=%d leased=%d verified=%d unverified=%d", js.Name, js.State, c.Pending, c.Leased, c.Verified, c.Unverified)
		if js.Reduced != "" {
			s += fmt.Sprintf(" reduced=%s by %s", h.name(js.Reduced), js.Reducer)
		}
		out = append(out, s)
		for _, sh := range js.Shards {
			s := fmt.Sprintf("  %d %s", sh.Index, sh.State)
			for _, l := range sh.Leases {
				s += fmt.Sprintf(" lease:%s@%d", l.Peer, l.Expiry)
			}
			for _, c := range sh.Commits {
				s += fmt.Sprintf(" committed:%s", c.Peer)
			}
			for _, r := range sh.Reports {
				s += fmt.Sprintf(" %s=%s", r.Peer, h.name(r.Result))
				if r.Late {
					s += "(late)"
				}
			}
			if sh.Result != "" {
				s += fmt.Sprintf(" -> %s by %s", h.name(sh.Result), strings.Join(sh.Agreeing, ","))
			}
			if len(sh.Losers) > 0 {
				s += " lost:" + strings.Join(sh.Losers, ",")
			}
			out = append(out, s)
		}
	case "receipts":
		rs := h.m.Receipts(uint64(a.int64("since", 0)))
		for _, r := range rs {
			out = append(out, fmt.Sprintf("#%d %s/%d result=%s peers=%s units=%d basis=%q method=%s time=%d",
				r.Seq, h.name(r.Job), r.ShardIndex, h.name(r.Result), strings.Join(r.Peers, ","), r.WorkUnits, r.PriceBasis, r.Method, r.LeaderTime))
		}
		all := h.m.Receipts(0)
		seq, head := h.m.Head()
		verdict := "chain verifies"
		if err := receipt.Verify(all); err != nil {
			verdict = "chain broken: " + err.Error()
		}
		out = append(out, fmt.Sprintf("%s: %d receipts, head #%d %s", verdict, len(all), seq, head.Short()))
	case "contributions":
		cs := h.m.Contributions()
		var peers []string
		for p := range cs {
			peers = append(peers, p)
		}
		sort.Strings(peers)
		for _, p := range peers {
			out = append(out, fmt.Sprintf("%s %d", p, cs[p]))
		}
		if len(out) == 0 {
			out = append(out, "none")
		}
	case "peers":
		for _, p := range h.m.Peers() {
			s := fmt.Sprintf("%s leases=%d reports=%d late=%d won=%d lost=%d extra=%d inconclusive=%d units=%d",
				p.Peer, p.Leases, p.Reports, p.Late, p.Won, p.Lost, p.Extra, p.Inconclusive, p.WorkUnits)
			if p.Expired > 0 {
				s += fmt.Sprintf(" expired=%d", p.Expired)
			}
			out = append(out, s)
		}
		if len(out) == 0 {
			out = append(out, "none")
		}
	case "leases":
		for _, g := range h.m.Leases(a.pos(0)) {
			out = append(out, fmt.Sprintf("%s/%d until %d", h.name(g.Job), g.Shard, g.Expiry))
		}
		if len(out) == 0 {
			out = append(out, "none")
		}
	case "leasable":
		out = append(out, fmt.Sprintf("%d", h.m.Leasable(a.pos(0), a.int64("now", 0))))
	case "snapshot":
		// Restore into a fresh machine and carry on with it.
		before := h.m.StateHash()
		m2, err := Load(h.m.Snapshot())
		if err != nil {
			return []string{"error: " + err.Error()}
		}
		if m2.StateHash() != before {
			return []string{"state hash changed across snapshot/restore"}
		}
		h.m = m2
		out = append(out, "restored, state hash unchanged")
	}
	return out
}

// args is a parsed command line: positional words and key=value pairs.
type args struct {
	positional []string
	kv         map[string]string
}

func splitArgs(line string) (string, args) {
	var words []string
	var cur strings.Builder
	quoted, started := false, false
	for _, r := range line {
		switch {
		case r == '"':
			quoted, started = !quoted, true
		case r == ' ' && !quoted:
			if started {
				words = append(words, cur.String())
				cur.Reset()
				started = false
			}
		default:
			cur.WriteRune(r)
			started = true
		}
	}
	if started {
		words = append(words, cur.String())
	}
	a := args{kv: map[string]string{}}
	for _, w := range words[1:] {
		if k, v, ok := strings.Cut(w, "="); ok {
			a.kv[k] = v
		} else {
			a.positional = append(a.positional, w)
		}
	}
	return words[0], a
}

func (a args) pos(i int) string {
	if i < len(a.positional) {
		return a.positional[i]
	}
	return ""
}

func (a args) str(k, def string) string {
	if v, ok := a.kv[k]; ok {
		return v
	}
	return def
}

func (a args) int64(k string, def int64) int64 {
	v, ok := a.kv[k]
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		panic(fmt.Sprintf("%s=%s: %v", k, v, err))
	}
	return n
}

func (a args) int(k string, def int) int { return int(a.int64(k, int64(def))) }

func (a args) flag(k string) bool {
	for _, p := range a.positional {
		if p == k {
			return true
		}
	}
	return false
}

func (a args) list(k string) []string {
	v := a.str(k, "")
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// scriptNonce is a nonce of 32 bytes, each the byte of n (a decimal).
func scriptNonce(n string) []byte {
	b, _ := strconv.Atoi(n)
	out := make([]byte, NonceBytes)
	for i := range out {
		out[i] = byte(b)
	}
	return out
}
