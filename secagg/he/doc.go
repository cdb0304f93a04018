// Package he is threshold homomorphic aggregation: an alternative to the
// pairwise masking of package secagg, on the multiparty BGV of
// github.com/tuneinsight/lattigo/v5 (package mhe).
//
// The sites of a round generate a collective public key together (the
// common reference polynomial is derived from the round's public seed),
// Shamir-share their secret keys t-of-n among themselves, encrypt their
// encoded updates under the collective key, and t of them jointly decrypt
// the sum with smudging noise. Like secagg it is two transport-agnostic
// state machines — Party (one per silo) and Aggregator (the reducer peer) —
// driven by messages that round-trip through canonical CBOR.
//
// The invariant it keeps: the aggregator holds no key share and receives
// only ciphertexts, the sites' signed key shares, boxes it cannot open and
// partial decryptions of one ciphertext — the sum of at least max(3, t)
// sites; a site produces partial decryptions for one ciphertext per round
// only (the "never both secrets" analogue), so with t > n/2 no two
// coalitions can decrypt two different ciphertexts of a round. Fewer than
// t survivors end the round with a diagnostic, never a partial sum.
// docs/secagg.md ("Threshold homomorphic mode") records the parameters.
//
// It may import the standard library, lattigo, diag, content, identity and
// secagg (its members, Shamir sharing and boxes); package secagg/wire runs
// it over the network as one scheme of the round protocol
// (TestSecAggFloors in secagg/wire).
package he
