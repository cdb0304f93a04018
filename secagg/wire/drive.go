package wire

import (
	"time"

	"github.com/scellis/scellis/diag"
)

// drive runs one round's phases (its scheme's run), publishes its outcome,
// and forgets the round once the outcome is taken or expires.
func (h *Host) drive(rd *hostRound) {
	defer h.wg.Done()
	err := rd.state.run(&runner{h: h, rd: rd})
	rd.end(err)
	if h.opt.OnFinish != nil {
		h.opt.OnFinish(rd.id, err)
	}
	taken := rd.taken
	if rd.sch.linger {
		taken = nil // it stays for its late sites, taken or not
	}
	t := time.NewTimer(h.opt.ResultTTL)
	select {
	case <-taken:
	case <-t.C:
	case <-h.quit:
	}
	t.Stop()
	h.forget(rd)
}

// runner is what a scheme's run sees of the host: phases that end once
// every site they wait for has answered, or at their deadline.
type runner struct {
	h          *Host
	rd         *hostRound
	advertised time.Duration // how long the advertise phase took
}

// phase waits for the round's current phase, named name, under the
// deadline in slot, then ends it with end (which publishes what the phase
// ends with). An error — the host closed, the round was aborted, end
// failed — ends the round.
func (r *runner) phase(name string, s slot, end func() error) error {
	began := time.Now()
	d := r.rd.dl.of(s)
	if s == slotMask && r.rd.dl.TrainInMask {
		// The sites train in this phase: what the advertise phase left
		// of its deadline is theirs (Advertise + Share + Mask still
		// bounds the round up to here).
		d += max(r.rd.dl.Advertise-r.advertised, 0)
	}
	if err := r.h.await(r.rd, d); err != nil {
		return err
	}
	if err := end(); err != nil {
		return err
	}
	if s == slotAdvertise {
		r.advertised = time.Since(began)
	}
	if r.h.opt.OnPhase != nil {
		r.h.opt.OnPhase(r.rd.id, name, time.Since(began))
	}
	return nil
}

// await waits until the current phase has heard from every site it waits
// for, or for d; it fails when the host closes or the round is aborted.
func (h *Host) await(rd *hostRound, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	for rd.waiting() {
		select {
		case <-rd.kick:
		case <-t.C:
			return nil
		case <-h.quit:
			select {
			case <-rd.aborted: // the abort's reason says more
				return rd.abortErr
			default:
			}
			return diag.New(diag.SecAggWireUnavailable, rd.subject(), "the aggregator's secure aggregation host closed during the round").
				WithHelp("the round ends without a result; run it again under a new round ID")
		case <-rd.aborted:
			return rd.abortErr
		}
	}
	return nil
}
