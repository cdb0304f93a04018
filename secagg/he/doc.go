// Package he is threshold homomorphic aggregation: an alternative to the
// pairwise masking of package secagg, on the multiparty BGV of
// github.com/tuneinsight/lattigo/v5 (package mhe).
//
// The sites of a round Shamir-share their secret keys t-of-n among
// themselves (no public key is formed), pack several encoded values into
// each plaintext coefficient (as many lanes of the sum's width as fit
// below T/2), and encrypt under their own secret key with the round's
// public polynomials a_k — drawn from a PRNG keyed by the round's public
// seed, the common reference string — as c1, so a ciphertext travels as
// its c0 alone. The aggregator adds the c0; the sum with a_k is an
// encryption of the summed inputs under Σ s_i of the contributors, which
// t of them jointly decrypt from their Shamir shares with smudging noise,
// each partial decryption rounded to 2^48 before it travels. Like secagg
// it is two transport-agnostic state machines — Party (one per silo) and
// Aggregator (the reducer peer) — driven by messages that round-trip
// through canonical CBOR.
//
// The invariant it keeps: the aggregator holds no key share and receives
// only ciphertexts, boxes it cannot open and partial decryptions of one
// sum — of at least max(3, t) sites' inputs, under their summed key, so
// no request opens a single site's input; a site produces partial
// decryptions for one sum (one set of contributors) per round only (the
// "never both secrets" analogue), so with t > n/2 no two coalitions can
// decrypt two different sums of a round. Fewer than
// t survivors end the round with a diagnostic, never a partial sum.
// docs/secagg.md ("Threshold homomorphic mode") records the parameters.
//
// It may import the standard library, lattigo, diag, content, identity and
// secagg (its members, Shamir sharing and boxes); package secagg/wire runs
// it over the network as one scheme of the round protocol
// (TestSecAggFloors in secagg/wire).
package he
