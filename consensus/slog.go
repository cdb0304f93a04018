package consensus

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sort"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// Raft, its transport and its log store log through hclog. With
// Config.Slog set, their lines go through the node's log/slog logger
// instead, at levels that mean what the operator expects: a node's first
// election — the one every start makes, with no leader known yet — is
// info, not a warning, so a quiet default level (warn) says nothing on a
// normal start.

// slogHclog returns an hclog logger writing JSON lines to log through
// slogWriter; hclog's own level is the lowest log enables, so lines no
// handler wants are not even formatted.
func slogHclog(log *slog.Logger) hclog.Logger {
	ctx := context.Background()
	level := hclog.Warn
	switch {
	case log.Enabled(ctx, slog.LevelDebug):
		level = hclog.Debug
	case log.Enabled(ctx, slog.LevelInfo):
		level = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       "raft",
		Output:     &slogWriter{log: log},
		Level:      level,
		JSONFormat: true,
	})
}

// slogWriter turns hclog's JSON lines into slog records.
type slogWriter struct {
	log *slog.Logger
	mu  sync.Mutex
}

func (w *slogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for line := range bytes.Lines(p) {
		var m map[string]any
		if json.Unmarshal(line, &m) != nil {
			w.log.Warn(string(bytes.TrimSpace(line)), "module", "raft")
			continue
		}
		msg, _ := m["@message"].(string)
		module, _ := m["@module"].(string)
		lvl := slogLevel(m["@level"])
		if startupElection(msg, m) {
			lvl = slog.LevelInfo
		}
		for _, k := range []string{"@message", "@module", "@level", "@timestamp", "@caller"} {
			delete(m, k)
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		args := []any{"module", module}
		for _, k := range keys {
			args = append(args, k, m[k])
		}
		w.log.Log(context.Background(), lvl, msg, args...)
	}
	return len(p), nil
}

// startupElection reports the election a follower starts when it has never
// heard from a leader: every node's first, on every start.
func startupElection(msg string, m map[string]any) bool {
	if msg != "heartbeat timeout reached, starting election" {
		return false
	}
	id, _ := m["last-leader-id"].(string)
	addr, _ := m["last-leader-addr"].(string)
	return id == "" && addr == ""
}

func slogLevel(v any) slog.Level {
	switch v {
	case "trace", "debug":
		return slog.LevelDebug
	case "info":
		return slog.LevelInfo
	case "warn":
		return slog.LevelWarn
	}
	return slog.LevelError
}
