package hewire

import (
	"context"
	"crypto/ed25519"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg/he"
	"github.com/scellis/scellis/secagg/transport"
)

// Participate takes part in threshold-he round p as the site whose identity
// key is id, against the Host at base: advertise, share keys, send y
// encrypted under the collective key, and answer the decrypt requests that
// name this site, until the round has opened its sum (nil), failed (its
// diagnostic), or ctx ends (SC6108). minSurvivors > 0 makes the site refuse
// to encrypt or decrypt with fewer sites (its policy's min_cohort).
//
// As for masking: call it only AFTER the ledger entry paying for y is
// durable (the ciphertext leaves during the call), and at most once per
// update and round.
func Participate(ctx context.Context, hc *http.Client, base string, p he.Params, id ed25519.PrivateKey, y []int64, minSurvivors int) error {
	if hc == nil {
		return errors.New("hewire: Participate needs an *http.Client with the site's mutual TLS config")
	}
	return ParticipateOver(ctx, transport.HTTPS{Client: hc, Base: base}, p, id, y, minSurvivors)
}

// ParticipateOver is Participate over any round transport: HTTPS to the
// host, or a data channel to its aggregator (transport.DataChannel).
func ParticipateOver(ctx context.Context, t transport.Transport, p he.Params, id ed25519.PrivateKey, y []int64, minSurvivors int) error {
	site, err := siteOf(p, id)
	if err != nil {
		return err
	}
	c, err := he.NewParty(p, site, id)
	if err != nil {
		return err
	}
	c.RequireSurvivors(minSurvivors)
	if err := c.CheckInput(y); err != nil {
		return err
	}
	s := &transport.Session{T: t, Round: RoundPath(p.Round), Subject: fmt.Sprintf("threshold-he round %q", p.Round)}
	send := func(what string, m interface{ Marshal() ([]byte, error) }) error {
		b, err := m.Marshal()
		if err != nil {
			return err
		}
		return s.Send(ctx, what, what, b)
	}
	poly := int64(he.PolyBytes())
	a, err := c.Advertise()
	if err != nil {
		return err
	}
	if err := send("advert", a); err != nil {
		return err
	}
	b, err := s.Fetch(ctx, "keyset", "keyset", 4<<10+int64(len(p.Members))<<10)
	if err != nil {
		return err
	}
	ks, err := he.ParseKeySet(b)
	if err != nil {
		return err
	}
	sh, err := c.Share(ks)
	if err != nil {
		return err
	}
	if err := send("shares", sh); err != nil {
		return err
	}
	if b, err = s.Fetch(ctx, "delivery", "delivery", 4<<10+int64(len(p.Members))*(2*poly+1024)); err != nil {
		return err
	}
	d, err := he.ParseDelivery(b)
	if err != nil {
		return err
	}
	ct, err := c.Encrypt(d, y)
	if err != nil {
		return err
	}
	if err := send("ciphertext", ct); err != nil {
		return err
	}
	for from := 0; ; {
		b, err := s.Fetch(ctx, "decrypt request", "decrypt?from="+strconv.Itoa(from), 4<<10+int64(len(p.Members))*256+int64(p.Ciphertexts())*(poly+32))
		if ds, ok := diag.As(err); ok && ds[0].Code == diag.SecAggWireRoundOver {
			return nil // the sum is open
		}
		if err != nil {
			return err
		}
		req, err := he.ParseDecryptRequest(b)
		if err != nil {
			return err
		}
		from = req.Attempt + 1
		named := false
		for _, x := range req.Decryptors {
			named = named || x == site
		}
		if !named {
			continue
		}
		share, err := c.Decrypt(req)
		if err != nil {
			return err
		}
		if err := send("decshare", share); err != nil {
			return err
		}
	}
}

func siteOf(p he.Params, id ed25519.PrivateKey) (string, error) {
	if len(id) == ed25519.PrivateKeySize {
		pub := id.Public().(ed25519.PublicKey)
		for _, m := range p.Members {
			if subtle.ConstantTimeCompare(m.Key, pub) == 1 {
				return m.ID, nil
			}
		}
	}
	return "", diag.New(diag.SecAggUnknownSite, fmt.Sprintf("threshold-he round %q", p.Round), "this site's identity key is not among the round's members").
		WithHelp("the round was planned without this site; do not send anything")
}

// RoundPath is the path of round's endpoints on a Host, ending in "/".
func RoundPath(round string) string {
	return pathRounds + base64.RawURLEncoding.EncodeToString([]byte(round)) + "/"
}
