// Package secagg is secure aggregation for cross-silo rounds: the protocol
// of Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving
// Machine Learning" (CCS 2017), with the consistency round of its active
// variant, as two transport-agnostic state machines — Client and Server —
// driven by messages that round-trip through canonical CBOR.
//
// Each client adds pairwise masks (which cancel in the sum) and a self mask
// to its fixed-point encoded input; the server accumulates masked inputs as
// they arrive and, with the help of the surviving clients' Shamir shares,
// removes the self masks of the survivors and the pairwise masks of clients
// that dropped out. The invariant it keeps: the server learns the sum of the
// survivors' inputs and nothing about any single input — a round with fewer
// than three sites or fewer survivors than the threshold ends with a
// diagnostic, never a partial sum, and no client reveals both secrets of one
// site. Before revealing any share, every survivor signs the survivor set it
// was shown and checks that enough sites signed that very set, so an
// aggregator that equivocates about dropouts is caught while it colludes
// with fewer than 2t − n sites. The sum itself is released, so differential
// privacy is still needed.
// docs/secagg.md records where this departs from the paper.
//
// It may import the standard library, golang.org/x/crypto and x/sys/cpu,
// diag, content and identity: the network runs it from package
// secagg/wire, which imports it, never the other way (TestSecAggFloors in
// secagg/wire).
package secagg
