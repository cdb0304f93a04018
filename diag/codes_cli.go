package diag

// The command line (SC12xx, part of the config range SC1xxx): a mistyped
// command or flag is refused input like a mistyped config key.
var (
	UnknownCommand = define("SC1201", "unknown command")
	UnknownFlag    = define("SC1202", "unknown flag")
	FlagValue      = define("SC1203", "flag value missing, malformed or out of range")
	BadArguments   = define("SC1204", "wrong command-line arguments")
	// CommandFailed is a command that failed (exit code 1) for a reason
	// without a code of its own: a file it could not write, a verification
	// that found a bad entry. It makes every error a diagnostic, in JSON
	// under --json.
	CommandFailed = define("SC1205", "the command failed")
	// InputTooLarge is an input that would not fit the process's memory
	// limit (internal/memlimit): refused before the runtime's fatal
	// out-of-memory.
	InputTooLarge = define("SC1206", "input too large for the process's memory limit")
)
