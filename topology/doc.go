// Package topology turns a catalog entry of kind topology into a validated
// Plan: the tree of coordinator clusters a pool runs as, which aggregators
// replicate each cluster, which silos and workers each cluster leads, and the
// fan-out limit the tree keeps.
//
// A topology is content, like a strategy: a Starlark file defining
// topology(members, params), evaluated in the sandbox (package script) with
// the catalog's load(). The built-ins flat and tree take exactly the same
// path as a user's file; nothing here branches on their names.
//
// The API, for the engine and the CLI:
//
//	e, err := topology.Resolve(cat, "tree", baseDir)    // or a path to a .star file
//	plan, err := topology.Evaluate(ctx, cat, e, topology.Members(fed), params)
//	plan.Root()                 // the top cluster: researchers and operators talk to it
//	plan.ClusterOf("hospital-a") // the cluster leading (or replicated by) a member
//	plan.Children("root")       // child clusters, in the order the topology gave
//	plan.SubCohort("leaf-0")    // the silos whose round a cluster aggregates
//
// Invariants of every Plan Evaluate returns (else a diag.Diagnostic):
// exactly one root; every other cluster's parent exists and the parent links
// form a tree (no cycle); every aggregator is a node of exactly one cluster
// and every silo and worker is led by exactly one cluster (people are not
// placed: they call the root); every cluster has at least one node; no
// cluster leads more members plus child clusters than the declared fan-out;
// and no cluster leads one or two silos unless it is the only cluster
// leading silos (each secure-aggregation sub-cohort keeps the three-site
// minimum). Where partial sums form follows from the tree: a cluster leading
// silos sums its sub-cohort; a parent sums its children's sums.
//
// Simulate (simulate.go) counts the control messages each coordinator
// cluster handles per round under a plan; see docs/topology.md.
package topology
