// Package tensor holds the dense float64 vectors and matrices of Scellis and
// the operations on them. It is the only place tensor bytes are typed: every
// other package (the sandbox's native module, reducers, federated strategies)
// goes through these types.
//
// Invariant: every operation is a pure function with a fixed evaluation
// order written in plain Go, and every product is rounded explicitly
// (float64(x*y)) so the compiler cannot fuse it into an FMA. The results of
// the vector operations are therefore byte-identical on every run and on
// every architecture (the replayable tier). MatMul included: it is plain Go
// rather than gonum's BLAS, whose kernels are assembly on amd64 and Go (with
// fused multiply-adds) elsewhere, and so rounded differently on arm64.
//
// Operations that take several operands return ErrShape (wrapped, with the
// lengths) instead of panicking, because their operands often come from
// untrusted peers or content.
package tensor
