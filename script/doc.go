// Package script is the Starlark sandbox: it runs one function of a catalog
// entry with a step budget, a memory guard and the native modules content
// may use (tensor, rng, stats, data, model), and converts values between Go
// and Starlark.
//
// Invariants: content has no effects — no file, network, clock, environment
// or credential access; load() reaches only the catalog it is given; and
// every failure (syntax, runtime, budget, bad result) is a diag.Diagnostic
// positioned in the content file. Given the same entry, arguments and
// Env.Seed, Call returns the same result, bit for bit — unless the engine
// imposes record-level DP on training (Env.Training), which it cannot be
// asked to drop by the content.
//
// See docs/content.md for the contracts content implements and the native
// modules, and memguard.go for exactly what the memory guard covers.
package script
