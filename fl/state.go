package fl

import (
	"fmt"

	"github.com/scellis/scellis/content"
)

// Global is a strategy's global state: a dict of plain values (None, bools,
// ints, floats, strings, lists, dicts with string keys) and vectors
// ([]float64), as init and server_step return it — for the built-ins
// {"w": parameters, "round": n, …}. Its canonical encoding (content.Encode)
// is what moves between peers and its hash is the model hash.
type Global map[string]any

// Encode returns the canonical bytes of g.
func (g Global) Encode() ([]byte, error) {
	b, err := content.Encode(map[string]any(g))
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
func DecodeGlobal(b []byte) (Global, error) {
	var m map[string]any
	if err := content.Decode(b, &m); err != nil {
		return nil, fmt.Errorf("fl: decoding the global state: %w", err)
	}
	if m == nil {
		return nil, fmt.Errorf("fl: the global state is not a dict")
	}
	return Global(normalize(m).(map[string]any)), nil
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
	}
	return 0, false
}
