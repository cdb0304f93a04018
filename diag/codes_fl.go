package diag

// Federated training: strategies, client and server steps (SC91xx).
var (
	FLContract      = define("SC9101", "strategy broke the client or server step contract")
	FLDPSteps       = define("SC9102", "record-level DP step allowance of a client step spent")
	FLDimension     = define("SC9103", "updates of one round differ in length")
	FLUnprotected   = define("SC9104", "record-level DP: update released without DP-SGD training")
	FLBadPrivacy    = define("SC9105", "invalid privacy parameters for a client step")
	FLBadSimulation = define("SC9106", "invalid federated simulation options")
	FLCrossCheck    = define("SC9107", "two aggregator nodes computed different outcomes of a training round")
)

// Models: model files, their evaluation and the data they are scored on (SC94xx).
var (
	ModelFileBad        = define("SC9401", "model file cannot be used")
	ModelFormatUnknown  = define("SC9402", "model file of an unknown format version")
	ModelColumnsMissing = define("SC9403", "data lacks columns the model needs")
	ModelLabelUnknown   = define("SC9404", "label not among the model's classes")
	ModelNoStatistics   = define("SC9405", "federated feature statistics cannot be released")
	ModelSignatureBad   = define("SC9406", "model file does not match its signature")
	ModelUnsigned       = define("SC9407", "model file carries no signature")
	ModelSignerUnknown  = define("SC9408", "model file signed by no aggregator of the federation")
)
