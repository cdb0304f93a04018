package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/obs"
)

// progressLog returns the logf of a silo or worker process (nil when
// log_level is off or error: its progress lines are all it says) and a
// function to call when it stops. Lines go through log/slog, so repeated
// ones — a lease refused twice a second with "tls: bad certificate" —
// are summarised once a minute; log_format json writes one JSON object
// per line, text the familiar "15:04:05.000 name: message" lines.
func progressLog(out io.Writer, name, format, level string) (func(string, ...any), func()) {
	var h slog.Handler
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	switch level {
	case "off", "error":
		return nil, func() {}
	case "debug", "trace":
		opts.Level = slog.LevelDebug
	}
	if format == "json" {
		h = slog.NewJSONHandler(out, opts).WithAttrs([]slog.Attr{slog.String("member", name)})
	} else {
		h = &lineHandler{out: out, name: name, level: opts.Level.Level()}
	}
	sum := obs.Summarise(h, 0)
	log := slog.New(sum)
	return func(f string, args ...any) { log.Info(fmt.Sprintf(f, args...)) }, sum.Close
}

// debugLog is the logger of a member's retries and other debug lines:
// nil unless level is debug or trace.
func debugLog(out io.Writer, name, format, level string) *slog.Logger {
	if level != "debug" && level != "trace" {
		return nil
	}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}).WithAttrs([]slog.Attr{slog.String("member", name)}))
	}
	return slog.New(&lineHandler{out: out, name: name, level: slog.LevelDebug})
}

// lineHandler writes "15:04:05.000 name: message key=value…".
type lineHandler struct {
	out   io.Writer
	name  string
	level slog.Level
	mu    sync.Mutex
}

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h *lineHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *lineHandler) WithGroup(string) slog.Handler                { return h }
func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	line := fmt.Sprintf("%s %s: %s", r.Time.Format("15:04:05.000"), h.name, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		line += fmt.Sprintf(" %s=%v", a.Key, a.Value)
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := fmt.Fprintln(h.out, line)
	return err
}

// serveMetrics serves reg at /metrics (and "ok" at /healthz) on addr, the
// process's metrics_listen; "" is off. The returned stop is never nil.
func serveMetrics(addr string, reg *prometheus.Registry) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", obs.Handler(reg))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	srv, err := obs.Listen(addr, mux, obs.NewDiscardLogger())
	if err != nil {
		return nil, diag.New(diag.WorkerConfig, "metrics_listen", "cannot listen on %s: %v", addr, err).
			WithHelp("another process holds the port, or the address is not this machine's")
	}
	return srv.Close, nil
}

// workerMetrics are a worker's series: leases taken and shards by outcome.
func workerMetrics() (*prometheus.Registry, func(string)) {
	reg := obs.NewRegistry()
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scellis_worker_shards_total", Help: "Shard events at this worker: leased, then reported, refused (the coordinator did not accept the report) or released (handed back).",
	}, []string{"event"})
	reg.MustRegister(events)
	for _, e := range []string{"leased", "reported", "refused", "released"} {
		events.WithLabelValues(e) // present at 0 before the first
	}
	started := prometheus.NewGauge(prometheus.GaugeOpts{Name: "scellis_worker_start_time_seconds", Help: "When the worker started (unix seconds)."})
	started.Set(float64(time.Now().Unix()))
	reg.MustRegister(started)
	return reg, func(e string) { events.WithLabelValues(e).Inc() }
}
