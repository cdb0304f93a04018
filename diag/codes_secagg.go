package diag

// Secure aggregation (SC6xxx).
var (
	SecAggBadParams      = define("SC6001", "invalid secure aggregation parameters")
	SecAggTooFewSites    = define("SC6002", "fewer than three sites in a secure aggregation round")
	SecAggBadThreshold   = define("SC6003", "secure aggregation threshold must exceed half the sites")
	SecAggBelowThreshold = define("SC6004", "fewer surviving sites than the threshold")
	SecAggBadSignature   = define("SC6005", "key advert unsigned or mis-signed")
	SecAggDuplicate      = define("SC6006", "duplicated advert or message")
	SecAggWrongRound     = define("SC6007", "message from another round")
	SecAggWrongLength    = define("SC6008", "input vector has the wrong length")
	SecAggOutOfRange     = define("SC6009", "input value out of range")
	SecAggBothSecrets    = define("SC6010", "asked to reveal both secrets of one site")
	SecAggOutOfOrder     = define("SC6011", "message out of order for the round's phase")
	SecAggUnknownSite    = define("SC6012", "site not part of the round")
	SecAggMalformed      = define("SC6013", "malformed secure aggregation message")
	SecAggDecrypt        = define("SC6014", "encrypted share fails authentication")
	SecAggInconsistent   = define("SC6015", "reconstructed secret does not match its commitment")
	SecAggParamsMismatch = define("SC6016", "round parameters differ between sites")
	SecAggAborted        = define("SC6017", "client already aborted the round")
	SecAggEquivocation   = define("SC6018", "aggregator's survivor set fails the consistency check")
	SecAggRelayed        = define("SC6019", "a relayed sub-cohort sum opens only at the parent")
)
