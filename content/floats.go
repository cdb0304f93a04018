package content

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
)

// EncodeStringMap returns the canonical encoding of m, the bytes Encode
// gives, but writes every value that is a non-empty []float64 without NaN
// (a model's parameters) itself, into one buffer of the exact size: Encode
// grows its buffer by appending and then copies it out, which at 10^6
// parameters and more held up to three times the encoding at once
// (issue 32). Other values go through Encode. TestEncodeStringMapAgrees
// holds the two to the same bytes.
func EncodeStringMap(m map[string]any) ([]byte, error) {
	if m == nil {
		return Encode(m)
	}
	type entry struct {
		key, val []byte
		vec      []float64 // written here when set, else val
	}
	entries := make([]entry, 0, len(m))
	size := headLen(uint64(len(m)))
	for k, v := range m {
		key, err := Encode(k)
		if err != nil {
			return nil, err
		}
		e := entry{key: key}
		if vec, ok := v.([]float64); ok && len(vec) > 0 && !slices.ContainsFunc(vec, math.IsNaN) {
			e.vec = vec
			size += len(key) + floatArrayLen(vec)
		} else {
			if e.val, err = Encode(v); err != nil {
				return nil, err
			}
			size += len(key) + len(e.val)
		}
		entries = append(entries, e)
	}
	// Core deterministic order: keys by their encodings, bytewise.
	slices.SortFunc(entries, func(a, b entry) int { return bytes.Compare(a.key, b.key) })
	out := appendHead(make([]byte, 0, size), 5, uint64(len(m)))
	for _, e := range entries {
		out = append(out, e.key...)
		if e.vec != nil {
			out = appendFloatArray(out, e.vec)
		} else {
			out = append(out, e.val...)
		}
	}
	return out, nil
}

// headLen is the length of a head whose argument is n, in shortest form.
func headLen(n uint64) int {
	switch {
	case n < 24:
		return 1
	case n <= math.MaxUint8:
		return 2
	case n <= math.MaxUint16:
		return 3
	case n <= math.MaxUint32:
		return 5
	}
	return 9
}

// appendHead appends the shortest head of major type major with argument n.
func appendHead(dst []byte, major byte, n uint64) []byte {
	mt := major << 5
	switch headLen(n) {
	case 1:
		return append(dst, mt|byte(n))
	case 2:
		return append(dst, mt|24, byte(n))
	case 3:
		return binary.BigEndian.AppendUint16(append(dst, mt|25), uint16(n))
	case 5:
		return binary.BigEndian.AppendUint32(append(dst, mt|26), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(dst, mt|27), n)
}

// floatArrayLen is the length of the canonical encoding of v (no NaN): each
// float in the shortest width that keeps its value (shortestFloat).
func floatArrayLen(v []float64) int {
	n := headLen(uint64(len(v)))
	for _, f := range v {
		switch {
		case fitsHalf(f):
			n += 3
		case float64(float32(f)) == f:
			n += 5
		default:
			n += 9
		}
	}
	return n
}

// appendFloatArray appends the canonical encoding of v (no NaN).
func appendFloatArray(dst []byte, v []float64) []byte {
	dst = appendHead(dst, 4, uint64(len(v)))
	for _, f := range v {
		switch {
		case fitsHalf(f):
			dst = binary.BigEndian.AppendUint16(append(dst, 0xf9), halfBits(f))
		case float64(float32(f)) == f:
			dst = binary.BigEndian.AppendUint32(append(dst, 0xfa), math.Float32bits(float32(f)))
		default:
			dst = binary.BigEndian.AppendUint64(append(dst, 0xfb), math.Float64bits(f))
		}
	}
	return dst
}

// halfBits is the IEEE 754 half-precision encoding of f, which fitsHalf.
func halfBits(f float64) uint16 {
	var sign uint16
	if math.Signbit(f) {
		sign = 0x8000
	}
	a := math.Abs(f)
	switch {
	case a == 0:
		return sign
	case math.IsInf(a, 0):
		return sign | 0x7c00
	case a < 1.0/(1<<14): // subnormal: m·2⁻²⁴
		return sign | uint16(a*(1<<24))
	}
	frac, exp := math.Frexp(a) // a = frac·2^exp, frac in [0.5, 1)
	return sign | uint16(exp-1+15)<<10 | uint16((frac*2-1)*(1<<10))
}
