// Package dataplane moves content-addressed blobs peer to peer over WebRTC
// data channels (pion/webrtc): directly when ICE finds a path (host or
// STUN-reflexive candidates), through a TURN relay on an aggregator node
// when NATs forbid one, and — decided by the caller — over the HTTPS blob
// endpoint as the last fallback.
//
// Signalling (SDP offers and answers, with their ICE candidates) goes
// through a bounded, expiring mailbox on an aggregator's mutual-TLS API;
// the mailbox is node-local memory, never the Raft log, and it carries no
// tensor bytes (law 3). Each side signs its DTLS certificate fingerprint
// with its federation identity key and checks the other's, so the
// aggregator that relays the signalling cannot put itself in the middle.
//
// Invariant: a blob is handed to the caller (Get) or stored (a peer's
// Put) only after its bytes hash to the ref asked for.
package dataplane
