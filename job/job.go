// Package job is the one pipeline every workload goes through: a Spec is
// compiled into a Plan (content resolved to refs, inputs hashed, the job ID
// computed, shards partitioned and priced), shards are executed into
// Results, and accepted results are reduced in shard-index order.
//
// Invariants: a job's ID is the hash of its canonical spec including the
// refs of every piece of content and input it references, so the same job
// has the same ID everywhere; a shard's ID is the hash of (job ID, index,
// parameters); reduction order is shard index, never arrival order.
package job
