// Package verify holds the verification regime's decisions as pure
// functions: which shards are re-executed or audited, how results compare
// (byte-exact for the replayable tier, within a declared tolerance for the
// convergent tier, Freivalds checks for matrix products), how peers' records
// evolve, and what a failed check replaces or reverses. It never performs
// I/O and draws no randomness of its own: the coordinator passes in the
// randomness it committed to the Raft log, so every replica reaches the same
// decision.
package verify
