package secagg

import (
	"bytes"
	"slices"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/internal/codecfuzz"
)

// parsers are the decoders of untrusted bytes, by message kind; the first
// byte of a fuzz input picks one.
var parsers = []codecfuzz.Parser{
	{Name: "advert", Parse: func(b []byte) (marshaler, error) { return ParseAdvert(b) }},
	{Name: "keyset", Parse: func(b []byte) (marshaler, error) { return ParseKeySet(b) }},
	{Name: "shares", Parse: func(b []byte) (marshaler, error) { return ParseShares(b) }},
	{Name: "delivery", Parse: func(b []byte) (marshaler, error) { return ParseShareDelivery(b) }},
	{Name: "masked", Parse: func(b []byte) (marshaler, error) { return ParseMaskedInput(b) }},
	{Name: "request", Parse: func(b []byte) (marshaler, error) { return ParseUnmaskRequest(b) }},
	{Name: "unmasking", Parse: func(b []byte) (marshaler, error) { return ParseUnmasking(b) }},
	{Name: "survivorsig", Parse: func(b []byte) (marshaler, error) { return ParseSurvivorSig(b) }},
}

// roundMessages runs a small round with a dropout and returns the encoding
// of every message of it, by parser index.
func roundMessages(t testing.TB) map[int][][]byte {
	h, err := newHarness(t, testParams("fuzz", 4, 3, 3, 1))
	if err != nil {
		t.Fatal(err)
	}
	h.stop["c4"] = stepShare
	out := map[int][][]byte{}
	add := func(i int, m marshaler) { keep(t, out, i, m) }
	advertise := func(id string) (*Advert, error) { return h.clients[id].Advertise() }
	collect(t, out, 0, h.ids, advertise, h.server.AddAdvert)
	ks, _ := h.server.EndAdvertise()
	add(1, ks)
	share := func(id string) (*Shares, error) { return h.clients[id].ShareKeys(ks) }
	collect(t, out, 2, h.ids, share, h.server.AddShares)
	dels, _ := h.server.EndShare()
	for _, d := range dels {
		add(3, d)
		if d.To == "c4" {
			continue
		}
		m, _ := h.clients[d.To].MaskInput(d, h.inputs[d.To], 0)
		h.server.AddMaskedInput(m)
		add(4, m)
	}
	req, _ := h.server.EndMask()
	add(5, req)
	sign := func(id string) (*SurvivorSig, error) { return h.clients[id].SignSurvivors(req) }
	collect(t, out, 7, req.Survivors, sign, h.server.AddSignature)
	req, _ = h.server.EndConsistency()
	add(5, req)
	if err := unmaskAll(h.server, h.clients, req.Survivors, req, func(_ int, u *Unmasking) { add(6, u) }); err != nil {
		t.Fatal(err)
	}
	if _, err := h.server.Finish(); err != nil {
		t.Fatal(err)
	}
	return out
}

type marshaler = codecfuzz.Message

// keep adds the encoding of m to out as a message of kind i.
func keep(t testing.TB, out map[int][][]byte, i int, m marshaler) {
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	out[i] = append(out[i], b)
}

// collect has each of ids make its message (compose), keeps it in out as
// a message of kind i and hands it to the server (add; roundMessages
// wants the messages, not the server's verdict).
func collect[M marshaler](t testing.TB, out map[int][][]byte, i int, ids []string, compose func(id string) (M, error), add func(M) error) {
	for _, id := range ids {
		m, err := compose(id)
		if err != nil {
			t.Fatal(err)
		}
		add(m)
		keep(t, out, i, m)
	}
}

