package secagg

import (
	"sync"

	"github.com/scellis/scellis/diag"
)

// Accumulator sums a round's masked inputs as the server does, apart from
// any server: another node that is sent each masked input as the server
// accepts it keeps their sum here, and replays the round with it
// (secagg/wire.Replay) instead of holding every input until then. It
// learns nothing a masked input does not carry: each is uniformly random
// alone, and so is their sum until the round's masks are removed. An
// Accumulator is safe for concurrent use.
type Accumulator struct {
	mu  sync.Mutex
	r   *round
	acc []byte
	in  map[string]bool
}

// NewAccumulator returns an empty sum for the round p.
func NewAccumulator(p Params) (*Accumulator, error) {
	r, err := newRound(p)
	if err != nil {
		return nil, err
	}
	return &Accumulator{r: r, acc: make([]byte, r.lay.size()), in: map[string]bool{}}, nil
}

// Add adds a member's masked input, once: a second input of the same
// member, a non-member's or one of another length is refused.
func (a *Accumulator) Add(m *MaskedInput) error {
	if m == nil || m.Round != a.r.id {
		return malformed("masked input", "not of round %q", a.r.id)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.r.members[m.From] == nil:
		return malformed("masked input", "from %q, not a member of round %q", m.From, a.r.id)
	case a.in[m.From]:
		return malformed("masked input", "a second one from %q", m.From)
	case len(m.Masked) != a.r.lay.size():
		return diag.New(diag.SecAggWrongLength, a.r.subject(), "masked input from %q has %d bytes, want %d", m.From, len(m.Masked), a.r.lay.size())
	}
	addVectors(a.acc, m.Masked, a.r.lay)
	a.in[m.From] = true
	return nil
}

// Sum returns the sum so far (a copy) and the members whose inputs it
// holds.
func (a *Accumulator) Sum() ([]byte, map[string]bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	in := make(map[string]bool, len(a.in))
	for k := range a.in {
		in[k] = true
	}
	return append([]byte(nil), a.acc...), in
}
