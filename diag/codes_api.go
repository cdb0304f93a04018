package diag

// The control-plane API and the blob endpoint (SC71xx).
var (
	PoolUnknownPeer = define("SC7101", "caller is not a federation member")
	PoolBadRequest  = define("SC7102", "malformed or oversized API request")
	PoolNoLeader    = define("SC7103", "no leader can accept the write")
	BlobRefused     = define("SC7104", "blob upload refused")
	BlobMissing     = define("SC7105", "blob not found")
	WorkerConfig    = define("SC7106", "worker or aggregator config problem")
	PoolStaleRead   = define("SC7107", "aggregator cut off from the cluster; its state may be stale")
	PoolForbidden   = define("SC7108", "the caller's role, or ownership, does not allow the request")
	PoolBusy        = define("SC7109", "caller holds too many long-lived requests at once")
)
