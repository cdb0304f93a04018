package job

import (
	"testing"

	"github.com/scellis/scellis/content"
)

// FuzzDecodeBundle: a bundle the decoder accepts names only well-formed
// refs (law 14), so no ref in it can become a path outside a cache folder.
func FuzzDecodeBundle(f *testing.F) {
	good := content.Hash([]byte("x"))
	for _, in := range []string{string(good), "sha256:../../../../secret", "sha256:" + string(make([]byte, 64))} {
		b, _ := content.Encode(map[string]any{
			"format": bundleFormat, "name": "n", "program": string(good),
			"content": map[string]any{"p": string(good)},
			"inputs":  map[string]any{"data": map[string]any{"ref": in, "label": "y", "class": "open"}},
		})
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var b Bundle
		if content.Decode(raw, &b) != nil {
			return
		}
		ok := func(r content.Ref) bool { return r == "" || content.IsRef(string(r)) }
		if !ok(b.Program) || !ok(b.Partitioner.Ref) || !ok(b.Reducer.Ref) {
			t.Fatalf("accepted a malformed content ref: %+v", b)
		}
		for _, r := range b.Content {
			if !ok(r) {
				t.Fatalf("accepted a malformed content ref %q", r)
			}
		}
		for _, in := range b.Inputs {
			if !ok(in.Ref) {
				t.Fatalf("accepted a malformed input ref %q", in.Ref)
			}
		}
	})
}
