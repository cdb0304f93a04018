package diag

// The verification regime: reproducibility tiers, content-declared
// comparisons, Freivalds checks and verdicts (SC73xx).
var (
	VerifyTierUnsupported  = define("SC7301", "content cannot honour the job's verification tier or method")
	VerifyNondeterministic = define("SC7302", "nondeterministic native called outside the convergent tier")
	VerifyBadVerdict       = define("SC7303", "verdict refused")
	VerifyCheckFailed      = define("SC7304", "a verifier's comparison or check could not run")
	VerifyBadSignature     = define("SC7305", "report or verdict not signed by its peer's federation key")
	ReceiptUnsigned        = define("SC7306", "receipt not signed by the peers it credits")
)
