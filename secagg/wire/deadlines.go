package wire

import (
	"time"

	"github.com/scellis/scellis/diag"
)

// Deadlines bound each phase of a round, counted from the moment the phase
// begins (Advertise from Open). A phase ends early once every site it
// waits for has answered; at its deadline it ends with the sites it has,
// and the others count as dropped out. A zero field takes the default of
// DefaultDeadlines. A threshold-he round bounds its ciphertexts by Mask and
// each decryption attempt by Unmask.
type Deadlines struct {
	// Advertise must cover the sites' local training: a site that calls
	// Participate with its finished, charged update advertises only after
	// training (but see TrainInMask).
	Advertise time.Duration
	Share     time.Duration
	// Mask must cover uploading a masked vector of 8·(Dim+1) bytes.
	Mask time.Duration
	// Consistency is the consistency round: every survivor signs the
	// survivor set. Zero takes the Unmask deadline (one more exchange of
	// the same small size), so callers that set only Unmask bound both.
	Consistency time.Duration
	Unmask      time.Duration
	// TrainInMask says the sites advertise before they train
	// (ParticipateBeforeInput, as silos do: the key exchange runs while
	// they train and charge), so their training falls in the mask phase:
	// that phase then also has what the advertise phase left of
	// Advertise. The round's worst case is unchanged.
	TrainInMask bool
}

// DefaultDeadlines are the deadlines of a zero Deadlines field.
func DefaultDeadlines() Deadlines {
	return Deadlines{Advertise: 10 * time.Minute, Share: time.Minute, Mask: 2 * time.Minute, Consistency: time.Minute, Unmask: time.Minute}
}

// Total is the longest a round under d can take: the sum of its phases'
// deadlines, each zero one at its default (every default for invalid d).
func (d Deadlines) Total() time.Duration {
	d, err := d.withDefaults()
	if err != nil {
		d = DefaultDeadlines()
	}
	return d.Advertise + d.Share + d.Mask + d.Consistency + d.Unmask
}

func (d Deadlines) withDefaults() (Deadlines, error) {
	def := DefaultDeadlines()
	fields := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{{"advertise", &d.Advertise, def.Advertise}, {"share", &d.Share, def.Share}, {"mask", &d.Mask, def.Mask}, {"consistency", &d.Consistency, def.Consistency}, {"unmask", &d.Unmask, def.Unmask}}
	if d.Consistency == 0 && d.Unmask > 0 {
		d.Consistency = d.Unmask
	}
	for _, f := range fields {
		if *f.v < 0 {
			return d, diag.New(diag.SecAggBadParams, "secure aggregation deadlines", "the %s deadline is negative (%v)", f.name, *f.v).
				WithHelp("give each phase a positive duration, or 0 for the default %v", f.def)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	return d, nil
}

// slot names the deadline a phase runs under.
type slot int

const (
	slotAdvertise slot = iota
	slotShare
	slotMask
	slotConsistency
	slotUnmask
)

// of is the deadline of slot s (d with its defaults).
func (d Deadlines) of(s slot) time.Duration {
	return [...]time.Duration{d.Advertise, d.Share, d.Mask, d.Consistency, d.Unmask}[s]
}
