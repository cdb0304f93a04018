// Package identity gives every Scellis node its Ed25519 identity key, reads
// the federation file that lists the members by name, role, public key and
// address, and derives mutually authenticated TLS 1.3 and domain-separated
// signatures from those keys.
//
// The invariant it keeps: a peer is who the federation file says its key is,
// and nothing else. TLS certificates are throw-away wrappers around the
// identity key; a connection is accepted only when the peer's key is pinned in
// the federation file (with an allowed role), and a signature made for one
// purpose never verifies for another. Private key material is never logged,
// printed or returned in an error.
package identity

import "errors"

// Errors a TLS handshake fails with when the peer's key is refused. They
// reach the caller of Handshake (possibly wrapped); the peer sees a
// bad_certificate alert.
var (
	// ErrUnknownPeer: the peer's key is not in the federation file.
	ErrUnknownPeer = errors.New("identity: peer key is not a member of the federation")
	// ErrPeerRole: the peer is a member, but its role is not allowed here.
	ErrPeerRole = errors.New("identity: peer's role is not allowed on this connection")
	// ErrUnexpectedPeer: the peer is a member, but not the one dialled.
	ErrUnexpectedPeer = errors.New("identity: peer is not the member that was dialled")
	// ErrNoPeerKey: the peer sent no certificate or one without an Ed25519 key.
	ErrNoPeerKey = errors.New("identity: peer presented no Ed25519 certificate")
)
