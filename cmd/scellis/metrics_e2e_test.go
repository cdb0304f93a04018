package main

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// scrape reads a process's /metrics and returns each sample's value by its
// series as exposed, e.g. `scellis_shards{state="verified"}`; nil when the
// endpoint does not answer (yet).
func scrape(t testing.TB, addr string) map[string]float64 {
	t.Helper()
	return scrapeWith(t, http.DefaultClient, addr)
}

// scrapeWith is scrape through client (one that dials into a network
// namespace, say).
func scrapeWith(t testing.TB, client *http.Client, addr string) map[string]float64 {
	t.Helper()
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("/metrics line %q is not a sample", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}
