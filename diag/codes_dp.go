package diag

// Privacy: the accountant, noise and the privacy ledger (SC5xxx).
var (
	DPBadSigma          = define("SC5001", "noise multiplier must be positive")
	DPBadQ              = define("SC5002", "sampling rate outside (0, 1]")
	DPBadDelta          = define("SC5003", "δ outside (0, 1)")
	DPBadEpsilon        = define("SC5004", "ε must be finite and non-negative")
	DPBadOrder          = define("SC5005", "invalid Rényi order")
	DPBadSteps          = define("SC5006", "invalid number of steps")
	DPUnknownMechanism  = define("SC5007", "unknown privacy mechanism")
	DPUnknownConversion = define("SC5008", "unknown RDP conversion")
	DPUnreachable       = define("SC5009", "target ε cannot be reached")
	LedgerOverdraft     = define("SC5010", "charge would overdraw the privacy budget")
	LedgerNoBudget      = define("SC5011", "dataset has no budget in the ledger")
	LedgerBudgetExists  = define("SC5012", "dataset budget already declared")
	LedgerNotLedger     = define("SC5013", "file is not a privacy ledger")
	LedgerCorrupt       = define("SC5014", "ledger fails verification")
	LedgerKeyMismatch   = define("SC5015", "key does not match the ledger")
	LedgerKeyFile       = define("SC5016", "key file cannot be read")
	LedgerExists        = define("SC5017", "ledger already exists")
	LedgerUnreadable    = define("SC5018", "ledger file cannot be opened")
	LedgerBadName       = define("SC5019", "invalid dataset or consumer name")
)
