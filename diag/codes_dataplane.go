package diag

// The peer-to-peer data plane (SC72xx, part of the pools range SC7xxx):
// signalling through the aggregators' mailboxes, data-channel transfers
// and the TURN relay.
var (
	P2PSignalRefused = define("SC7201", "data-plane signalling refused: malformed, bad signature or fingerprint")
	P2PMailboxFull   = define("SC7202", "data-plane signalling mailbox full or message too large")
	P2PConfig        = define("SC7203", "data-plane (ICE, STUN, TURN) config problem")
	P2PTransfer      = define("SC7204", "blob transfer over a data channel refused")
)
