package spot

// Adaptive replication (BOINC's, adapted). A peer earns trust by results
// that were checked and found valid; a peer is trusted once its streak of
// consecutive valid checked results reaches Params.TrustAfter, and from
// then on each of its shards is audited with probability 1/AuditOneIn
// instead of always. A failed check resets the streak (the peer is
// replicated in full again), counts an offence, and asks for the peer's
// recent accepted results to be re-checked; a peer with ExcludeAfter
// offences is excluded until an operator re-admits it.

// Params are the adaptive-replication knobs. They are part of a pool's
// configuration: every replica must use the same.
type Params struct {
	// TrustAfter is how many consecutive valid checked results make a peer
	// trusted (BOINC's adaptive_replication_min_valid).
	TrustAfter int
	// AuditOneIn: a trusted peer's shard is audited with probability
	// 1/AuditOneIn.
	AuditOneIn int
	// ExcludeAfter is the offences (failed checks) after which a peer is
	// excluded.
	ExcludeAfter int
	// Window bounds how many of a caught peer's most recent accepted
	// results are re-checked.
	Window int
}

// DefaultParams: trusted after 5 consecutive valid checks, then audited one
// shard in 5 (the 1/N of BOINC's rule), excluded at the second offence,
// and the last 1000 accepted results re-checked when caught.
var DefaultParams = Params{TrustAfter: 5, AuditOneIn: 5, ExcludeAfter: 2, Window: 1000}

// Record is what the pool knows of a peer's verified behaviour. It is
// part of the replicated state: update it only with Observe and Readmit.
type Record struct {
	// Streak counts consecutive checked results found valid.
	Streak int `cbor:"streak,omitempty" json:"streak"`
	// Checked counts checked results found valid, ever.
	Checked int `cbor:"checked,omitempty" json:"checked"`
	// Failed counts checks the peer failed, Stamped those where, as the
	// auditor, it approved a result found wrong (a rubber stamp).
	Failed  int `cbor:"failed,omitempty" json:"failed"`
	Stamped int `cbor:"stamped,omitempty" json:"stamped"`
	// Offences counts failed checks since the last re-admission.
	Offences int `cbor:"offences,omitempty" json:"offences"`
	// Excluded peers get no leases until an operator re-admits them.
	Excluded bool `cbor:"excluded,omitempty" json:"excluded"`
}

// Trusted reports whether the peer runs shards alone, audited at random.
func (r Record) Trusted(p Params) bool {
	return !r.Excluded && r.Streak >= p.TrustAfter
}

// Verdict is the outcome of one check of a peer's result.
type Verdict int

const (
	// Valid: the result agreed with the verified result.
	Valid Verdict = iota
	// Invalid: the result differed from the verified result.
	Invalid
	// Stamp: the peer, checking another's result, agreed with a result
	// later found wrong.
	Stamp
)

// Action is what the pool must do after a verdict.
type Action struct {
	// Recheck: re-check the peer's recent accepted results (RecheckWindow).
	Recheck bool
	// Exclude: the peer has just been excluded.
	Exclude bool
}

// Observe updates r with one verdict and says what follows from it.
func Observe(r *Record, v Verdict, p Params) Action {
	if v == Valid {
		r.Streak++
		r.Checked++
		return Action{}
	}
	r.Streak = 0
	r.Failed++
	if v == Stamp {
		r.Stamped++
	}
	r.Offences++
	a := Action{Recheck: true}
	if !r.Excluded && r.Offences >= p.ExcludeAfter {
		r.Excluded = true
		a.Exclude = true
	}
	return a
}

// Readmit lifts an exclusion: the peer starts again as a new peer, fully
// replicated until it earns trust again. Its history (Checked, Failed,
// Stamped) stays.
func Readmit(r *Record) {
	r.Excluded = false
	r.Offences = 0
	r.Streak = 0
}
