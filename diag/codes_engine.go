package diag

// Job specs and configs (SC1xxx).
var (
	YAMLSyntax      = define("SC1001", "malformed YAML")
	UnknownKey      = define("SC1002", "unknown key")
	WrongType       = define("SC1003", "value has the wrong type")
	MissingField    = define("SC1004", "required field missing")
	InvalidValue    = define("SC1005", "value out of range or invalid")
	FileUnreadable  = define("SC1006", "file cannot be read")
	ConfigDuplicate = define("SC1007", "key given twice")
	YAMLAliasBomb   = define("SC1008", "YAML aliases expand too far")
)

// Content and the sandbox (SC2xxx).
var (
	UnknownContent    = define("SC2001", "unknown content reference")
	StarlarkSyntax    = define("SC2002", "Starlark syntax error")
	StarlarkRuntime   = define("SC2003", "Starlark runtime error")
	StepBudget        = define("SC2004", "step budget exhausted")
	MemoryBudget      = define("SC2005", "memory budget exhausted")
	ContentShape      = define("SC2006", "content returned a value of the wrong shape")
	NoShards          = define("SC2007", "partitioner returned no shards")
	NonFinite         = define("SC2008", "NaN or Inf in a result")
	MissingFunction   = define("SC2009", "content lacks a required function")
	ForbiddenLoad     = define("SC2010", "load outside the catalog")
	NonDeterministic  = define("SC2011", "shard result differs between two executions")
	ContentKind       = define("SC2012", "content has the wrong kind for its role")
	CatalogDuplicate  = define("SC2013", "catalog already holds a different entry of that name")
	NativeArgument    = define("SC2014", "bad argument to a native function")
	ContentCancelled  = define("SC2015", "content execution cancelled")
	ShardBudgetLimits = define("SC2016", "result exceeds size limits")
	TopologyInvalid   = define("SC2017", "topology plan is not a tree of coordinator clusters placing every member once")
)

// Data files (SC3xxx).
var (
	CSVUnreadable   = define("SC3001", "CSV file cannot be read")
	CSVRagged       = define("SC3002", "CSV row has the wrong number of fields")
	CSVNoLabel      = define("SC3003", "label column missing")
	CSVBadNumber    = define("SC3004", "CSV field is not a number")
	CSVEmpty        = define("SC3005", "CSV has no data rows")
	DatasetTooSmall = define("SC3006", "dataset too small for the requested split")
	CSVTooWide      = define("SC3007", "CSV has more columns than a dataset may have")
)

// Trust and admission (SC4xxx).
var (
	OpenSecurityCritical = define("SC4001", "security-critical job refused on an open pool")
	OpenNonPublicInput   = define("SC4002", "non-public input refused on an open pool")
	OpenConfidential     = define("SC4003", "confidential content refused on an open pool")
	UnknownRegime        = define("SC4004", "unknown trust regime")
	UnknownInputClass    = define("SC4005", "unknown input class")
	ConsortiumNoDP       = define("SC4006", "DP is mandatory in a consortium pool")
	ConsortiumNoSecAgg   = define("SC4007", "secure aggregation is mandatory in a consortium pool")
	RegimeMismatch       = define("SC4008", "job regime does not match the pool")
)
