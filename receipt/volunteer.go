package receipt

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Browser volunteers (docs/volunteers.md) are not federation members: a
// tab makes an ephemeral Ed25519 key and takes part under a name derived
// from it, so the name is self-certifying. A signature checked against
// the key the name was derived from needs no membership entry, and no
// member can be impersonated: member names match
// ^[a-z0-9][a-z0-9._-]{0,62}$, which has no colon.

// VolunteerPrefix starts every volunteer's peer name.
const VolunteerPrefix = "vol:"

// VolunteerPeer is the peer name of the volunteer holding key (in text
// form, "ed25519:" and base64): the prefix and the first 16 bytes of the
// key text's SHA-256, in hex. 128 bits make a second key with the same
// name out of reach.
func VolunteerPeer(key string) string {
	sum := sha256.Sum256([]byte(key))
	return VolunteerPrefix + hex.EncodeToString(sum[:16])
}

// IsVolunteer reports whether peer is a volunteer's name (by its form;
// whether a key signs for it is VolunteerKey's question).
func IsVolunteer(peer string) bool {
	rest, ok := strings.CutPrefix(peer, VolunteerPrefix)
	if !ok || len(rest) != 32 {
		return false
	}
	_, err := hex.DecodeString(rest)
	return err == nil && strings.ToLower(rest) == rest
}

// VolunteerKey reports whether key may sign for the volunteer peer: key
// parses and peer is the name derived from it.
func VolunteerKey(peer, key string) bool {
	_, ok := ParseKey(key)
	return ok && IsVolunteer(peer) && VolunteerPeer(key) == peer
}
