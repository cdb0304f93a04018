package diag

// Silo policy: a silo's refusals of a round request, checked against its
// config and its ledger before it does anything (SC92xx).
var (
	SiloStrategyRefused  = define("SC9201", "strategy not accepted by the silo's policy")
	SiloEpsilonPerRound  = define("SC9202", "round's ε above the silo's per-round maximum")
	SiloNoiseTooLow      = define("SC9203", "noise multiplier below the silo's minimum")
	SiloCohortTooSmall   = define("SC9204", "cohort smaller than the silo's minimum")
	SiloRoundsPerDay     = define("SC9205", "silo's rounds per day used up")
	SiloUnknownDataset   = define("SC9206", "dataset unknown to the silo")
	SiloBudgetOverdraft  = define("SC9207", "round would overdraw the dataset's privacy budget")
	SiloUnitMismatch     = define("SC9208", "round's unit of privacy differs from the dataset's")
	SiloUnpriced         = define("SC9209", "round's privacy cost cannot be bounded")
	SiloStateUnavailable = define("SC9210", "silo's ledger or round log cannot be read")
	SiloAggregationMode  = define("SC9211", "round's secure-aggregation mode not allowed by the silo's policy")
	SiloThresholdLow     = define("SC9212", "round's secure-aggregation threshold below the silo's bound against an active aggregator")
	SiloModelTooLarge    = define("SC9213", "round's model or bytes above the silo's policy bound")
	SiloRowsNotPublic    = define("SC9215", "run releases a row count the silo's dataset does not declare public")
	SiloRoundFailed      = define("SC9230", "silo could not complete the round (details in the silo's log)")
	SiloRestarted        = define("SC9231", "silo stopped after paying for the round, before the round completed")
)
