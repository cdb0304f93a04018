package diag

// Consensus: the Raft layer of the aggregator cluster (SC8xxx).
var (
	ConsensusConfig   = define("SC8001", "invalid consensus configuration")
	ConsensusStore    = define("SC8002", "consensus data directory cannot be used")
	ConsensusListen   = define("SC8003", "raft address cannot be bound")
	ConsensusRefused  = define("SC8004", "new server refused at the TLS handshake")
	ConsensusSnapshot = define("SC8005", "raft snapshot cannot be restored")
)
