package consensus

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// hclog's lines arrive as slog records; the first election of a start (no
// leader known) is info, a later one (a leader was lost) stays a warning.
func TestSlogHclogLevels(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h := slogHclog(log)
	h.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "", "last-leader-id", "")
	h.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "127.0.0.1:7401", "last-leader-id", "agg-2")
	h.Named("net").Error("failed to accept connection", "error", "boom")
	h.Debug("not shown")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 lines, got %d:\n%s", len(lines), buf.String())
	}
	for i, want := range []string{
		`level=INFO msg="heartbeat timeout reached, starting election" module=raft last-leader-addr="" last-leader-id=""`,
		`level=WARN msg="heartbeat timeout reached, starting election" module=raft last-leader-addr=127.0.0.1:7401 last-leader-id=agg-2`,
		`level=ERROR msg="failed to accept connection" module=raft.net error=boom`,
	} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d: %s\nwant it to contain %s", i, lines[i], want)
		}
	}

	// At the default level (warn) a normal start says nothing.
	buf.Reset()
	quiet := slogHclog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	quiet.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "", "last-leader-id", "")
	quiet.Info("entering leader state", "leader", "agg-1")
	if buf.Len() != 0 {
		t.Fatalf("a start-up election logged at warn level: %s", buf.String())
	}
}
