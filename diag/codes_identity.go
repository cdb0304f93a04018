package diag

// Identities, key files and federation files (SC11xx, part of the config
// range SC1xxx).
var (
	MemberRole         = define("SC1101", "unknown member role")
	PublicKeyMalformed = define("SC1102", "malformed public key")
	MemberDuplicate    = define("SC1103", "member name given twice")
	KeyFileUnreadable  = define("SC1104", "key file cannot be read or decrypted")
	KeyFileInsecure    = define("SC1105", "key file permissions too open")
	PublicKeyDuplicate = define("SC1106", "public key listed for two members")
	MemberAddress      = define("SC1107", "member address missing, malformed or misplaced")
	MemberName         = define("SC1108", "invalid federation or member name")
	NoAggregator       = define("SC1109", "federation has no aggregator")
	NotAMember         = define("SC1110", "identity is not a member of the federation")
	KeyFileExists      = define("SC1111", "key file already exists")
	KeyEncryption      = define("SC1112", "invalid key encryption settings")
)

// Membership changes through the Raft log (scellis federation
// add|revoke|rotate), SC1113 to SC1119.
var (
	MembershipSignature    = define("SC1113", "membership change not signed by an operator")
	MembershipUnknown      = define("SC1114", "membership change names no member")
	MembershipDuplicate    = define("SC1115", "member name, key or address already in the federation")
	MembershipLastOperator = define("SC1116", "revoking the last operator")
	MembershipQuorum       = define("SC1117", "revoking an aggregator the Raft cluster still counts on")
	MembershipStale        = define("SC1118", "membership changed meanwhile")
	MemberRefused          = define("SC1119", "the aggregators refused this member's key")
)
