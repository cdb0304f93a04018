package dataplane

import (
	"crypto/subtle"
	"fmt"
	"strings"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// Signal kinds.
const (
	KindOffer  = "offer"
	KindAnswer = "answer"
)

// Signal is one signalling message between two members: an SDP offer or
// answer (non-trickle: the SDP carries every ICE candidate gathered) and
// the sender's signature over its DTLS certificate fingerprint.
type Signal struct {
	Session string `json:"session"` // random per connection attempt
	From    string `json:"from"`
	To      string `json:"to"`
	Kind    string `json:"kind"`
	SDP     string `json:"sdp"`
	// Fingerprint is the sender's DTLS certificate fingerprint as it
	// appears in the SDP ("sha-256 AB:CD:…").
	Fingerprint string `json:"fingerprint"`
	Sig         []byte `json:"sig"`
}

// signed is what the fingerprint signature covers: who, to whom, for
// which attempt and which certificate. The SDP itself is not signed (its
// candidates are rewritten by NATs in other designs); the fingerprint in
// it must equal the signed one.
type signed struct {
	Session     string `cbor:"1,keyasint"`
	From        string `cbor:"2,keyasint"`
	To          string `cbor:"3,keyasint"`
	Kind        string `cbor:"4,keyasint"`
	Fingerprint string `cbor:"5,keyasint"`
}

func (s *Signal) signedPart() signed {
	return signed{Session: s.Session, From: s.From, To: s.To, Kind: s.Kind, Fingerprint: s.Fingerprint}
}

// sign fills s.Sig with id's signature.
func (s *Signal) sign(id *identity.Identity) error {
	sig, err := identity.SignValue(id, identity.PurposeP2PFingerprint, s.signedPart())
	if err != nil {
		return err
	}
	s.Sig = sig
	return nil
}

// Verify checks that s is signed by the federation member it names and
// that the fingerprint in its SDP is the one signed: a relay that swaps
// the certificate (to sit in the middle of the DTLS handshake) or the
// signature is caught here, and pion then holds the DTLS handshake to
// the fingerprint in the SDP.
func (s *Signal) Verify(fed *identity.Federation) error {
	m, ok := fed.Member(s.From)
	if !ok {
		return diag.New(diag.P2PSignalRefused, s.From, "%q is not a member of the federation", s.From).
			WithHelp("only federation members may open data-plane connections")
	}
	if s.Kind != KindOffer && s.Kind != KindAnswer {
		return diag.New(diag.P2PSignalRefused, s.From, "unknown signal kind %q", s.Kind)
	}
	if !identity.VerifyValue(m.PublicKey, identity.PurposeP2PFingerprint, s.signedPart(), s.Sig) {
		return diag.New(diag.P2PSignalRefused, s.From, "the %s from %s is not signed by %s's federation key", s.Kind, s.From, s.From).
			WithHelp("the signalling was altered in transit, or the peer's key is not the one in the federation file")
	}
	fps := sdpFingerprints(s.SDP)
	if len(fps) == 0 {
		return diag.New(diag.P2PSignalRefused, s.From, "the %s from %s carries no DTLS fingerprint", s.Kind, s.From)
	}
	for _, fp := range fps {
		if subtle.ConstantTimeCompare([]byte(normFingerprint(fp)), []byte(normFingerprint(s.Fingerprint))) != 1 {
			return diag.New(diag.P2PSignalRefused, s.From, "the DTLS fingerprint in the %s from %s is not the one %s signed", s.Kind, s.From, s.From).
				WithHelp("someone altered the signalling in transit to put a certificate of their own in the middle; the connection is refused")
		}
	}
	return nil
}

// sdpFingerprints returns every a=fingerprint value of an SDP (session
// and media level).
func sdpFingerprints(sdp string) []string {
	var out []string
	for line := range strings.Lines(sdp) {
		line = strings.TrimRight(line, "\r\n")
		if v, ok := strings.CutPrefix(line, "a=fingerprint:"); ok {
			out = append(out, v)
		}
	}
	return out
}

func normFingerprint(s string) string {
	alg, val, _ := strings.Cut(strings.TrimSpace(s), " ")
	return strings.ToLower(alg) + " " + strings.ToUpper(strings.TrimSpace(val))
}

// fingerprintString renders a pion fingerprint as SDP writes it.
func fingerprintString(alg, value string) string {
	return fmt.Sprintf("%s %s", alg, value)
}
