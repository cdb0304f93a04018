package silo

import (
	"crypto/ed25519"
	"fmt"
	"testing"

	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg"
)

// A threshold-he round's own parameters must name the cohort its masking
// parameters name — the ones the silo's policy reads — and the threshold
// the policy checks is the HE one. Before, nothing compared them: a round
// could pass the policy with 6 sites and a threshold of 5 and run HE with
// 3 sites, or a threshold of 2, or another key in place of a site's.
func TestHEParamsMatchThePolicysCohort(t *testing.T) {
	members := make([]secagg.Member, 6)
	for i := range members {
		pub, _, _ := ed25519.GenerateKey(nil)
		members[i] = secagg.Member{ID: fmt.Sprintf("h%d", i+1), Key: pub}
	}
	sp := secagg.Params{Round: "r1", Members: members, Threshold: 5, Dim: 4, Clip: 1}
	honest := func() fl.RoundBundle {
		r, err := fl.NewHERound(sp)
		if err != nil {
			t.Fatal(err)
		}
		return fl.RoundBundle{SecAgg: sp, HE: r}
	}
	if th, err := heThreshold(honest()); err != nil || th != 5 {
		t.Fatalf("an honest round: threshold %d, %v", th, err)
	}
	fewer := honest()
	fewer.HE.Params.Members = members[:3]
	fewer.HE.Params.Threshold = 2
	if _, err := heThreshold(fewer); err == nil {
		t.Error("HE over 3 of the 6 sites the policy saw was accepted")
	}
	swapped := honest()
	swapped.HE.Params.Members = append([]secagg.Member(nil), members...)
	other, _, _ := ed25519.GenerateKey(nil)
	swapped.HE.Params.Members[2].Key = other
	if _, err := heThreshold(swapped); err == nil {
		t.Error("HE with another key for a site was accepted")
	}
	lower := honest()
	lower.HE.Params.Threshold = 4
	if th, err := heThreshold(lower); err != nil || th != 4 {
		t.Errorf("the threshold checked must be the HE one: got %d, %v, want 4", th, err)
	}
}
