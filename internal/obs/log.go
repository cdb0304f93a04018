// Package obs is the observability plumbing every scellis process shares:
// its log/slog logger (text or JSON, a level, repeated lines summarised),
// its own Prometheus registry, and the plain-HTTP server for /metrics.
//
// Invariant: nothing here formats a secret or a raw update; callers pass
// only names, counts, durations and error texts, and the summariser only
// counts lines it has already been given.
package obs

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"regexp"
	"strings"
	"time"
)

// Formats are the values of a config's log_format.
var Formats = []string{"text", "json"}

// Levels are the values of a config's log_level.
var Levels = []string{"off", "error", "warn", "info", "debug", "trace"}

// LogConfig says how a process logs.
type LogConfig struct {
	Format string // text (default) or json
	Level  string // off, error, warn (default), info, debug, trace
	// Window is how long repeated lines are counted before a summary;
	// default one minute.
	Window time.Duration
}

// ParseLevel maps a config's log_level to a slog level; "off" is above
// every record, "trace" is debug. An unknown name is an error.
func ParseLevel(s string) (slog.Level, error) {
	switch s {
	case "", "warn":
		return slog.LevelWarn, nil
	case "off":
		return slog.LevelError + 4, nil
	case "trace", "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q: use %s", s, strings.Join(Levels, ", "))
}

// NewLogger returns the process logger writing to w: text or JSON records
// at c.Level and above, with repeated records summarised (see Summarise).
// Close the Summariser when the process stops logging.
func NewLogger(w io.Writer, c LogConfig) (*slog.Logger, *Summariser, error) {
	level, err := ParseLevel(c.Level)
	if err != nil {
		return nil, nil, err
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch c.Format {
	case "", "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, nil, fmt.Errorf("unknown log format %q: use text or json", c.Format)
	}
	sum := Summarise(h, c.Window)
	return slog.New(sum), sum, nil
}

// handshakeLine is how net/http reports a failed TLS handshake.
var handshakeLine = regexp.MustCompile(`^http: TLS handshake error from (.+):\d+: (.*)$`)

// HTTPErrorLog returns a *log.Logger for http.Server.ErrorLog that sends
// its lines to l. A failed TLS handshake becomes a warning naming the
// remote host and the reason ("tls: bad certificate" is a member whose key
// the federation does not list: operators need to see it, once a minute,
// not twice a second), except a peer that hung up before handshaking (EOF,
// reset: probes, closed clients), which is debug. Everything else net/http
// says is debug.
func HTTPErrorLog(l *slog.Logger) *log.Logger {
	return log.New(httpErrorWriter{l}, "", 0)
}

// httpErrorWriter parses net/http's lines; log.Logger writes one per call.
type httpErrorWriter struct{ l *slog.Logger }

func (w httpErrorWriter) Write(p []byte) (int, error) {
	for line := range strings.Lines(string(p)) {
		line = strings.TrimSpace(line)
		if m := handshakeLine.FindStringSubmatch(line); m != nil {
			reason := m[2]
			if strings.HasSuffix(reason, "EOF") || strings.Contains(reason, "connection reset") {
				w.l.Debug("TLS handshake failed", "from", m[1], "err", reason)
				continue
			}
			w.l.Warn("TLS handshake failed", "from", m[1], "err", reason)
			continue
		}
		w.l.Debug(line)
	}
	return len(p), nil
}

// NewDiscardLogger returns a logger that writes nothing.
func NewDiscardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
