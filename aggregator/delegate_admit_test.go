package aggregator

import (
	"fmt"
	"testing"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/job"
	"github.com/scellis/scellis/trust"
)

// A child cluster runs a parent job's shards on its own workers, so it
// admits the job's inputs and models under its own regime, whatever the
// parent's: an open child refuses a confidential table an own parent
// admitted, before the table is copied to it.
func TestChildAdmitsParentJobUnderItsOwnRegime(t *testing.T) {
	confidential := &job.Bundle{Name: "sweep", Regime: string(trust.Own),
		Inputs: map[string]job.BundleInput{"cohort": {Label: "cohort.csv", Class: string(trust.Confidential)}}}
	public := &job.Bundle{Name: "sweep", Regime: string(trust.Own),
		Inputs: map[string]job.BundleInput{"cohort": {Label: "cohort.csv", Class: string(trust.Public)}}}
	model := &job.Bundle{Name: "sweep", Regime: string(trust.Own), Classes: map[string]string{"model": string(trust.Confidential)}}
	critical := &job.Bundle{Name: "sweep", Regime: string(trust.Own), SecurityCritical: true}
	for _, tc := range []struct {
		regime trust.Regime
		b      *job.Bundle
		code   diag.Code
	}{
		{trust.Open, confidential, diag.OpenNonPublicInput},
		{trust.Open, model, diag.OpenConfidential},
		{trust.Open, critical, diag.OpenSecurityCritical},
		{trust.Open, public, ""},
		{trust.Own, confidential, ""},
		{trust.Consortium, confidential, ""},
	} {
		ds := admitHere(tc.regime, tc.b)
		if tc.code == "" {
			if ds.HasErrors() {
				t.Errorf("%s child refused %+v: %v", tc.regime, tc.b, ds)
			}
			continue
		}
		if !ds.HasErrors() || ds[0].Code != tc.code {
			t.Errorf("%s child: want %s for %+v, got %v", tc.regime, tc.code, tc.b, ds)
		}
	}
}

// A child verifies a pooled sub-job under its own regime, each shard on
// as many distinct peers as the regime's default replicas: an open or
// consortium child with a single worker could never decide one, so it
// hands the parent's shards back rather than take them.
func TestChildRefusesWithTooFewPeers(t *testing.T) {
	fed := func(roles ...identity.Role) *identity.Federation {
		f := &identity.Federation{Name: "child"}
		for i, r := range roles {
			f.Members = append(f.Members, identity.Member{Name: fmt.Sprintf("m%d", i), Role: r})
		}
		return f
	}
	agg, w, s, c := identity.Aggregator, identity.Worker, identity.Silo, identity.Cluster
	for _, tc := range []struct {
		regime trust.Regime
		fed    *identity.Federation
		refuse bool
	}{
		{trust.Own, fed(agg, w), false},
		{trust.Own, fed(agg), true},
		{trust.Open, fed(agg, w), true},
		{trust.Open, fed(agg, w, w), false},
		{trust.Consortium, fed(agg, agg, agg, w), true},
		{trust.Consortium, fed(agg, w, s), false},
		{trust.Own, fed(agg, c), false}, // a middle cluster: its child leases as one peer
		{trust.Open, fed(agg, c, c), false},
		{trust.Open, fed(agg, c), true},
	} {
		why := tooFewPeers(tc.regime, tc.fed)
		if (why != "") != tc.refuse {
			t.Errorf("%s child with %v: refusal %q, want refused=%v", tc.regime, tc.fed.Members, why, tc.refuse)
		}
	}
}
