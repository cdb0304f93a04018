package diag

// Studio, the live web view (SC74xx).
var (
	StudioNoViewer     = define("SC7401", "Studio request without a viewer token or member certificate")
	StudioTokenRefused = define("SC7402", "Studio viewer token refused: malformed, forged, expired or too long-lived")
	StudioForbidden    = define("SC7403", "Studio viewer may not see this: another silo's ledger")
	StudioBusy         = define("SC7404", "Studio viewer holds too many event streams at once")
)
