// Package codecfuzz holds the fuzz body the secure-aggregation codecs
// share: no decoder panics on any input, and whatever a decoder accepts
// marshals back to exactly the bytes it was given (a message has one
// encoding, so a digest or signature over it means one thing). Tests only.
package codecfuzz

import (
	"bytes"
	"testing"
)

// Message is a decoded message that can be encoded again.
type Message interface{ Marshal() ([]byte, error) }

// Parser is the decoder of one message kind.
type Parser struct {
	Name  string
	Parse func([]byte) (Message, error)
}

// RoundTrip runs f's fuzz target: the first byte of an input picks one of
// parsers, which is handed the rest; what it accepts must marshal back to
// the same bytes. Seeds are the caller's, in the same form.
func RoundTrip(f *testing.F, parsers []Parser) {
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		p := parsers[int(in[0])%len(parsers)]
		b := in[1:]
		m, err := p.Parse(b)
		if err != nil {
			return
		}
		again, err := m.Marshal()
		if err != nil {
			t.Fatalf("%s: accepted message does not marshal: %v", p.Name, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("%s: parse then marshal changed\n%x\ninto\n%x", p.Name, b, again)
		}
	})
}
