package content

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrNotCanonical is returned (wrapped) by Decode and CheckCanonical for bytes
// that are well-formed CBOR but not the canonical encoding of their value.
var ErrNotCanonical = errors.New("content: not canonical CBOR")

// maxCanonicalDepth bounds nesting; it matches the decoder's MaxNestedLevels.
const maxCanonicalDepth = 64

// CheckCanonical reports whether b is exactly one data item in the canonical
// subset this package encodes (RFC 8949 §4.2.1 core deterministic encoding,
// restricted to the types content uses):
//
//   - integers and lengths in their shortest form, definite lengths only;
//   - map keys that are integers or text, in strictly increasing bytewise
//     order of their encodings (which also rules out duplicates);
//   - floats in the shortest width that keeps their value, NaN as f9 7e00;
//   - simple values false, true and null only;
//   - no tags at all: bignums (tags 2 and 3), times, and every other tag
//     decode to values whose canonical encoding is different bytes, so a
//     hash of the input would not be the hash of the value.
//
// Decode calls it first, so two different byte strings never decode to the
// same value.
func CheckCanonical(b []byte) error {
	end, err := checkItem(b, 0, 0)
	if err != nil {
		return err
	}
	if end != len(b) {
		return fmt.Errorf("%w: %d extra bytes after the data item", ErrNotCanonical, len(b)-end)
	}
	return nil
}

// checkHead reads the head at b[off] and returns the major type, the argument,
// the offset just after the head, and an error for reserved, indefinite or
// non-shortest heads.
func checkHead(b []byte, off int) (major byte, arg uint64, next int, err error) {
	if off >= len(b) {
		return 0, 0, 0, fmt.Errorf("%w: truncated at byte %d", ErrNotCanonical, off)
	}
	ib := b[off]
	major, ai := ib>>5, ib&0x1f
	off++
	switch {
	case ai < 24:
		return major, uint64(ai), off, nil
	case ai <= 27:
		n := 1 << (ai - 24)
		if len(b)-off < n {
			return 0, 0, 0, fmt.Errorf("%w: truncated at byte %d", ErrNotCanonical, off)
		}
		switch n {
		case 1:
			arg = uint64(b[off])
		case 2:
			arg = uint64(binary.BigEndian.Uint16(b[off:]))
		case 4:
			arg = uint64(binary.BigEndian.Uint32(b[off:]))
		default:
			arg = binary.BigEndian.Uint64(b[off:])
		}
		// Floats (major 7, ai 25–27) carry bits, not an argument: their
		// width is checked by value in checkItem.
		if major != 7 {
			var min uint64
			switch n {
			case 1:
				min = 24
			case 2:
				min = 1 << 8
			case 4:
				min = 1 << 16
			default:
				min = 1 << 32
			}
			if arg < min {
				return 0, 0, 0, fmt.Errorf("%w: argument at byte %d not in its shortest form", ErrNotCanonical, off-1)
			}
		}
		return major, arg, off + n, nil
	case ai == 31:
		return 0, 0, 0, fmt.Errorf("%w: indefinite length or break at byte %d", ErrNotCanonical, off-1)
	default:
		return 0, 0, 0, fmt.Errorf("%w: reserved additional information at byte %d", ErrNotCanonical, off-1)
	}
}

func checkItem(b []byte, off, depth int) (int, error) {
	if depth > maxCanonicalDepth {
		return 0, fmt.Errorf("%w: nested deeper than %d", ErrNotCanonical, maxCanonicalDepth)
	}
	start := off
	major, arg, off, err := checkHead(b, off)
	if err != nil {
		return 0, err
	}
	rest := uint64(len(b) - off)
	switch major {
	case 0, 1:
		return off, nil
	case 2, 3:
		if arg > rest {
			return 0, fmt.Errorf("%w: string at byte %d runs past the end", ErrNotCanonical, start)
		}
		return off + int(arg), nil
	case 4:
		if arg > rest {
			return 0, fmt.Errorf("%w: array at byte %d longer than the input", ErrNotCanonical, start)
		}
		for i := uint64(0); i < arg; i++ {
			if off, err = checkItem(b, off, depth+1); err != nil {
				return 0, err
			}
		}
		return off, nil
	case 5:
		if arg > rest/2 {
			return 0, fmt.Errorf("%w: map at byte %d longer than the input", ErrNotCanonical, start)
		}
		var prev []byte
		for i := uint64(0); i < arg; i++ {
			keyStart := off
			// Keys are integers or text: a decoder reads a null, bool,
			// float, byte-string or composite key into a string-keyed map
			// as some other key, which re-encodes differently.
			if keyStart < len(b) {
				if mt := b[keyStart] >> 5; mt != 0 && mt != 1 && mt != 3 {
					return 0, fmt.Errorf("%w: map key at byte %d is not an integer or text", ErrNotCanonical, keyStart)
				}
			}
			if off, err = checkItem(b, off, depth+1); err != nil {
				return 0, err
			}
			key := b[keyStart:off]
			if i > 0 && bytes.Compare(prev, key) >= 0 {
				return 0, fmt.Errorf("%w: map key at byte %d out of order or repeated", ErrNotCanonical, keyStart)
			}
			prev = key
			if off, err = checkItem(b, off, depth+1); err != nil {
				return 0, err
			}
		}
		return off, nil
	case 6:
		return 0, fmt.Errorf("%w: tag %d at byte %d (tags, bignums included, are outside the canonical subset)", ErrNotCanonical, arg, start)
	default: // 7
		ai := b[start] & 0x1f
		switch {
		case ai >= 20 && ai <= 22: // false, true, null
			return off, nil
		case ai >= 25 && ai <= 27:
			if !shortestFloat(ai, arg) {
				return 0, fmt.Errorf("%w: float at byte %d not in its shortest form", ErrNotCanonical, start)
			}
			return off, nil
		default:
			return 0, fmt.Errorf("%w: simple value %d at byte %d", ErrNotCanonical, arg, start)
		}
	}
}

// shortestFloat reports whether a float head of width ai (25: half, 26:
// single, 27: double) holding bits arg is what the encoder writes for its
// value: the shortest width that keeps the value exactly, NaN as the half
// 0x7e00 (infinities fit a half).
func shortestFloat(ai byte, arg uint64) bool {
	switch ai {
	case 25:
		h := uint16(arg)
		return h&0x7c00 != 0x7c00 || h&0x03ff == 0 || h == 0x7e00
	case 26:
		f := float64(math.Float32frombits(uint32(arg)))
		return !math.IsNaN(f) && !fitsHalf(f)
	default:
		f := math.Float64frombits(arg)
		return !math.IsNaN(f) && float64(float32(f)) != f
	}
}

// fitsHalf reports whether the finite or infinite f is exactly an IEEE 754
// half: zero or infinity, a subnormal m·2⁻²⁴ (m < 1024), or a normal with an
// 11-bit significand and magnitude at most 65504.
func fitsHalf(f float64) bool {
	a := math.Abs(f)
	switch {
	case a == 0 || math.IsInf(a, 0):
		return true
	case a > 65504:
		return false
	case a < 1.0/(1<<14):
		m := a * (1 << 24)
		return m == math.Floor(m)
	}
	frac, _ := math.Frexp(a)
	m := frac * (1 << 11)
	return m == math.Floor(m)
}
