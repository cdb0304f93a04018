package secagg

import (
	"testing"
)

// TestAccumulatorRefuses: an Accumulator takes one masked input per
// member of its round, of the round's length, and nothing else.
func TestAccumulatorRefuses(t *testing.T) {
	p := testParams("acc", 3, 2, 4, 1)
	acc, err := NewAccumulator(p)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRound(p)
	if err != nil {
		t.Fatal(err)
	}
	size := r.lay.size()
	a := p.Members[0].ID
	for _, tc := range []struct {
		what string
		m    *MaskedInput
		ok   bool
	}{
		{"a member's input", &MaskedInput{Round: "acc", From: a, Masked: make([]byte, size)}, true},
		{"its second input", &MaskedInput{Round: "acc", From: a, Masked: make([]byte, size)}, false},
		{"another round's", &MaskedInput{Round: "other", From: p.Members[1].ID, Masked: make([]byte, size)}, false},
		{"a non-member's", &MaskedInput{Round: "acc", From: "nobody", Masked: make([]byte, size)}, false},
		{"one of another length", &MaskedInput{Round: "acc", From: p.Members[1].ID, Masked: make([]byte, size+8)}, false},
		{"nothing", nil, false},
	} {
		if err := acc.Add(tc.m); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.what, err)
		}
	}
	sum, in := acc.Sum()
	if len(in) != 1 || !in[a] || len(sum) != size {
		t.Fatalf("the sum holds %v (%d bytes)", in, len(sum))
	}
}
