package fl

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/fxamacker/cbor/v2"

	"github.com/scellis/scellis/content"
)

// Global is a strategy's global state: a dict of plain values (None, bools,
// ints, floats, strings, lists, dicts with string keys) and vectors
// ([]float64), as init and server_step return it — for the built-ins
// {"w": parameters, "round": n, …}. Its canonical encoding (content.Encode)
// is what moves between peers and its hash is the model hash.
type Global map[string]any

// Encode returns the canonical bytes of g, written into one buffer of
// their exact size (content.EncodeStringMap: the model's parameters are
// most of them).
func (g Global) Encode() ([]byte, error) {
	b, err := content.EncodeStringMap(map[string]any(g))
	if err != nil {
		return nil, fmt.Errorf("fl: encoding the global state: %w", err)
	}
	return b, nil
}

// Hash returns the model hash: the content ref of g's canonical encoding.
func (g Global) Hash() (content.Ref, error) {
	b, err := g.Encode()
	if err != nil {
		return "", err
	}
	return content.Hash(b), nil
}

// Vector returns g[key] as a vector, if it is one.
func (g Global) Vector(key string) ([]float64, bool) {
	v, ok := asVector(g[key])
	return v, ok
}

// DecodeGlobal parses canonical bytes back into a Global. Lists of floats
// become vectors again, so content sees what it returned. Re-encoding the
// result gives the same bytes.
//
// A value that is a list of floats (a model's parameters: 10^6 of them and
// more) is read straight into its vector (floatArray) rather than through
// one interface value per element, which made decoding a large model cost
// more than the round's masking (issue 19); every other value is decoded
// as before. Both give the same Global (TestDecodeGlobalFastPath).
func DecodeGlobal(b []byte) (Global, error) {
	var raw map[string]cbor.RawMessage
	if err := content.Decode(b, &raw); err != nil {
		return nil, fmt.Errorf("fl: decoding the global state: %w", err)
	}
	if raw == nil {
		return nil, fmt.Errorf("fl: the global state is not a dict")
	}
	m := make(map[string]any, len(raw))
	for k, item := range raw {
		if vec, ok := floatArray(item); ok {
			m[k] = vec
			continue
		}
		var v any
		if err := content.Decode(item, &v); err != nil {
			return nil, fmt.Errorf("fl: decoding the global state: %w", err)
		}
		m[k] = normalize(v)
	}
	return Global(m), nil
}

// floatArray reads a CBOR item that is a non-empty definite-length array
// of floats (half, single or double precision, none of them NaN) into a
// vector, exactly as decoding it generically and then normalize would; ok
// is false for anything else (the caller decodes it generically).
func floatArray(item []byte) (out []float64, ok bool) {
	if len(item) == 0 || item[0]>>5 != 4 {
		return nil, false
	}
	n, p := uint64(item[0]&0x1f), 1
	switch {
	case n < 24:
	case n <= 27:
		w := 1 << (n - 24) // 1, 2, 4 or 8 bytes of length
		if len(item) < 1+w {
			return nil, false
		}
		n = 0
		for _, c := range item[1 : 1+w] {
			n = n<<8 | uint64(c)
		}
		p += w
	default:
		return nil, false // indefinite length: not canonical anyway
	}
	// Each element takes at least 3 bytes (a half float).
	if n == 0 || n > uint64(len(item)-p)/3 {
		return nil, false
	}
	out = make([]float64, n)
	for i := range out {
		if p >= len(item) {
			return nil, false
		}
		var f float64
		switch item[p] {
		case 0xf9:
			if len(item) < p+3 {
				return nil, false
			}
			f = halfFloat(binary.BigEndian.Uint16(item[p+1:]))
			p += 3
		case 0xfa:
			if len(item) < p+5 {
				return nil, false
			}
			f = float64(math.Float32frombits(binary.BigEndian.Uint32(item[p+1:])))
			p += 5
		case 0xfb:
			if len(item) < p+9 {
				return nil, false
			}
			f = math.Float64frombits(binary.BigEndian.Uint64(item[p+1:]))
			p += 9
		default:
			return nil, false
		}
		if math.IsNaN(f) {
			return nil, false // NaN payloads: left to the generic decoder
		}
		out[i] = f
	}
	if p != len(item) {
		return nil, false
	}
	return out, true
}

// halfFloat converts an IEEE 754 half-precision value (not a NaN) exactly.
func halfFloat(h uint16) float64 {
	exp, frac := int(h>>10&0x1f), float64(h&0x3ff)
	var f float64
	switch exp {
	case 0:
		f = math.Ldexp(frac, -24) // subnormal (or zero)
	case 0x1f:
		if frac != 0 {
			return math.NaN()
		}
		f = math.Inf(1)
	default:
		f = math.Ldexp(frac+1024, exp-25)
	}
	if h&0x8000 != 0 {
		f = -f
	}
	return f
}

// EncodeState returns the canonical bytes of a client state (what a silo
// persists between rounds); a nil state encodes as CBOR null.
func EncodeState(state map[string]any) ([]byte, error) {
	if state == nil {
		return content.Encode(nil)
	}
	b, err := content.Encode(state)
	if err != nil {
		return nil, fmt.Errorf("fl: encoding the client state: %w", err)
	}
	return b, nil
}

// DecodeState parses what EncodeState wrote. Empty input and CBOR null are
// no state (nil).
func DecodeState(b []byte) (map[string]any, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var v any
	if err := content.Decode(b, &v); err != nil {
		return nil, fmt.Errorf("fl: decoding the client state: %w", err)
	}
	if v == nil {
		return nil, nil
	}
	m, ok := normalize(v).(map[string]any)
	if !ok {
		return nil, fmt.Errorf("fl: the client state is a %T, not a dict", v)
	}
	return m, nil
}

// normalize turns decoded lists whose elements are all floats into
// []float64, recursively, so vectors survive a round trip.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
		return x
	case []any:
		if vec, ok := floatList(x); ok {
			return vec
		}
		for i, e := range x {
			x[i] = normalize(e)
		}
		return x
	}
	return v
}

func floatList(l []any) ([]float64, bool) {
	if len(l) == 0 {
		return nil, false
	}
	out := make([]float64, len(l))
	for i, e := range l {
		f, ok := e.(float64)
		if !ok {
			return nil, false
		}
		out[i] = f
	}
	return out, true
}

// asVector accepts a vector or a list of numbers.
func asVector(v any) ([]float64, bool) {
	switch x := v.(type) {
	case []float64:
		return x, true
	case []any:
		out := make([]float64, len(x))
		for i, e := range x {
			f, ok := asNumber(e)
			if !ok {
				return nil, false
			}
			out[i] = f
		}
		return out, true
	}
	return nil, false
}

func asNumber(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	case int:
		return float64(x), true
	}
	return 0, false
}
