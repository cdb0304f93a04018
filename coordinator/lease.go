package coordinator

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/verify/spot"
)

// MaxLeaseTTL bounds one lease (30 days in ms).
const MaxLeaseTTL int64 = 30 * 24 * 3600 * 1000

// A browser volunteer holds at most DefaultVolunteerLeases live leases
// at once (Lease.Hold changes it, up to MaxVolunteerLeases): a tab runs
// one shard per Web Worker, so more leases than its workers are shards
// hoarded from other peers until they expire.
const (
	DefaultVolunteerLeases = 8
	MaxVolunteerLeases     = 64
)

// maxTime bounds the Now of commands so Now+TTL cannot overflow.
const maxTime int64 = math.MaxInt64 - MaxLeaseTTL

// Lease rules, in one place:
//   - a lease is live while the machine's clock is before its expiry; a
//     clock advance (any command with a Now) ends every lease whose expiry
//     is ≤ Now, and its shard can be leased again;
//   - a peer holds at most one live lease per shard, and never gets a
//     lease on a shard it has reported for (it may lease a shard again
//     after its lease on it expired without a report);
//   - a shard is leased only while it needs replicas: while the reports
//     plus live leases are fewer than the smallest number of further
//     agreeing reports that could verify it (see need);
//   - grants go to training rounds' shards first (a silo's round never
//     waits behind generic work its lease could have been given), then to
//     jobs in submission order, shards in index order — for a browser
//     volunteer, in a keyed random order it cannot predict
//     (volunteerOrder);
//   - a lease that names kinds (Lease.Kinds) is granted shards of those
//     kinds only;
//   - a lease with an Origin is not granted a shard another peer of the
//     same origin holds a live lease on or answered (sameOrigin);
//   - in an open pool a volunteer without standing is not granted a
//     quorum shard another volunteer without standing holds a live lease
//     on or answered (standing.go);
//   - when a shard is decided its remaining leases are revoked.

func (m *Machine) lease(c Lease) Result {
	if d := firstOf(checkPeer(c.Peer), checkTime(c.Now), checkTTL(c.TTL), m.revokedPeer(c.Peer)); d != nil {
		return refuse(d)
	}
	if c.Max < 0 || len(c.RequestID) > maxName || c.Hold < 0 || c.Hold > MaxVolunteerLeases {
		return refuse(badCommand("lease: max %d must be ≥ 0, hold %d within 0 to %d and a request ID at most %d bytes", c.Max, c.Hold, MaxVolunteerLeases, maxName))
	}
	if d := c.Kinds.Check(); d != nil {
		return refuse(badCommand("lease: %s", d.Message))
	}
	if c.Job != "" && m.jobs[string(c.Job)] == nil {
		return refuse(unknownJob(c.Job))
	}
	memoAt := memoKey(c.Peer, c.Kinds)
	if c.RequestID != "" {
		if memo := m.st.LeaseMemo[memoAt]; memo != nil && memo.RequestID == c.RequestID {
			return Result{Response: &LeaseResponse{Grants: slices.Clone(memo.Grants), Jobs: m.leaseJobs(memo.Grants)}}
		}
	}

	now := m.clock(c.Now)
	limit := max(c.Max, 1)
	if receipt.IsVolunteer(c.Peer) {
		hold := c.Hold
		if hold == 0 {
			hold = DefaultVolunteerLeases
		}
		held := m.liveLeasesOf(c.Peer, now)
		if held >= hold {
			return refuse(diag.New(diag.VolunteerLeaseCap, "volunteer "+c.Peer,
				"%s already holds %d live leases, as many as a volunteer may hold at once (%d)", c.Peer, held, hold).
				WithHelp("report or hand back a leased shard before asking for another; the page runs one shard per Web Worker, so use at most %d workers (the operator sets volunteer_max_leases)", hold))
		}
		limit = min(limit, hold-held) // clipped: never more than the cap
	}
	events := m.advance(now)
	grants := []LeaseGrant{}
	// Rounds first, then audits reserved for the peer (adaptive jobs),
	// then the rest.
	for pass := range leasePasses {
		for _, j := range m.st.Jobs {
			if len(grants) == limit {
				break
			}
			if j.State != JobRunning || (c.Job != "" && j.ID != c.Job) || !c.Kinds.admits(j) || !pass.takes(j) {
				continue
			}
			order := m.volunteerOrder(j, c.Peer)
			for k := j.cursor; k < len(j.Shards) && len(grants) < limit; k++ {
				s := j.Shards[order(k)]
				if !pass.shard(s) || !m.eligible(j, s, c.Peer, now) || sameOrigin(s, c.Peer, c.Origin, now) {
					continue
				}
				ttl := c.TTL
				if ttl == 0 {
					ttl = j.Policy.LeaseTTL
				}
				expiry := now + ttl
				s.addLease(c.Peer, expiry)
				if c.Origin != "" {
					if s.Origins == nil {
						s.Origins = map[string]string{}
					}
					s.Origins[c.Peer] = c.Origin
				}
				m.nextExpiry = min(m.nextExpiry, expiry)
				grants = append(grants, LeaseGrant{Job: j.ID, Shard: s.Index, ShardID: s.ID, Price: s.Price, Expiry: expiry})
				events = append(events, ShardLeased{Job: j.ID, Shard: s.Index, Peer: c.Peer, Expiry: expiry})
			}
		}
	}
	// Every peer that asks is recorded, granted or not: it is then a
	// candidate auditor for adaptive jobs (spotcheck.go), unless it asks
	// for rounds alone.
	rec := m.peer(c.Peer)
	rec.Leases += len(grants)
	rec.RoundsOnly = !c.Kinds.Has(KindGeneric)
	if c.RequestID != "" {
		if m.st.LeaseMemo == nil {
			m.st.LeaseMemo = map[string]*leaseMemo{}
		}
		m.st.LeaseMemo[memoAt] = &leaseMemo{RequestID: c.RequestID, Grants: slices.Clone(grants)}
	}
	return Result{Response: &LeaseResponse{Grants: grants, Jobs: m.leaseJobs(grants)}, Events: events}
}

