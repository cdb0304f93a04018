// Package browsertest finds and starts the headless browser that the
// browser tests drive (the Studio's in cmd/scellis, the WebAssembly
// worker's in cmd/scellis-wasm), so they share one way of doing it.
package browsertest

import (
	"context"
	"os/exec"
	"testing"

	"github.com/chromedp/chromedp"
)

// Chromium finds Debian's chromium (or another Chrome); "" when none is
// installed.
func Chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Start starts a headless browser and returns its first tab; the browser
// is stopped when the test ends. It skips the test when no browser is
// installed (CI installs chromium: see .ci/run).
func Start(t testing.TB, opts ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	chrome := Chromium()
	if chrome == "" {
		t.Skip("no chromium on this machine: apt-get install -y chromium (.ci/run installs it) to run the browser tests")
	}
	all := append([]chromedp.ExecAllocatorOption{chromedp.ExecPath(chrome), chromedp.Headless, chromedp.NoSandbox,
		chromedp.Flag("ignore-certificate-errors", true), chromedp.Flag("disable-gpu", true)}, opts...)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), all...)
	t.Cleanup(cancelAlloc)
	tab, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(cancelTab)
	return tab
}
