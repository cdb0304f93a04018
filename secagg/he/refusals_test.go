package he

import (
	"slices"
	"testing"

	"github.com/scellis/scellis/diag"
)

// TestDecryptRefusals plays a lying aggregator against the sites of a
// round at its decryption phase: each bad request is refused with its
// code and aborts the site that saw it (SC6017 afterwards), and the
// one-ciphertext rule (the analogue of masking's "never both secrets")
// holds — a site that opened the sum refuses to open a sum of other
// contributors in the same round. With four of seven sites aborted the round
// ends without a sum.
func TestDecryptRefusals(t *testing.T) {
	p, keys := testRound(t, 7, 50, 1000) // t = 4
	inputs := randInputs(t, 7, 50, p.Bound)
	clone := func(r *DecryptRequest) *DecryptRequest {
		return must(ParseDecryptRequest(must(r.Marshal())))
	}
	var checked bool
	d := drive{onRequest: func(parties map[string]*Party, req *DecryptRequest, sent map[string]*Ciphertext) {
		if checked {
			return
		}
		checked = true
		// Sites outside the decryptors serve as victims: each bad request
		// aborts the site it is sent to.
		var victims []*Party
		for _, s := range req.Contributors {
			if !slices.Contains(req.Decryptors, s) {
				victims = append(victims, parties[s])
			}
		}
		if len(victims) < 3 {
			t.Fatalf("want 3 non-decryptors or more, have %d", len(victims))
		}
		bad := []struct {
			name string
			code diag.Code
			edit func(*DecryptRequest, *Party)
		}{
			{"not a decryptor", diag.SecAggBothSecrets, func(r *DecryptRequest, _ *Party) {}},
			{"fewer contributors than max(3, t)", diag.SecAggBelowThreshold, func(r *DecryptRequest, v *Party) {
				r.Contributors = []string{r.Decryptors[0], r.Decryptors[1], v.site}
				slices.Sort(r.Contributors)
				r.Decryptors = []string{r.Decryptors[0], r.Decryptors[1], v.site, r.Decryptors[2]}
			}},
			{"t−1 decryptors", diag.SecAggBothSecrets, func(r *DecryptRequest, v *Party) {
				r.Decryptors = append(r.Decryptors[:2], v.site)
			}},
		}
		for i, b := range bad {
			r := clone(req)
			b.edit(r, victims[i])
			if _, err := victims[i].Decrypt(r); !hasCode(err, b.code) {
				t.Errorf("%s: want %s, got %v", b.name, b.code, err)
			}
			if _, err := victims[i].Decrypt(clone(req)); !hasCode(err, diag.SecAggAborted) {
				t.Errorf("%s: the site did not abort: %v", b.name, err)
			}
		}
		// A decryptor opens the sum, then is asked to open the sum of
		// all contributors but one (which, with the first, would give
		// that site's input away).
		dec := parties[req.Decryptors[0]]
		if _, err := dec.Decrypt(clone(req)); err != nil {
			t.Fatal(err)
		}
		fewer := clone(req)
		fewer.Attempt = 1
		fewer.Contributors = slices.DeleteFunc(fewer.Contributors, func(s string) bool { return s == victims[0].site })
		if _, err := dec.Decrypt(fewer); !hasCode(err, diag.SecAggBothSecrets) {
			t.Errorf("a second sum in one round: want SC6010, got %v", err)
		}
		// That decryptor is now aborted too: four of seven sites are, so
		// the round cannot find t = 4 decryptors and ends without a sum.
	}}
	res, err := d.run(t, p, keys, inputs)
	if !checked || res != nil || !hasCode(err, diag.SecAggBelowThreshold) {
		t.Fatalf("want the round to end with SC6004 and no sum, got %v, %v", res, err)
	}
}