// volunteerOrder maps the k-th shard a lease looks at (cursor ≤ k <
// len(Shards)) to a shard index. Members get index order. A browser
// volunteer on a job with a seed gets a pseudo-random permutation of the
// undecided range (shuffle), keyed by SHA-256(seed, peer, leases granted
// to the peer so far): the seed is 16 bytes from crypto/rand that the
// submitting node keeps from peers, so no volunteer can predict which
// shards it, or another key of its own, will be offered, nor learn the
// order of the rest from the shards it got (not a rotation: a keyed
// permutation), and the order is new at every lease.
func (m *Machine) volunteerOrder(j *jobState, peer string) func(int) int {
	n := len(j.Shards) - j.cursor
	if len(j.Seed) == 0 || n <= 1 || !receipt.IsVolunteer(peer) {
		return func(k int) int { return k }
	}
	h := sha256.New()
	h.Write([]byte(j.Seed))
	h.Write([]byte(peer))
	var leases [8]byte
	if rec := m.st.Peers[peer]; rec != nil {
		binary.BigEndian.PutUint64(leases[:], uint64(rec.Leases))
	}
	h.Write(leases[:])
	p := newShuffle(h.Sum(nil), uint64(n))
	return func(k int) int { return j.cursor + int(p.at(uint64(k-j.cursor))) }
}

// shuffle is a keyed pseudo-random permutation of [0, n): a four-round
// Feistel network over the smallest even number of bits that holds n,
// with AES-128 as its round function, walked in cycles until the value
// falls below n (at most 4 walks expected, since the domain is < 4n).
// It costs O(1) per position, so a lease that looks at a few shards of a
// large job does not shuffle all of them.
type shuffle struct {
	block cipher.Block
	n     uint64
	half  uint   // bits of each half
	mask  uint64 // 1<<half - 1
}

func newShuffle(key []byte, n uint64) shuffle {
	b, err := aes.NewCipher(key[:16])
	if err != nil {
		panic("coordinator: AES-128 with a 16-byte key: " + err.Error())
	}
	half := uint(1)
	for uint64(1)<<(2*half) < n {
		half++
	}
	return shuffle{block: b, n: n, half: half, mask: 1<<half - 1}
}

func (p shuffle) at(k uint64) uint64 {
	x := k
	for {
		x = p.feistel(x)
		if x < p.n {
			return x
		}
	}
}