// TestParseRoundTrip: every message of a real round parses and marshals
// back to the same bytes, and each kind is refused by the other parsers.
func TestParseRoundTrip(t *testing.T) {
	msgs := roundMessages(t)
	if len(msgs) != len(parsers) {
		t.Fatalf("round produced %d message kinds, want %d", len(msgs), len(parsers))
	}
	for i, bs := range msgs {
		for _, b := range bs {
			for j, p := range parsers {
				m, err := p.Parse(b)
				if i != j {
					if err == nil {
						t.Errorf("%s bytes parse as %s", parsers[i].Name, p.Name)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", p.Name, err)
				}
				again, err := m.Marshal()
				if err != nil || !bytes.Equal(again, b) {
					t.Fatalf("%s: parse then marshal changed the bytes", p.Name)
				}
			}
		}
	}
}

// FuzzParse: no decoder panics on any input, and whatever a decoder
// accepts marshals back to exactly the bytes it was given. The seed corpus
// comes from a real round; the test fails if it is empty, so seeds cannot
// silently vanish.
func FuzzParse(f *testing.F) {
	seeds := 0
	for i, bs := range roundMessages(f) {
		for _, b := range bs {
			if len(b) > 4096 {
				continue // keep seeds small
			}
			f.Add(append([]byte{byte(i)}, b...))
			seeds++
		}
	}
	if seeds < len(parsers) {
		f.Fatalf("only %d fuzz seeds", seeds)
	}
	codecfuzz.RoundTrip(f, parsers)
}

// TestParamsRoundTrip: Params travel to silos in round specs, so they
// round-trip through the canonical encoding with the same digest.
func TestParamsRoundTrip(t *testing.T) {
	p := testParams("r1", 5, 4, 10, 2.5)
	p.Weighted, p.MaxWeight, p.PRG = true, 7, ChaCha20
	b, err := content.Encode(p)
	if err != nil {
		t.Fatal(err)
	}
	var q Params
	if err := content.Decode(b, &q); err != nil {
		t.Fatal(err)
	}
	d1, err1 := p.Digest()
	d2, err2 := q.Digest()
	if err1 != nil || err2 != nil || !bytes.Equal(d1, d2) {
		t.Fatalf("digest changed through encoding: %v %v", err1, err2)
	}
	// Member order does not matter; anything else does.
	slices.Reverse(q.Members)
	if d3, _ := q.Digest(); !bytes.Equal(d1, d3) {
		t.Fatal("digest depends on member order")
	}
	q.Clip = 2.4
	if d4, _ := q.Digest(); bytes.Equal(d1, d4) {
		t.Fatal("digest ignores the clip")
	}
}

// TestParseMaskedInputAgrees: ParseMaskedInput, which reads the vector in
// place, accepts and refuses exactly what the generic decoder
// (DecodeMessage: decode, re-encode, compare) does, on a real masked
// input, every single-byte change and truncation of it, and hand-made
// near misses (an extra, missing, renamed or retyped field; long heads).
func TestParseMaskedInputAgrees(t *testing.T) {
	generic := func(b []byte) (*MaskedInput, error) { return parse("masked input", b, new(MaskedInput)) }
	var cases [][]byte
	for _, b := range roundMessages(t)[4] {
		cases = append(cases, b)
		for i := range b {
			for _, x := range []byte{0x01, 0x20, 0x80, 0xff} {
				c := slices.Clone(b)
				c[i] ^= x
				cases = append(cases, c)
			}
			cases = append(cases, b[:i])
		}
		cases = append(cases, append(slices.Clone(b), 0))
	}
	enc := func(v any) []byte {
		b, err := content.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	vec := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	cases = append(cases,
		enc(map[string]any{"round": "r", "from": "c1", "masked": vec}),
		enc(map[string]any{"round": "r", "from": "c1", "masked": vec, "extra": 1}),
		enc(map[string]any{"round": "r", "from": "c1"}),
		enc(map[string]any{"round": "r", "From": "c1", "masked": vec}),
		enc(map[string]any{"round": "r", "from": "c1", "masked": string(vec)}),
		enc(map[string]any{"round": "r", "from": "c1", "masked": nil}),
		enc(map[string]any{"round": "r", "from": "c1", "masked": []byte{}}),
		enc(map[string]any{"round": []byte("r"), "from": "c1", "masked": vec}),
		enc(map[string]any{"round": "r", "from": "\xff", "masked": vec}),
		enc(map[string]any{"round": "r", "from": "c1", "masked": []int{1, 2}}),
		// A long-form head for the vector's length.
		append([]byte{0xa3, 0x64, 'f', 'r', 'o', 'm', 0x62, 'c', '1', 0x65, 'r', 'o', 'u', 'n', 'd', 0x61, 'r', 0x66, 'm', 'a', 's', 'k', 'e', 'd', 0x58, 8}, vec...),
		[]byte{0xa3}, nil,
	)
	accepted := 0
	for _, b := range cases {
		got, err1 := ParseMaskedInput(b)
		want, err2 := generic(b)
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("%x: in place: %v; generic: %v", b, err1, err2)
		}
		if err1 != nil {
			if codeOf(err1) != codeOf(err2) {
				t.Fatalf("%x: refused as %s in place, as %s by the generic decoder", b, codeOf(err1), codeOf(err2))
			}
			continue
		}
		accepted++
		if got.Round != want.Round || got.From != want.From || !bytes.Equal(got.Masked, want.Masked) {
			t.Fatalf("%x: in place %+v, generic %+v", b, got, want)
		}
	}
	if accepted < 2 {
		t.Fatalf("only %d of %d cases accepted: the real messages must parse", accepted, len(cases))
	}
}
