package trainer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// The .npy format (numpy's, version 1.0): the magic "\x93NUMPY", two
// version bytes, a little-endian uint16 header length, a Python dict
// literal header padded with spaces to a multiple of 64 bytes, then the
// raw data. Only what the trainer protocol uses is read: little-endian
// float32 or float64 in C order, any shape (returned flat).

var npyMagic = []byte("\x93NUMPY")

// MaxNPY bounds an .npy file the silo reads (2^27 float64 values, the
// largest update a round sums).
const MaxNPY = 8<<27 + 4096

// EncodeNPY returns v as a 1-D little-endian float64 .npy file.
func EncodeNPY(v []float64) []byte {
	header := fmt.Sprintf("{'descr': '<f8', 'fortran_order': False, 'shape': (%d,), }", len(v))
	// magic(6) + version(2) + len(2) + header + '\n', padded to 64.
	pad := 64 - (10+len(header)+1)%64
	if pad == 64 {
		pad = 0
	}
	header += strings.Repeat(" ", pad) + "\n"
	var b bytes.Buffer
	b.Write(npyMagic)
	b.Write([]byte{1, 0})
	binary.Write(&b, binary.LittleEndian, uint16(len(header)))
	b.WriteString(header)
	buf := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(buf[8*i:], math.Float64bits(x))
	}
	b.Write(buf)
	return b.Bytes()
}

var (
	npyDescr = regexp.MustCompile(`'descr':\s*'([^']*)'`)
	npyOrder = regexp.MustCompile(`'fortran_order':\s*(True|False)`)
	npyShape = regexp.MustCompile(`'shape':\s*\(([^)]*)\)`)
)

// DecodeNPY reads a float32 or float64 little-endian .npy file and returns
// its values flat (C order) and its shape.
func DecodeNPY(b []byte) ([]float64, []int, error) {
	if len(b) < 10 || !bytes.Equal(b[:6], npyMagic) {
		return nil, nil, fmt.Errorf("not an .npy file (no \\x93NUMPY magic)")
	}
	var hlen, off int
	switch b[6] {
	case 1:
		hlen, off = int(binary.LittleEndian.Uint16(b[8:10])), 10
	case 2, 3:
		if len(b) < 12 {
			return nil, nil, fmt.Errorf("truncated .npy header")
		}
		hlen, off = int(binary.LittleEndian.Uint32(b[8:12])), 12
	default:
		return nil, nil, fmt.Errorf(".npy version %d.%d is not supported", b[6], b[7])
	}
	if hlen > 1<<16 || off+hlen > len(b) {
		return nil, nil, fmt.Errorf("truncated .npy header")
	}
	header := string(b[off : off+hlen])
	data := b[off+hlen:]
	d, o, s := npyDescr.FindStringSubmatch(header), npyOrder.FindStringSubmatch(header), npyShape.FindStringSubmatch(header)
	if d == nil || o == nil || s == nil {
		return nil, nil, fmt.Errorf("malformed .npy header %q", header)
	}
	if o[1] != "False" {
		return nil, nil, fmt.Errorf(".npy in Fortran order; save a C-order array (np.ascontiguousarray)")
	}
	var shape []int
	n := 1
	for _, f := range strings.Split(s[1], ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		k, err := strconv.Atoi(f)
		if err != nil || k < 0 || k > 1<<27 {
			return nil, nil, fmt.Errorf("bad .npy shape %q", s[1])
		}
		shape = append(shape, k)
		n *= k
		if n > 1<<27 {
			return nil, nil, fmt.Errorf(".npy of more than %d values", 1<<27)
		}
	}
	var size int
	switch d[1] {
	case "<f8", "=f8":
		size = 8
	case "<f4", "=f4":
		size = 4
	default:
		return nil, nil, fmt.Errorf(".npy of dtype %s; save float32 or float64 (little-endian)", d[1])
	}
	if len(data) != n*size {
		return nil, nil, fmt.Errorf(".npy holds %d bytes of data for %d values of %d bytes", len(data), n, size)
	}
	out := make([]float64, n)
	for i := range out {
		if size == 8 {
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(data[8*i:]))
		} else {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:])))
		}
	}
	return out, shape, nil
}
