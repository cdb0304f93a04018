// Package wire runs secure aggregation (package secagg) over the network:
// the data plane between the silos and the aggregator's reducer peer, apart
// from the coordinator API (the coordinator never sees a masked vector).
//
// Host is an http.Handler the aggregator mounts at /secagg/: it holds one
// secagg.Server per open round and moves each round through its phases when
// every site has answered or the phase's deadline passes. Participate is a
// silo's side: it drives one secagg.Client through a round against a Host,
// over mutually authenticated TLS, with long polls and retries.
//
// The invariant it keeps: the host only ever receives what the secagg state
// machines produce — key adverts, encrypted shares, masked vectors and
// unmaskings, as their canonical CBOR bytes — and every message is accepted
// only from the site it names, as authenticated by its TLS key. Nothing here
// unmasks, logs or stores an individual input; the sum is released only
// after secagg.Server.Finish. docs/secagg.md ("Over the network") has the
// endpoints and the contract with the silo's privacy ledger.
package wire
