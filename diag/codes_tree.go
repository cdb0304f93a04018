package diag

// A tree of coordinator clusters (docs/tree.md): a child cluster's
// delegate settings and the tree walk of `scellis receipts verify`
// (SC76xx).
var (
	DelegateConfig      = define("SC7601", "a child cluster's delegate settings do not match its parent federation")
	DelegateUnreachable = define("SC7602", "no aggregator of the parent cluster answers the delegate")
	TreeChildChain      = define("SC7603", "a cited child chain does not hold what the parent recorded")
	TreeRound           = define("SC7604", "a run's rounds cannot be summed over the tree of clusters")
	// SC7610… belong to a silo led by a child cluster that checks its
	// rounds with the parent (silo/parent.go).
	SiloParentConfig      = define("SC7610", "the silo's parent_federation does not list it under a child cluster")
	SiloParentMismatch    = define("SC7611", "the round the child cluster served is not the parent's")
	SiloParentUnreachable = define("SC7612", "no aggregator of the parent cluster answered the silo's check of a round")
)
