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

// resultWire is the canonical CBOR of a round's result, as GET result
// serves it.
type resultWire struct {
	Round string `cbor:"round"`
	// Sum holds each coordinate as a little-endian IEEE 754 float64.
	Sum          []byte   `cbor:"sum"`
	Weight       float64  `cbor:"weight"`
	Contributors []string `cbor:"contributors"`
	Dropped      []string `cbor:"dropped"`
	ErrorBound   float64  `cbor:"error_bound"`
}

// resultJSON is the same for people (Accept: application/json).
type resultJSON struct {
	Round        string    `json:"round"`
	Sum          []float64 `json:"sum"`
	Weight       float64   `json:"weight"`
	Contributors []string  `json:"contributors"`
	Dropped      []string  `json:"dropped"`
	ErrorBound   float64   `json:"error_bound"`
}

func resultJSONOf(r *secagg.Result) resultJSON {
	return resultJSON{Round: r.Round, Sum: r.Sum, Weight: r.Weight, Contributors: r.Contributors, Dropped: r.Dropped, ErrorBound: r.ErrorBound}
}

func encodeResult(r *secagg.Result) ([]byte, error) {
	sum := make([]byte, 8*len(r.Sum))
	for i, v := range r.Sum {
		binary.LittleEndian.PutUint64(sum[8*i:], math.Float64bits(v))
	}
	return content.Encode(resultWire{Round: r.Round, Sum: sum, Weight: r.Weight, Contributors: r.Contributors, Dropped: r.Dropped, ErrorBound: r.ErrorBound})
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
