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
