package coordinator

// Gauges are the counts an operator's dashboard shows (scellis_shards,
// scellis_jobs, scellis_runs, scellis_leases), read in one pass under the
// read lock at scrape time.
type Gauges struct {
	Shards map[ShardState]int // shards of running jobs by state
	Jobs   map[JobState]int
	Runs   map[RunState]int
	Leases int // live leases on shards of running jobs
}

// Gauges counts the state as of the last applied command.
func (m *Machine) Gauges() Gauges {
	m.mu.RLock()
	defer m.mu.RUnlock()
	g := Gauges{Shards: map[ShardState]int{}, Jobs: map[JobState]int{}, Runs: map[RunState]int{}}
	for _, j := range m.st.Jobs {
		g.Jobs[j.State]++
		if j.State != JobRunning {
			continue
		}
		for _, s := range j.Shards {
			st := s.State
			if st == StatePending && len(s.Leases) > 0 {
				st = StateLeased
			}
			g.Shards[st]++
		}
		for _, s := range j.Shards[j.cursor:] {
			g.Leases += len(s.Leases)
		}
	}
	for _, r := range m.st.Runs {
		g.Runs[r.State]++
	}
	return g
}
