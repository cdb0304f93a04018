package diag

// Secure aggregation over the network (SC61xx): package secagg/wire, the
// data-plane host on the aggregator and the silo's side of a round.
var (
	SecAggWireForbidden   = define("SC6101", "caller may not act as this site in the round")
	SecAggWireNoRound     = define("SC6102", "secure aggregation round not open on this host")
	SecAggWireRoundOver   = define("SC6103", "secure aggregation round is over")
	SecAggWireConflict    = define("SC6104", "round ID already used with other parameters")
	SecAggWireBadRequest  = define("SC6105", "malformed, oversized or mistyped secure aggregation request")
	SecAggWireNotSilo     = define("SC6106", "round member is not a silo of the federation")
	SecAggWireUnavailable = define("SC6107", "secure aggregation host closed or at its round limit")
	SecAggWireGaveUp      = define("SC6108", "site gave up on the round before it completed")
	SecAggWireTooLate     = define("SC6109", "site's message arrived after its phase ended")
	SecAggWireBusy        = define("SC6110", "site holds too many requests on the round at once")
)