func (p shuffle) feistel(x uint64) uint64 {
	l, r := x>>p.half, x&p.mask
	var in, out [16]byte
	for round := range 4 {
		in[0] = byte(round)
		binary.BigEndian.PutUint64(in[8:], r)
		p.block.Encrypt(out[:], in[:])
		l, r = r, l^(binary.BigEndian.Uint64(out[:8])&p.mask)
	}
	return l<<p.half | r
}

// leasePass is one pass of a lease over the running jobs. The passes, in
// grant order: training rounds' shards, then audits reserved for the peer
// (adaptive jobs), then every other shard.
type leasePass uint8

const (
	passRounds leasePass = iota
	passAudits
	passRest
	leasePasses
)

// takes reports whether the pass looks at j's shards at all.
func (p leasePass) takes(j *jobState) bool {
	switch p {
	case passRounds:
		return kindOf(j) == KindRound
	case passAudits:
		return kindOf(j) == KindGeneric && adaptive(j)
	}
	return kindOf(j) == KindGeneric
}

// shard reports whether the pass grants s (of a job it takes).
func (p leasePass) shard(s *shardState) bool {
	switch p {
	case passAudits:
		return s.Audit == auditAudited
	case passRest:
		return s.Audit != auditAudited
	}
	return true
}

// leaseJobs describes, once each and in grant order, the jobs grants name.
func (m *Machine) leaseJobs(grants []LeaseGrant) []LeaseJob {
	var out []LeaseJob
	for i, g := range grants {
		if i > 0 && grants[i-1].Job == g.Job {
			continue // grants of one job come together
		}
		j := m.jobs[string(g.Job)]
		if j == nil || slices.ContainsFunc(out, func(l LeaseJob) bool { return l.Job == g.Job }) {
			continue
		}
		l := LeaseJob{Job: j.ID, Bundle: j.Bundle, Policy: j.Policy, Run: j.Run, Round: j.Round}
		l.Delegated = cloneDelegation(j.Delegated)
		out = append(out, l)
	}
	return out
}

// liveLeasesOf counts peer's leases that are live at now, over the
// running jobs' undecided shards (decided shards hold no leases).
func (m *Machine) liveLeasesOf(peer string, now int64) int {
	n := 0
	for _, j := range m.st.Jobs {
		if j.State != JobRunning {
			continue
		}
		for _, s := range j.Shards[j.cursor:] {
			if i, has := s.leaseOf(peer); has && s.Leases[i].Expiry > now {
				n++
			}
		}
	}
	return n
}

// eligible reports whether peer may get a new lease on s at now. Leases
// in s.Leases that expired by now do not count (Leasable asks without
// advancing the clock). An excluded peer gets no generic shard; in
// adaptive mode an audit goes only to the peer the draw reserved it for.
func (m *Machine) eligible(j *jobState, s *shardState, peer string, now int64) bool {
	if !volunteerMay(j, peer) {
		return false
	}
	if s.State != StatePending || s.reportOf(peer) != nil || s.commitOf(peer) != nil || (s.Peer != "" && s.Peer != peer && s.Via != peer) {
		return false
	}
	if i, has := s.leaseOf(peer); has && s.Leases[i].Expiry > now {
		return false
	}
	if s.Peer == "" {
		if rec := m.st.Peers[peer]; rec != nil && rec.Excluded {
			return false
		}
	}
	if adaptive(j) && s.Audit == auditAudited && s.Auditor != peer {
		return false
	}
	want := need(j, s)
	if needsVoice(j, s) {
		if !m.hasStanding(peer) && m.voicelessOther(s, peer, now) {
			return false // standing.go: fresh keys never fill a shard between them
		}
		r := quorumOf(j, s)
		want = spot.Need(resultsOf(s.Reports), r)
		if h, ok := majority(s.Reports, r); ok && !m.vouched(s, h) {
			want = max(want, 1) // agreed without a voice: one more report
		}
	}
	return want > liveLeases(s, now)
}

// sameOrigin reports whether another peer of origin holds a live lease on
// s, or has committed or reported for it: then peer, of the same origin,
// gets no lease on s. Peers whose lease expired without an answer do not
// count, so a closed tab does not keep its network from the shard.
func sameOrigin(s *shardState, peer, origin string, now int64) bool {
	if origin == "" {
		return false
	}
	for q, o := range s.Origins {
		if q == peer || o != origin {
			continue
		}
		if i, has := s.leaseOf(q); has && s.Leases[i].Expiry > now {
			return true
		}
		if s.reportOf(q) != nil || s.commitOf(q) != nil {
			return true
		}
	}
	return false
}

