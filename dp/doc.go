// Package dp provides the differential-privacy primitives of a silo: L2
// clipping, Gaussian noise from a cryptographically secure generator, an exact
// discrete Gaussian sampler for integer grids, a Rényi-DP accountant for the
// Poisson-subsampled Gaussian mechanism, and the privacy ledger.
//
// The invariant this package keeps: a ledger's cumulative ε for a dataset never
// decreases and never exceeds the dataset's budget, and an accepted charge is
// durable (fsync'd, signed, hash-chained) before Charge returns.
package dp
