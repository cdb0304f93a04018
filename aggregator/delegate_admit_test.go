package aggregator

import (
	"testing"

	"github.com/scellis/scellis/diag"
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