// need is the smallest number of further reports that could verify s if
// they all agreed with its leading hash; live leases count toward it.
func need(j *jobState, s *shardState) int {
	if j.Policy.Check != "" {
		return needChecked(j, s, false)
	}
	if s.Canary != "" && s.Recheck == 0 && s.Audit != auditAudited {
		return 1 // a report that matches the known answer decides
	}
	return spot.Need(resultsOf(votes(s)), replicasOf(j, s))
}

func (m *Machine) renew(c RenewLease) Result {
	if d := firstOf(checkPeer(c.Peer), checkTime(c.Now), checkTTL(c.TTL)); d != nil {
		return refuse(d)
	}
	j, s, d := m.shard(c.Job, c.Shard)
	if d != nil {
		return refuse(d)
	}
	now := m.clock(c.Now)
	i, has := s.leaseOf(c.Peer)
	if !has || s.Leases[i].Expiry <= now {
		return refuse(diag.New(diag.PoolLeaseNotLive, shardSubject(j, s.Index),
			"%s holds no live lease on shard %d: %s", c.Peer, s.Index, whyNotLive(s, c.Peer, now)).
			WithHelp("stop working on this shard and lease new work"))
	}
	events := m.advance(now)
	i, _ = s.leaseOf(c.Peer)
	ttl := c.TTL
	if ttl == 0 {
		ttl = j.Policy.LeaseTTL
	}
	expiry := max(s.Leases[i].Expiry, now+ttl)
	if s.commitOf(c.Peer) != nil {
		// A committed peer renews only to wait for the reveal: never past
		// one TTL after the reveal window closes, so a peer that commits
		// and never reveals cannot hold the shard.
		expiry = max(s.Leases[i].Expiry, min(expiry, revealAt(j, s)+ttl))
	}
	s.Leases[i].Expiry = expiry
	g := LeaseGrant{Job: j.ID, Shard: s.Index, ShardID: s.ID, Price: s.Price, Expiry: s.Leases[i].Expiry}
	return Result{Response: &RenewResponse{Grant: g}, Events: events}
}

func whyNotLive(s *shardState, peer string, now int64) string {
	if i, has := s.leaseOf(peer); has {
		return fmt.Sprintf("the lease expired at %d (now %d)", s.Leases[i].Expiry, now)
	}
	switch {
	case s.State != StatePending:
		return fmt.Sprintf("the shard is already %s", s.State)
	case s.reportOf(peer) != nil:
		return "the peer already reported its result"
	case s.held(peer):
		return "the lease expired or was released"
	}
	return "it was never leased to this peer"
}

func (m *Machine) release(c ReleaseLeases) Result {
	if d := firstOf(checkPeer(c.Peer), checkTime(c.Now)); d != nil {
		return refuse(d)
	}
	for _, r := range c.Shards {
		if _, _, d := m.shard(r.Job, r.Shard); d != nil {
			return refuse(d)
		}
	}
	now := m.clock(c.Now)
	events := m.advance(now)
	released := []ShardRef{}
	drop := func(j *jobState, s *shardState) {
		if i, has := s.leaseOf(c.Peer); has {
			s.dropLease(i)
			m.peer(c.Peer).Released++
			released = append(released, ShardRef{Job: j.ID, Shard: s.Index})
			events = append(events, LeaseEnded{Job: j.ID, Shard: s.Index, Peer: c.Peer, Reason: LeaseReleased})
		}
	}
	if len(c.Shards) == 0 {
		for _, j := range m.st.Jobs {
			if j.State != JobRunning {
				continue
			}
			for _, s := range j.Shards[j.cursor:] {
				drop(j, s)
			}
		}
	} else {
		for _, r := range c.Shards {
			j, s, _ := m.shard(r.Job, r.Shard)
			drop(j, s)
		}
	}
	return Result{Response: &ReleaseResponse{Released: released}, Events: events}
}

