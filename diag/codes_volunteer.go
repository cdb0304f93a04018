package diag

// Browser volunteers: the join endpoint and the volunteer API (SC75xx).
var (
	VolunteerClosed       = define("SC7501", "volunteers cannot join this pool: it is not open")
	VolunteerBadChallenge = define("SC7502", "join challenge refused: malformed, forged, expired, for another key, or already used")
	VolunteerBadProof     = define("SC7503", "join refused: the proof of work or the key's signature does not check")
	VolunteerRateLimited  = define("SC7504", "too many join requests from this address, or from everyone at once")
	VolunteerNoSession    = define("SC7505", "volunteer request without a live session: no token, an unknown or expired one")
	VolunteerBadRequest   = define("SC7506", "malformed volunteer request")
	VolunteerFull         = define("SC7507", "the node holds as many volunteer sessions as it allows")
	VolunteerNotLeader    = define("SC7508", "no leader this node can reach, so it cannot lease to volunteers now")
	VolunteerUnrunnable   = define("SC7509", "a leased job cannot run in a browser: it reads input tables")
	VolunteerLeaseCap     = define("SC7510", "a volunteer asked for more shards while holding as many leases as it may at once")
)
