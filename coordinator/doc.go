// Package coordinator is the control-plane state machine of a pool: jobs,
// their shards and planner prices, leases, reported result hashes,
// verification decisions and the receipt chain. A server proposes Commands
// (through Raft in a cluster), applies them with Machine.Apply, streams the
// returned Events and answers queries from the Machine.
//
// Invariants: Apply is deterministic — no I/O, no clock, no randomness;
// time and any choice arrive as fields of the commands (law 10) — so every
// replica that applies the same log holds the same state and the same
// StateHash. A refused command changes nothing. The machine sees result
// hashes only, never result bytes (law 3), and it does not import tensor,
// model or script (import_test.go). A receipt is minted for verified shards
// only, priced by the planner (law 8). See docs/coordinator.md.
package coordinator