func (m *Machine) tick(c Tick) Result {
	if d := checkTime(c.Now); d != nil {
		return refuse(d)
	}
	now := m.clock(c.Now)
	events := m.advance(now)
	resp := &TickResponse{Now: now, Expired: []ExpiredLease{}}
	for _, e := range events {
		if e, ok := e.(LeaseEnded); ok {
			resp.Expired = append(resp.Expired, ExpiredLease{Job: e.Job, Shard: e.Shard, Peer: e.Peer})
		}
	}
	return Result{Response: resp, Events: events}
}

// advance moves the clock to now (never back) and ends every lease whose
// expiry is ≤ now. nextExpiry is a lower bound on the earliest expiry, so
// most commands skip the scan.
func (m *Machine) advance(now int64) []Event {
	m.st.Now = max(m.st.Now, now)
	if now < m.nextExpiry {
		return nil
	}
	var events []Event
	next := int64(math.MaxInt64)
	for _, j := range m.st.Jobs {
		if j.State != JobRunning {
			continue
		}
		for _, s := range j.Shards[j.cursor:] {
			if len(s.Leases) == 0 {
				continue
			}
			kept := s.Leases[:0]
			for _, l := range s.Leases {
				if l.Expiry <= now {
					events = append(events, LeaseEnded{Job: j.ID, Shard: s.Index, Peer: l.Peer, Reason: LeaseExpired})
					m.peer(l.Peer).Expired++
					continue
				}
				kept = append(kept, l)
				next = min(next, l.Expiry)
			}
			s.Leases = kept
			if len(s.Leases) == 0 {
				s.Leases = nil
			}
		}
	}
	m.nextExpiry = next
	return events
}

// revoke ends every lease on a shard that was just decided.
func revoke(j *jobState, s *shardState) []Event {
	var events []Event
	for _, l := range s.Leases {
		events = append(events, LeaseEnded{Job: j.ID, Shard: s.Index, Peer: l.Peer, Reason: LeaseRevoked})
	}
	s.Leases = nil
	return events
}

// shard finds a job's shard or says why not.
func (m *Machine) shard(id content.Ref, index int) (*jobState, *shardState, *diag.Diagnostic) {
	j := m.jobs[string(id)]
	if j == nil {
		return nil, nil, unknownJob(id)
	}
	if index < 0 || index >= len(j.Shards) {
		return nil, nil, diag.New(diag.PoolUnknownShard, "job "+j.Name,
			"job %s has shards 0 to %d, not %d", id.Short(), len(j.Shards)-1, index)
	}
	return j, j.Shards[index], nil
}

func unknownJob(id content.Ref) *diag.Diagnostic {
	return diag.New(diag.PoolUnknownJob, "job "+id.Short(), "no job %s in this pool", id).
		WithHelp("submit the job first; `scellis job status` lists the pool's jobs")
}

func shardSubject(j *jobState, index int) string {
	return fmt.Sprintf("job %s shard %d", j.Name, index)
}

// volunteerMay reports whether peer may execute j's shards: any member
// may (the API's roles decide), a browser volunteer (receipt.IsVolunteer)
// only shards of an open job that is not a training round and reads no
// input tables. Admission keeps an open job's inputs public
// (trust.Admit), so a volunteer is never handed a job with confidential
// inputs, whatever pool it reached; a job with public inputs it is not
// handed either, because a tab has no folder to hold the tables (it
// could only hand the shard back and ask again, forever).
func volunteerMay(j *jobState, peer string) bool {
	return !receipt.IsVolunteer(peer) || (j.Regime == trust.Open && j.Run == "" && !j.ReadsInputs)
}

func checkPeer(p string) *diag.Diagnostic {
	if p == "" || len(p) > maxName {
		return badCommand("peer name must have 1 to %d bytes", maxName)
	}
	return nil
}

func checkTime(now int64) *diag.Diagnostic {
	if now < 0 || now > maxTime {
		return badCommand("time %d out of range", now)
	}
	return nil
}

func checkTTL(ttl int64) *diag.Diagnostic {
	if ttl < 0 || ttl > MaxLeaseTTL {
		return badCommand("lease TTL %d ms outside 0 to %d", ttl, MaxLeaseTTL)
	}
	return nil
}

func firstOf(ds ...*diag.Diagnostic) *diag.Diagnostic {
	for _, d := range ds {
		if d != nil {
			return d
		}
	}
	return nil
}
