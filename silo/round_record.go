package silo

// record ends a contributed round: it keeps the run's new client state
// and notes the contribution in the record, the metrics and the log.
func (at *roundAttempt) record() {
	a := at.a
	if at.keepState {
		path, err := a.statePath(at.st.Run)
		if err == nil {
			err = saveState(path, at.out.State)
		}
		if err != nil {
			a.logf("%s: saving the client state: %v", at.subject, err)
		}
	}
	at.rec.Status = Contributed
	if at.paid != nil {
		a.countRound("resent")
		a.logf("%s: re-sent the update already paid for (release %s, ledger entry %s; nothing charged) to secure aggregation round %s on %s",
			at.subject, at.digest, at.paid.Hash.Short(), at.b.SecAgg.Round, at.base)
		return
	}
	a.countRound("contributed")
	a.logf("%s: contributed (secure aggregation round %s on %s, %s)", at.subject, at.b.SecAgg.Round, at.base, aggMode(at.b))
}
