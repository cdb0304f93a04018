package blob

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/scellis/scellis/content"
)

// POST /blobs/batch stores every blob under its own hash (durably, as a
// PUT) and answers the refs in order; an empty, oversized or malformed
// batch is refused whole and stores nothing.
func TestBatchUpload(t *testing.T) {
	s, err := Open(t.TempDir(), 64)
	if err != nil {
		t.Fatal(err)
	}
	h := Handler(s, func(http.ResponseWriter, *http.Request) bool { return true })
	post := func(body []byte) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/blobs/batch", bytes.NewReader(body)))
		return w
	}
	enc := func(bs ...[]byte) []byte {
		b, err := content.Encode(bs)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	w := post(enc([]byte("one"), []byte("two"), []byte("one")))
	if w.Code != http.StatusCreated {
		t.Fatalf("a good batch: %d %s", w.Code, w.Body)
	}
	var got BatchStored
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	for i, b := range [][]byte{[]byte("one"), []byte("two"), []byte("one")} {
		if got.Refs[i] != content.Hash(b) {
			t.Errorf("ref %d: %s, want %s", i, got.Refs[i], content.Hash(b))
		}
		if stored, err := s.Get(content.Hash(b)); err != nil || !bytes.Equal(stored, b) {
			t.Errorf("blob %d not stored: %q %v", i, stored, err)
		}
	}
	many := make([][]byte, MaxBatch+1)
	for i := range many {
		many[i] = []byte{byte(i)}
	}
	for name, body := range map[string][]byte{
		"empty":         enc(),
		"too many":      enc(many...),
		"too large":     enc(bytes.Repeat([]byte("a"), 40), bytes.Repeat([]byte("b"), 40)),
		"not CBOR":      []byte("{}"),
		"not canonical": append(enc([]byte("x")), 0),
	} {
		w := post(body)
		if w.Code != http.StatusBadRequest && w.Code != http.StatusRequestEntityTooLarge {
			t.Errorf("%s batch: %d %s; want refused", name, w.Code, w.Body)
		}
		if !bytes.Contains(w.Body.Bytes(), []byte("SC")) {
			t.Errorf("%s batch: no diagnostic: %s", name, w.Body)
		}
	}
	if s.Has(content.Hash(bytes.Repeat([]byte("a"), 40))) {
		t.Error("a refused batch stored a blob")
	}
}
