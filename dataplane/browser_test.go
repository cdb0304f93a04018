package dataplane

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/internal/browsertest"
)

// lyingStore serves other bytes than the ref names: a peer with a
// corrupt disk, or one that lies.
type lyingStore struct{ *blob.Store }

func (s lyingStore) Get(ref content.Ref) ([]byte, error) {
	b, err := s.Store.Get(ref)
	if err != nil {
		return nil, err
	}
	b = bytes.Clone(b)
	b[len(b)/2] ^= 1
	return b, nil
}

// TestBrowserChecksHashes: a tab (headless Chromium, the embedded
// module) that is sent bytes over a data channel that do not hash to the
// ref it asked for does not hand them over; it drops the channel and
// fetches the blob over HTTPS, which here serves the true bytes. The
// aggregator-side tests (aggregator TestBrowserDataPlane) cover the
// honest paths.
func TestBrowserChecksHashes(t *testing.T) {
	if testing.Short() {
		t.Skip("drives a browser")
	}
	fed, ids := testFed(t)
	tp := startPeer(t, fed, ids, &Mailbox{}, "agg-1", func(c *Config) { c.Store = lyingStore{c.Store.(*blob.Store)} })
	want := randomBlob(t, 150_000)
	ref, err := tp.store.PutBytes(want)
	if err != nil {
		t.Fatal(err)
	}
	h := tp.BrowserHandler(BrowserAuth{
		Check: func(r *http.Request) (string, error) { return "v1", nil },
		May:   func(string, string, content.Ref) error { return nil },
	}, tp.store, nil)
	mux := http.NewServeMux()
	mux.Handle(BrowserPrefix, h)
	mux.Handle("/blobs/", h)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<!doctype html><title>tab</title>")) })
	srv := httptest.NewTLSServer(mux)
	defer srv.Close()

	tab := browsertest.Start(t, chromedp.Flag("allow-loopback-in-peer-connection", true))
	if _, err := chromedp.Run(tab, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	type out struct {
		Hash, Path, LastError string
		Fallbacks             int
	}
	got, err := chromedp.Run(tab, chromedp.Evaluate[out](`(async () => {
  const m = await import("/p2p/browser/dataplane.js");
  const dp = m.createDataPlane({ token: "t", connectTimeoutMs: 60000 });
  const b = await dp.getBlob("`+string(ref)+`");
  const o = { Hash: await m.hashRef(b), Path: dp.path, LastError: dp.lastError, Fallbacks: dp.stats.fallbacks };
  dp.close();
  return o;
})()`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", got)
	if got.Hash != string(ref) || got.Path != PathHTTPS || got.Fallbacks != 1 || !bytes.Contains([]byte(got.LastError), []byte("hash to")) {
		t.Errorf("the tab: %+v; want the true bytes over https after the data channel's bytes failed their hash", got)
	}
}
