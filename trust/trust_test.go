package trust

import (
	"testing"

	"github.com/scellis/scellis/diag"
)

func codes(l diag.List) []diag.Code {
	var out []diag.Code
	for _, d := range l {
		out = append(out, d.Code)
	}
	return out
}

func TestAdmissionMatrix(t *testing.T) {
	pub := []Item{{"d", Public}}
	conf := []Item{{"d", Confidential}}
	cases := []struct {
		name string
		pool Regime
		req  Request
		want []diag.Code
	}{
		{"own anything", Own, Request{SecurityCritical: true, Inputs: conf, Models: conf, Training: true}, nil},
		{"open public ok", Open, Request{Inputs: pub}, nil},
		{"open security critical", Open, Request{SecurityCritical: true, Inputs: pub}, []diag.Code{diag.OpenSecurityCritical}},
		{"open confidential input", Open, Request{Inputs: conf}, []diag.Code{diag.OpenNonPublicInput}},
		{"open unclassified input", Open, Request{Inputs: []Item{{"d", ""}}}, []diag.Code{diag.OpenNonPublicInput}},
		{"open confidential model", Open, Request{Inputs: pub, Models: conf}, []diag.Code{diag.OpenConfidential}},
		{"open confidential training", Open, Request{Inputs: conf, Training: true, DP: true, SecureAgg: true}, []diag.Code{diag.OpenNonPublicInput}},
		{"consortium confidential sweep", Consortium, Request{Inputs: conf, SecurityCritical: true}, nil},
		{"consortium training protected", Consortium, Request{Inputs: conf, Training: true, DP: true, SecureAgg: true}, nil},
		{"consortium training no dp", Consortium, Request{Inputs: conf, Training: true, SecureAgg: true}, []diag.Code{diag.ConsortiumNoDP}},
		{"consortium training no secagg", Consortium, Request{Inputs: conf, Training: true, DP: true}, []diag.Code{diag.ConsortiumNoSecAgg}},
		{"own training without protections", Own, Request{Inputs: conf, Training: true}, nil},
		{"regime mismatch", Own, Request{Regime: Open}, []diag.Code{diag.RegimeMismatch}},
		{"all open violations at once", Open, Request{SecurityCritical: true, Inputs: conf, Models: conf},
			[]diag.Code{diag.OpenSecurityCritical, diag.OpenNonPublicInput, diag.OpenConfidential}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := codes(Admit(c.pool, c.req))
			if len(got) != len(c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("got %v, want %v", got, c.want)
				}
			}
		})
	}
}

func TestParse(t *testing.T) {
	for _, s := range []string{"own", "consortium", "open"} {
		if _, err := ParseRegime(s); err != nil {
			t.Error(err)
		}
	}
	if _, err := ParseRegime("public"); err == nil {
		t.Error("accepted unknown regime")
	}
	if _, err := ParseClass("secret"); err == nil {
		t.Error("accepted unknown class")
	}
	if l := Admit("weird", Request{}); len(l) != 1 || l[0].Code != diag.UnknownRegime {
		t.Errorf("unknown pool regime: %v", l)
	}
}
