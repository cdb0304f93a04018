// Package spot holds the spot-check decisions of the verification regime
// as pure functions the coordinator's state machine applies: adaptive
// replication by reputation, the audit and auditor draw from a seed the
// leader committed to the log, canary choice and verdicts, the re-check
// window of a caught peer, and the exact-quorum rule. It imports nothing
// that touches tensors (the coordinator may not, law 3), draws no
// randomness of its own and performs no I/O, so every replica applying the
// same log reaches the same decision.
package spot
