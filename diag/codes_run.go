package diag

// Federated training runs in the coordinator (SC93xx).
var (
	RunTooFewSites = define("SC9301", "a training run or round needs at least three sites")
	RunUnknown     = define("SC9302", "unknown training run")
	RunBadRound    = define("SC9303", "round does not fit the run")
	RunConflict    = define("SC9304", "run ID already started with a different plan")
	RunNotRunning  = define("SC9305", "the run is not running")
	// SC9310… belong to runs that survive their cluster (retry, pause,
	// resume, cancel, warm start).
	RunNotResumable = define("SC9310", "the run cannot be resumed")
	RunWarmStart    = define("SC9312", "the warm-start model does not fit the run")
)
