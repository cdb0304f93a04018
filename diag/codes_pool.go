package diag

// Pools and coordination: the coordinator state machine, leases, results,
// verification and the receipt chain (SC7xxx).
var (
	PoolUnknownJob        = define("SC7001", "unknown job")
	PoolUnknownShard      = define("SC7002", "unknown shard")
	PoolBadJob            = define("SC7003", "malformed job submission")
	PoolJobConflict       = define("SC7004", "job ID already submitted with a different plan")
	PoolOpenNeedsReplicas = define("SC7005", "an open pool requires at least two replicas")
	PoolBadCommand        = define("SC7006", "malformed coordinator command")
	PoolNoLease           = define("SC7007", "result for a shard the peer never leased")
	PoolReportConflict    = define("SC7008", "peer already reported a different result for the shard")
	PoolLeaseNotLive      = define("SC7009", "no live lease to renew")
	PoolJobNotDecided     = define("SC7010", "job still has undecided shards")
	PoolReducedConflict   = define("SC7011", "a different reduced result is already recorded")
	PoolBadSnapshot       = define("SC7012", "coordinator snapshot cannot be restored")
	ReceiptChainBroken    = define("SC7013", "receipt chain fails verification")
	ReceiptMalformed      = define("SC7014", "malformed receipt")
	PoolJobCancelled      = define("SC7015", "job cancelled, or already done and not cancellable")
	PoolNoCommitment      = define("SC7016", "result reported without a commitment")
	PoolRevealMismatch    = define("SC7017", "revealed result does not open the commitment")
	PoolRevealEarly       = define("SC7018", "reveal before the shard's reveal is open")
	PoolPriceCap          = define("SC7019", "job priced over the operator's cap")
	PoolPlanBusy          = define("SC7020", "too many plans in flight")
	ContentKilled         = define("SC7021", "content on the aggregator killed at the operator's cap")
	// Spot checks (adaptive verification), numbered from SC7030.
	PoolDrawEarly    = define("SC7030", "audit draw with nothing to draw for")
	PoolNotExcluded  = define("SC7031", "re-admission of a peer that is not excluded")
	PoolBadMode      = define("SC7032", "verification mode the job or pool cannot use")
	PoolPeerExcluded = define("SC7033", "peer excluded after repeated failed checks")
)
