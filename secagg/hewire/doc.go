// Package hewire runs threshold-he rounds (package secagg/he) over the
// network, as package secagg/wire runs masking rounds: Host is the
// aggregator's reducer-peer endpoint (mounted at Prefix, beside the
// masking host and apart from the coordinator API), Participate a silo's
// side, over mutually authenticated TLS with long polls and retries.
//
// The invariant it keeps: the host only receives what he.Party produces —
// signed adverts and key shares, sealed boxes, ciphertexts and partial
// decryptions — each accepted only from the site it names, as
// authenticated by its TLS key; it adds ciphertexts as they arrive and
// releases the sum only after t partial decryptions opened it. Nothing
// here decrypts, logs or stores an individual input.
package hewire
