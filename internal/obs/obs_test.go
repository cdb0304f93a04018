package obs

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A bad-certificate handshake failing 120 times from one host is one warning
// and, at the window's end, one summary line with the count; an EOF probe
// stays at debug, under the default level.
func TestHandshakeErrorsSummarised(t *testing.T) {
	var buf bytes.Buffer
	log, sum, err := NewLogger(&buf, LogConfig{Format: "json", Level: "warn", Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	errLog := HTTPErrorLog(log.With("node", "agg-1"))
	for i := range 120 {
		errLog.Printf("http: TLS handshake error from 127.0.0.1:%d: remote error: tls: bad certificate", 40000+i)
	}
	errLog.Printf("http: TLS handshake error from 10.0.0.9:5555: EOF")
	sum.Flush()
	var lines []map[string]any
	for l := range strings.Lines(buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("want the first failure and one summary, got %d lines:\n%s", len(lines), buf.String())
	}
	if lines[0]["msg"] != "TLS handshake failed" || lines[0]["from"] != "127.0.0.1" || lines[0]["level"] != "WARN" || lines[0]["node"] != "agg-1" {
		t.Fatalf("first line: %v", lines[0])
	}
	if lines[1]["msg"] != "TLS handshake failed ×119 in the last 1h0m0s" || lines[1]["err"] != "remote error: tls: bad certificate" || lines[1]["node"] != "agg-1" {
		t.Fatalf("summary line: %v", lines[1])
	}
	// After the summary the record is forgotten: its next occurrence is
	// written in full again.
	buf.Reset()
	errLog.Printf("http: TLS handshake error from 127.0.0.1:1: remote error: tls: bad certificate")
	if !strings.Contains(buf.String(), `"msg":"TLS handshake failed"`) {
		t.Fatalf("a record after the summary was not written: %q", buf.String())
	}
	sum.Close()
}

// Distinct records are never merged: another source or another level is
// another line.
func TestSummariserKeepsDistinctRecords(t *testing.T) {
	var buf bytes.Buffer
	log, sum, err := NewLogger(&buf, LogConfig{Level: "info", Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer sum.Close()
	log.Warn("peer unreachable", "peer", "agg-2")
	log.Warn("peer unreachable", "peer", "agg-3")
	log.Info("peer unreachable", "peer", "agg-2")
	log.Warn("peer unreachable", "peer", "agg-2")
	if n := strings.Count(buf.String(), "\n"); n != 3 {
		t.Fatalf("want 3 lines, got %d:\n%s", n, buf.String())
	}
	sum.Flush()
	if !strings.Contains(buf.String(), `msg="peer unreachable ×1 in the last 1h0m0s" peer=agg-2`) {
		t.Fatalf("no summary of the repeat:\n%s", buf.String())
	}
}

func TestLoggerRefusesUnknownSettings(t *testing.T) {
	if _, _, err := NewLogger(io.Discard, LogConfig{Format: "xml"}); err == nil {
		t.Fatal("log_format xml accepted")
	}
	if _, _, err := NewLogger(io.Discard, LogConfig{Level: "loud"}); err == nil {
		t.Fatal("log_level loud accepted")
	}
	var buf bytes.Buffer
	log, _, _ := NewLogger(&buf, LogConfig{Level: "off"})
	log.Error("nothing")
	if buf.Len() != 0 {
		t.Fatalf("log_level off wrote %q", buf.String())
	}
}

// The byte counters see request and response bodies; two registries in one
// process do not collide.
func TestCountBytesAndRegistries(t *testing.T) {
	r1, r2 := NewRegistry(), NewRegistry()
	in := prometheus.NewCounter(prometheus.CounterOpts{Name: "in_bytes_total", Help: "in"})
	out := prometheus.NewCounter(prometheus.CounterOpts{Name: "out_bytes_total", Help: "out"})
	r1.MustRegister(in, out)
	r2.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "in_bytes_total", Help: "in"}))
	h := CountBytes(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(append(b, b...))
	}), in, out)
	srv, err := Listen("127.0.0.1:0", h, NewDiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	resp, err := http.Post("http://"+srv.Addr+"/", "text/plain", strings.NewReader("12345"))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	mfs, err := r1.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) == 1 && mf.GetMetric()[0].Counter != nil {
			got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if got["in_bytes_total"] != 5 || got["out_bytes_total"] != 10 {
		t.Fatalf("counted %v, want in 5, out 10", got)
	}
}
