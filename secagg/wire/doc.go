// Package wire runs secure aggregation over the network: the data plane
// between the silos and the aggregator's reducer peer, apart from the
// coordinator API (the coordinator never sees a masked vector or a
// ciphertext).
//
// It is one round protocol with the scheme as a plug (scheme.go). Host is
// the aggregator's side: an http.Handler mounted at Prefix (masking) and
// HEPrefix (threshold-he) that holds one state machine per open round and
// moves the round through its phases when every site has answered or the
// phase's deadline passes. The participants — Participate and its
// variants for masking, ParticipateHE — are a silo's side: they drive one
// site state machine through a round against a Host, over a round
// transport (package secagg/transport: mutual TLS, or a data channel),
// with long polls and retries. The shared part holds what every scheme
// needs once: authentication, retries recognised as such, long polls and
// their bound, deadlines, dropouts and excused sites, aborts, tombstones,
// and the sequence every site follows (advert, key set, key shares,
// delivery, contribution). A scheme says what its phases send, publish
// and check:
//
//   - masking (masking.go): pairwise masking, or SecAgg+ over a sparse
//     graph, as the round's secagg.Params choose — package secagg's Client
//     and Server, with the consistency round before unmasking;
//   - thresholdHE (thresholdhe.go): threshold homomorphic encryption —
//     package secagg/he's Party and Aggregator.
//
// hier.go adds hierarchical masking rounds: a child's round relayed as a
// masked sum to its parent's host. The three-site minimum is the state
// machines' (secagg.MinSites): no round opens with fewer members, and no
// phase ends below it.
//
// The invariant it keeps: the host only ever receives what the state
// machines produce — key adverts and shares, masked vectors or
// ciphertexts, signatures, unmaskings or partial decryptions, as their
// canonical CBOR bytes — and every message is accepted only from the site
// it names, as authenticated by its TLS key. Nothing here unmasks,
// decrypts, logs or stores an individual input; the sum is released only
// after the state machine opened it. A recorded round (transcript.go)
// keeps the messages as they arrived — masked inputs are masked — for
// another aggregator node to replay the round. docs/secagg.md ("Over the network")
// has the endpoints and the contract with the silo's privacy ledger.
//
// It may import the standard library, diag, content, identity, secagg,
// secagg/he and secagg/transport — never the control plane (coordinator,
// api, consensus) nor the appliances that import it (aggregator, silo,
// pool): TestDataPlaneImports and TestSecAggFloors.
package wire
