package he

import (
	"testing"

	"github.com/scellis/scellis/internal/codecfuzz"
)

// parsers are the decoders of the bytes a threshold-he host or site is
// sent, each with the marshal that must give the same bytes back.
var parsers = []codecfuzz.Parser{
	{Name: "advert", Parse: func(b []byte) (codecfuzz.Message, error) { return ParseAdvert(b) }},
	{Name: "key set", Parse: func(b []byte) (codecfuzz.Message, error) { return ParseKeySet(b) }},
	{Name: "shares", Parse: func(b []byte) (codecfuzz.Message, error) { return ParseShares(b) }},
	{Name: "delivery", Parse: func(b []byte) (codecfuzz.Message, error) { return ParseDelivery(b) }},
	{Name: "ciphertext", Parse: func(b []byte) (codecfuzz.Message, error) { return ParseCiphertext(b) }},
	{Name: "decrypt request", Parse: func(b []byte) (codecfuzz.Message, error) { return ParseDecryptRequest(b) }},
	{Name: "decrypt share", Parse: func(b []byte) (codecfuzz.Message, error) { return ParseDecryptShare(b) }},
}

// FuzzParse: no decoder panics on any input, and whatever a decoder
// accepts marshals back to exactly the bytes it was given (a message has
// one encoding, so a digest or signature over it means one thing). The
// seeds are real adverts and a key set of a three-site round, and each
// other message with short polynomials (the codec does not look inside
// them; the state machines do); the test fails if a kind has no seed.
func FuzzParse(f *testing.F) {
	p, keys := testRound(f, 3, 16, 1<<20)
	ks := &KeySet{Round: p.Round}
	for i, m := range p.Members {
		c, err := NewParty(p, m.ID, keys[i])
		if err != nil {
			f.Fatal(err)
		}
		a, err := c.Advertise()
		if err != nil {
			f.Fatal(err)
		}
		ks.Adverts = append(ks.Adverts, *a)
	}
	poly := []byte{0, 1, 2, 3, 4, 5, 6, 7}
	seeds := []interface{ Marshal() ([]byte, error) }{
		&ks.Adverts[0],
		ks,
		&Shares{Round: p.Round, From: "site-00", Boxes: []Box{{To: "site-01", Sealed: poly}, {To: "site-02", Sealed: poly}}},
		&Delivery{Round: p.Round, To: "site-00", From: []Dealt{{From: "site-00"}, {From: "site-01", Box: poly}}},
		&Ciphertext{Round: p.Round, From: "site-00", C0: [][]byte{poly}},
		&DecryptRequest{Round: p.Round, Attempt: 1, Contributors: []string{"site-00", "site-01", "site-02"}, Decryptors: []string{"site-00", "site-01"}},
		&DecryptShare{Round: p.Round, From: "site-00", Attempt: 1, Shares: [][]byte{poly}},
	}
	if len(seeds) != len(parsers) {
		f.Fatalf("%d seeds for %d parsers", len(seeds), len(parsers))
	}
	for i, m := range seeds {
		b, err := m.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		if _, err := parsers[i].Parse(b); err != nil {
			f.Fatalf("the %s seed does not parse: %v", parsers[i].Name, err)
		}
		f.Add(append([]byte{byte(i)}, b...))
	}
	codecfuzz.RoundTrip(f, parsers)
}
