package silo

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/internal/testfault"
	"github.com/scellis/scellis/secagg"
	"github.com/scellis/scellis/secagg/he"
	"github.com/scellis/scellis/secagg/transport"
	"github.com/scellis/scellis/secagg/wire"
)

// aggMode is the mode the round's bundle forms its sum in.
func aggMode(b fl.RoundBundle) string {
	if b.HE != nil {
		return fl.AggThresholdHE
	}
	return fl.AggMasking
}

// heThreshold returns the threshold a threshold-he round decrypts with,
// once its HE parameters are shown to describe the cohort its masking
// parameters name (the ones the silo's policy reads: cohort size, keys):
// the same members with the same keys. Before, a round could name a
// large cohort in its masking parameters, pass the policy, and run HE
// with fewer members or a lower threshold that nothing compared.
func heThreshold(b fl.RoundBundle) (int, error) {
	hp := b.HE.Params
	if !sameMembers(hp.Members, b.SecAgg.Members) {
		return 0, fmt.Errorf("the round's threshold-he members (%d) are not the %d sites of its secure-aggregation parameters", len(hp.Members), len(b.SecAgg.Members))
	}
	return hp.EffectiveThreshold()
}

// sameMembers reports whether a and b name the same sites with the same
// keys, in any order.
func sameMembers(a, b []secagg.Member) bool {
	if len(a) != len(b) {
		return false
	}
	keys := make(map[string]string, len(a))
	for _, m := range a {
		keys[m.ID] = string(m.Key)
	}
	for _, m := range b {
		if k, ok := keys[m.ID]; !ok || k != string(m.Key) {
			return false
		}
		delete(keys, m.ID)
	}
	return len(keys) == 0
}

// checkHE refuses, before anything is charged, an input a threshold-he
// round could not carry: its integers beyond the round's per-site bound.
func (a *Appliance) checkHE(b fl.RoundBundle, in wire.Input) error {
	if b.HE == nil {
		return nil
	}
	p, err := he.NewParty(b.HE.Params, a.Name, a.ID.PrivateKey())
	if err != nil {
		return err
	}
	y, err := b.HE.Encode(in.Values, in.Encoded, in.Weight, b.SecAgg.Weighted)
	if err != nil {
		return err
	}
	defer clear(y)
	return p.CheckInput(y)
}

// participate sends the charged input into the round's secure sum, by
// pairwise masking or threshold-he as the bundle says. Only after the
// ledger charge (law 6): the input leaves during the call.
func (a *Appliance) participate(ctx context.Context, base string, b fl.RoundBundle, in wire.Input) error {
	if b.HE == nil {
		return wire.ParticipateOver(ctx, a.roundTransport(base), b.SecAgg, a.ID.PrivateKey(), in)
	}
	y, err := b.HE.Encode(in.Values, in.Encoded, in.Weight, b.SecAgg.Weighted)
	if err != nil {
		return err
	}
	defer clear(y)
	t := a.roundTransport(base)
	if testfault.Armed(testfault.KillAfterHECiphertext) {
		t = dieAfterCiphertext{t, a.logf}
	}
	return wire.ParticipateHE(ctx, t, b.HE.Params, a.ID.PrivateKey(), y, in.MinSurvivors)
}

// dieAfterCiphertext kills the process once the aggregator accepted its
// threshold-he ciphertext (test builds only, see package testfault): the
// silo paid, sent and was summed, and is gone before any decryption.
type dieAfterCiphertext struct {
	t    transport.Transport
	logf func(string, ...any)
}

func (d dieAfterCiphertext) RoundTrip(ctx context.Context, req transport.Request) (transport.Response, error) {
	resp, err := d.t.RoundTrip(ctx, req)
	if err == nil && req.Method == http.MethodPost && strings.HasSuffix(req.Path, "/ciphertext") && resp.Status/100 == 2 {
		d.logf("test fault %s: the aggregator accepted the ciphertext; killing the process", testfault.KillAfterHECiphertext)
		testfault.Kill()
	}
	return resp, err
}
