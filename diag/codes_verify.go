package diag

// The verification regime: reproducibility tiers, content-declared
// comparisons, Freivalds checks and verdicts (SC72xx).
var (
	VerifyTierUnsupported  = define("SC7201", "content cannot honour the job's verification tier or method")
	VerifyNondeterministic = define("SC7202", "nondeterministic native called outside the convergent tier")
	VerifyBadVerdict       = define("SC7203", "verdict refused")
	VerifyCheckFailed      = define("SC7204", "a verifier's comparison or check could not run")
)
