//go:build !js

package identity

import "net/http"

// This file is left out of the GOOS=js build (cmd/scellis-wasm), so the
// shard executor compiled for a browser tab links no HTTP client: content
// running there has no way to the network, not even an unreachable one.

// PeerFromRequest returns the authenticated member that sent r, or false
// when r did not arrive over TLS with a member's key (which a server made by
// ServerTLSConfig never lets happen). It looks the key up in f again, so a
// federation re-read since the handshake is what counts.
//
// A request that arrived over another authenticated channel carries its
// sender in its context instead (WithPeer): its key is looked up the same
// way.
func (f *Federation) PeerFromRequest(r *http.Request) (Member, bool) {
	if k, ok := r.Context().Value(peerKey{}).(PublicKey); ok {
		return f.Lookup(k)
	}
	return f.Peer(r.TLS)
}
