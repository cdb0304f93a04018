package silo

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// roundJournal is the file in data_dir where the silo notes every round
// it accepted (after its policy said yes, before it trains), one line
// "v1 UNIXNANO ROUND RUN", fsync'd. The ledger only records rounds that were
// charged; a round declined afterwards for an error (a model or content
// error a run author can trigger) must count against max_rounds_per_day
// too, also after a restart, or probing the silo's data with failing
// rounds would cost nothing.
const roundJournal = "rounds.journal"

// startRecordRound notes round k as accepted at t, in memory and in the
// journal, and leaves the journal's write and fsync running while the
// round fetches what it needs (issue 19: the fsync was a wait of its own
// on every round's path). A journal that cannot be written is logged, not
// fatal: the in-memory log still counts the round until the process ends.
// The returned wait blocks until the line is durable; the round calls it
// before it reads the run's data (and so before the run's content runs on
// it) and before it returns (before a decline is reported), so a round
// that fails or crashes the silo from then on is counted across restarts.
// It may be called more than once.
func (a *Appliance) startRecordRound(k RoundKey, t time.Time) (wait func()) {
	a.Rounds.Record(k, t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.journalRound(k, t)
	}()
	return func() { <-done }
}

// journalRound appends round k's line to the journal, fsync'd.
func (a *Appliance) journalRound(k RoundKey, t time.Time) {
	path := filepath.Join(a.Config.DataDir, roundJournal)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err == nil {
		_, err = fmt.Fprintf(f, "v1 %d %d %s\n", t.UnixNano(), k.Round, k.Run)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		a.logf("noting round %d of run %s in %s: %v", k.Round, k.Run, path, err)
	}
}

// readRoundJournal records in a.Rounds every journal entry at or after
// since. Lines it cannot parse (a torn last line) are skipped.
func (a *Appliance) readRoundJournal(since time.Time) error {
	f, err := os.Open(filepath.Join(a.Config.DataDir, roundJournal))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 4 || fields[0] != "v1" {
			continue
		}
		ns, err1 := strconv.ParseInt(fields[1], 10, 64)
		r, err2 := strconv.Atoi(fields[2])
		if err1 != nil || err2 != nil || r < 0 {
			continue
		}
		if at := time.Unix(0, ns); !at.Before(since) {
			a.Rounds.Record(RoundKey{Run: fields[3], Round: r}, at)
		}
	}
	return sc.Err()
}
