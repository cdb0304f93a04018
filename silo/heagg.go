package silo

import (
	"context"
	"net/http"
	"strings"

	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/internal/testfault"
	"github.com/scellis/scellis/secagg/he"
	"github.com/scellis/scellis/secagg/hewire"
	"github.com/scellis/scellis/secagg/wire"
)

// aggMode is the mode the round's bundle forms its sum in.
func aggMode(b fl.RoundBundle) string {
	if b.HE != nil {
		return fl.AggThresholdHE
	}
	return fl.AggMasking
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
		return wire.ParticipateWith(ctx, a.HTTP, base, b.SecAgg, a.ID.PrivateKey(), in)
	}
	y, err := b.HE.Encode(in.Values, in.Encoded, in.Weight, b.SecAgg.Weighted)
	if err != nil {
		return err
	}
	defer clear(y)
	hc := a.HTTP
	if testfault.Armed(testfault.KillAfterHECiphertext) {
		rt := hc.Transport
		if rt == nil {
			rt = http.DefaultTransport
		}
		hc = &http.Client{Transport: dieAfterCiphertext{rt, a.logf}}
	}
	return hewire.Participate(ctx, hc, base, b.HE.Params, a.ID.PrivateKey(), y, in.MinSurvivors)
}

// dieAfterCiphertext kills the process once the aggregator accepted its
// threshold-he ciphertext (test builds only, see package testfault): the
// silo paid, sent and was summed, and is gone before any decryption.
type dieAfterCiphertext struct {
	rt   http.RoundTripper
	logf func(string, ...any)
}

func (d dieAfterCiphertext) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := d.rt.RoundTrip(r)
	if err == nil && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/ciphertext") && resp.StatusCode/100 == 2 {
		d.logf("test fault %s: the aggregator accepted the ciphertext; killing the process", testfault.KillAfterHECiphertext)
		testfault.Kill()
	}
	return resp, err
}
