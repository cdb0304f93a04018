package wire

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg"
)

// resultMeta is what a round's result says besides its round and sum, in
// either encoding.
type resultMeta struct {
	Weight       float64  `cbor:"weight" json:"weight"`
	Contributors []string `cbor:"contributors" json:"contributors"`
	Dropped      []string `cbor:"dropped" json:"dropped"`
	ErrorBound   float64  `cbor:"error_bound" json:"error_bound"`
}

// resultWire is the canonical CBOR of a round's result, as GET result
// serves it.
type resultWire struct {
	Round string `cbor:"round"`
	// Sum holds each coordinate as a little-endian IEEE 754 float64.
	Sum []byte `cbor:"sum"`
	resultMeta
}

// resultJSON is the same for people (Accept: application/json).
type resultJSON struct {
	Round string    `json:"round"`
	Sum   []float64 `json:"sum"`
	resultMeta
}

func metaOf(r *secagg.Result) resultMeta {
	return resultMeta{Weight: r.Weight, Contributors: r.Contributors, Dropped: r.Dropped, ErrorBound: r.ErrorBound}
}

func resultJSONOf(r *secagg.Result) resultJSON { return resultJSON{r.Round, r.Sum, metaOf(r)} }

func encodeResult(r *secagg.Result) ([]byte, error) {
	sum := make([]byte, 8*len(r.Sum))
	for i, v := range r.Sum {
		binary.LittleEndian.PutUint64(sum[8*i:], math.Float64bits(v))
	}
	return content.Encode(resultWire{r.Round, sum, metaOf(r)})
}

// parseResult parses the canonical encoding of a result, refusing any
// other encoding, so that parsing then encoding gives back b.
func parseResult(b []byte) (*secagg.Result, error) {
	bad := func(format string, args ...any) (*secagg.Result, error) {
		return nil, diag.New(diag.SecAggMalformed, "secure aggregation result", format, args...).
			WithHelp("the aggregator runs an incompatible version")
	}
	var w resultWire
	if err := content.Decode(b, &w); err != nil {
		return bad("cannot decode: %v", err)
	}
	if again, err := content.Encode(w); err != nil || !bytes.Equal(again, b) {
		return bad("not in canonical encoding")
	}
	if w.Round == "" || !utf8.ValidString(w.Round) || len(w.Sum)%8 != 0 || len(w.Sum) == 0 {
		return bad("missing round or a sum that is not whole float64 values")
	}
	for _, id := range slices.Concat(w.Contributors, w.Dropped) {
		if id == "" || len(id) > secagg.MaxIDLength || !utf8.ValidString(id) {
			return bad("invalid site ID %q", id)
		}
	}
	r := &secagg.Result{Round: w.Round, Sum: make([]float64, len(w.Sum)/8), Weight: w.Weight,
		Contributors: w.Contributors, Dropped: w.Dropped, ErrorBound: w.ErrorBound}
	for i := range r.Sum {
		r.Sum[i] = math.Float64frombits(binary.LittleEndian.Uint64(w.Sum[8*i:]))
	}
	return r, nil
}
