package coordinator

import (
	"fmt"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
)

// maxReplicas bounds a policy's replicas (attempts: four times that).
const maxReplicas = 64

// maxName bounds peer names, job names and request IDs.
const maxName = 256

func (m *Machine) submit(c SubmitJob) Result {
	subject := "job " + c.Name
	if d := firstOf(checkSubmit(c, subject), checkDelegation(c, subject)); d != nil {
		return refuse(d)
	}
	if len(c.Seed) > MaxSeed {
		return refuse(badCommand("submit: a seed of %d characters, at most %d", len(c.Seed), MaxSeed))
	}
	plan := planHash(c)
	if j := m.jobs[string(c.Job)]; j != nil {
		if j.Plan != plan {
			return refuse(diag.New(diag.PoolJobConflict, subject,
				"job %s was already submitted with a different plan", c.Job.Short()).
				WithHelp("a job ID names one plan; recompile the job so its ID matches its content"))
		}
		return Result{Response: &SubmitResponse{Job: j.ID, Shards: len(j.Shards), Policy: j.Policy, Method: j.Method, Existing: true}}
	}
	if c.Run != "" && c.Delegated == nil {
		if d := m.checkRound(c); d != nil {
			return refuse(d)
		}
	}
	if ds := trust.Admit(m.st.Regime, trust.Request{
		Subject: subject, Regime: c.Regime, SecurityCritical: c.SecurityCritical,
		Inputs: c.Inputs, Models: c.Models,
	}); ds.HasErrors() {
		return Result{Refusal: ds}
	}
	pol, d := m.resolvePolicy(c.Policy, subject)
	if d != nil {
		return refuse(d)
	}
	if d := checkMode(c, pol, m.st.Regime, subject); d != nil {
		return refuse(d)
	}

	now := m.clock(c.Now)
	events := m.advance(now)
	j := &jobState{
		ID: c.Job, Name: c.Name, Bundle: c.Bundle, Run: c.Run, Round: c.Round, Regime: m.st.Regime, SecurityCritical: c.SecurityCritical,
		ReadsInputs: len(c.Inputs) > 0, Policy: pol, Method: jobMethod(pol), Plan: plan,
		SubmittedAt: now, Submitter: c.Submitter, State: JobRunning, Shards: make([]*shardState, len(c.Shards)),
		Delegated: cloneDelegation(c.Delegated), Seed: c.Seed,
	}
	for i, s := range c.Shards {
		j.Shards[i] = &shardState{Index: s.Index, ID: s.ID, Price: s.Price, PriceBasis: s.PriceBasis, Peer: s.Peer, Via: s.Via, State: StatePending}
	}
	for _, k := range c.Canaries {
		j.Shards[k.Shard].Canary = k.Result
	}
	m.st.Jobs = append(m.st.Jobs, j)
	m.jobs[string(j.ID)] = j
	if r := m.run(c.Run); r != nil {
		r.Jobs = append(r.Jobs, j.ID)
	}
	events = append(events, JobSubmitted{Job: j.ID, Name: j.Name, Shards: len(j.Shards), Policy: pol})
	return Result{
		Response: &SubmitResponse{Job: j.ID, Shards: len(j.Shards), Policy: pol, Method: j.Method},
		Events:   events,
	}
}

// checkSubmit checks the shape of a submission: refs, names, shard
// indexes in order, distinct shard IDs, prices and policy ranges.
func checkSubmit(c SubmitJob, subject string) *diag.Diagnostic {
	bad := func(format string, args ...any) *diag.Diagnostic {
		return diag.New(diag.PoolBadJob, subject, format, args...).
			WithHelp("submit the plan the planner produced (scellis job submit)")
	}
	if d := checkTime(c.Now); d != nil {
		return d
	}
	if len(c.Submitter) > maxName {
		return bad("submitter name has more than %d bytes", maxName)
	}
	if c.Regime != "" {
		if _, err := trust.ParseRegime(string(c.Regime)); err != nil {
			return diag.New(diag.UnknownRegime, subject, "unknown trust regime %q", c.Regime).
				WithHelp("use one of: own, consortium, open")
		}
	}
	switch {
	case !content.IsRef(string(c.Job)):
		return bad("job ID %q is not a content ref", c.Job)
	case c.Name == "" || len(c.Name) > maxName:
		return bad("job name must have 1 to %d bytes", maxName)
	case len(c.Shards) == 0:
		return bad("the plan has no shards")
	case len(c.Shards) > MaxShards:
		return bad("the plan has %d shards; a pool job may have at most %d", len(c.Shards), MaxShards)
	case c.Policy.Replicas < 0 || c.Policy.Attempts < 0:
		return bad("negative verification policy (replicas %d, attempts %d)", c.Policy.Replicas, c.Policy.Attempts)
	case c.Policy.Replicas > maxReplicas || c.Policy.Attempts > maxReplicas*4:
		return bad("verification policy too large (replicas %d ≤ %d, attempts %d ≤ %d)",
			c.Policy.Replicas, maxReplicas, c.Policy.Attempts, maxReplicas*4)
	case checkPolicy(c.Policy) != "":
		return bad("verification check: %s", checkPolicy(c.Policy))
	case c.Policy.TrustAfter < 0 || c.Policy.TrustAfter > MaxSpotKnob || c.Policy.AuditOneIn < 0 || c.Policy.AuditOneIn > MaxSpotKnob:
		return bad("spot-check knobs outside 1 to %d (trust after %d, audit 1 in %d)", MaxSpotKnob, c.Policy.TrustAfter, c.Policy.AuditOneIn)
	case c.Policy.Mode != ModeAdaptive && (c.Policy.TrustAfter != 0 || c.Policy.AuditOneIn != 0):
		return bad("spot-check knobs (trust after, audit 1 in) belong to adaptive jobs")
	case c.Policy.LeaseTTL < 0 || c.Policy.LeaseTTL > MaxLeaseTTL:
		return bad("lease TTL %d ms outside 0 to %d", c.Policy.LeaseTTL, MaxLeaseTTL)
	}
	ids := make(map[content.Ref]int, len(c.Shards))
	var total int64
	for i, s := range c.Shards {
		switch {
		case s.Index != i:
			return bad("shard %d has index %d; shards must be listed in index order from 0", i, s.Index)
		case !content.IsRef(string(s.ID)):
			return bad("shard %d: ID %q is not a content ref", i, s.ID)
		case s.Price < 0:
			return bad("shard %d: negative price %d", i, s.Price)
		case s.PriceBasis == "":
			return bad("shard %d: no price basis", i)
		case s.Via != "" && (s.Peer == "" || s.Via == s.Peer || len(s.Via) > maxName):
			return bad("shard %d: via %q needs a peer it leads, other than itself, and at most %d bytes", i, s.Via, maxName)
		}
		sum, ok := receipt.AddUnits(total, s.Price)
		if !ok || sum > receipt.MaxJobUnits {
			return diag.New(diag.PoolPriceCap, subject, "the shards' prices add up to more than %d work units (at shard %d, priced %d)", int64(receipt.MaxJobUnits), i, s.Price).
				WithHelp("lower the program's cost(), or split the job")
		}
		total = sum
		if prev, dup := ids[s.ID]; dup {
			return bad("shards %d and %d have the same ID %s", prev, i, s.ID.Short())
		}
		ids[s.ID] = i
	}
	return nil
}

// resolvePolicy fills in the pool's defaults and checks the result.
func (m *Machine) resolvePolicy(p Policy, subject string) (Policy, *diag.Diagnostic) {
	if p.Replicas == 0 {
		p.Replicas = DefaultReplicas(m.st.Regime)
		if p.Check == CheckFreivalds {
			// The check replaces the second execution.
			p.Replicas = 1
		}
	}
	if m.st.Regime == trust.Open && p.Replicas < 2 && p.Check != CheckFreivalds {
		return p, diag.New(diag.PoolOpenNeedsReplicas, subject,
			"the job asks for %d replica but the pool is open", p.Replicas).
			WithHelp("redundancy verification is mandatory on an open pool: set verification.replicas to 2 or more")
	}
	if p.Attempts == 0 {
		p.Attempts = 2*p.Replicas + 1
	}
	if p.Attempts < p.Replicas {
		return p, diag.New(diag.PoolBadJob, subject,
			"attempts %d is fewer than replicas %d; the shard could never be verified", p.Attempts, p.Replicas).
			WithHelp("set verification.attempts to at least verification.replicas (default 2·replicas+1)")
	}
	if p.LeaseTTL == 0 {
		p.LeaseTTL = m.st.DefaultLeaseTTL
	}
	if p.Mode == ModeAdaptive {
		if p.TrustAfter == 0 {
			p.TrustAfter = SpotParams.TrustAfter
		}
		if p.AuditOneIn == 0 {
			p.AuditOneIn = SpotParams.AuditOneIn
		}
	}
	return p, nil
}

// jobMethod names a job's verification rule.
func jobMethod(p Policy) string {
	if p.Check != "" {
		return methodOf(p)
	}
	if p.Mode == ModeAdaptive {
		return fmt.Sprintf("adaptive: spot checks (trusted after %d valid checks, then audited 1 in %d), canaries, quorum-%d-exact when audited",
			p.TrustAfter, p.AuditOneIn, p.Replicas)
	}
	return fmt.Sprintf("quorum-%d-exact", p.Replicas)
}

// checkMode checks a job's verification mode and its canaries.
func checkMode(c SubmitJob, p Policy, regime trust.Regime, subject string) *diag.Diagnostic {
	bad := func(format string, args ...any) *diag.Diagnostic {
		return diag.New(diag.PoolBadMode, subject, format, args...).
			WithHelp("use verification.mode quorum, or adaptive with at least 2 replicas on an own or consortium pool")
	}
	switch p.Mode {
	case "", ModeQuorum:
		// A quorum job may carry canaries (open pools get them by
		// default, standing.go): a known answer decides its shard, so the
		// shard must be exactly matched and free to go to any peer.
		if len(c.Canaries) > 0 && p.Check != "" {
			return bad("canaries are known exact answers; this job's shards are checked by %s", p.Check)
		}
	case ModeAdaptive:
		if p.Replicas < 2 {
			return bad("adaptive verification audits with %d replica; it needs at least 2", p.Replicas)
		}
		if regime == trust.Open {
			return bad("adaptive verification runs trusted peers' shards alone, and an open pool demands redundancy on every shard")
		}
	default:
		return bad("unknown verification mode %q", p.Mode)
	}
	if p.Mode == ModeAdaptive || len(c.Canaries) > 0 {
		for _, s := range c.Shards {
			if s.Peer != "" {
				return bad("shard %d is pinned to %s and cannot be re-executed elsewhere", s.Index, s.Peer)
			}
		}
	}
	seen := map[int]bool{}
	for _, k := range c.Canaries {
		if k.Shard < 0 || k.Shard >= len(c.Shards) || seen[k.Shard] || !content.IsRef(string(k.Result)) {
			return diag.New(diag.PoolBadJob, subject, "canary for shard %d: out of range, repeated or not a ref", k.Shard).
				WithHelp("submit the plan the planner produced (scellis job submit)")
		}
		seen[k.Shard] = true
	}
	return nil
}

// DefaultReplicas is the replicas a job gets on a pool of regime r when its
// policy names none: 1 in own, 2 in consortium and open.
func DefaultReplicas(r trust.Regime) int {
	if r == trust.Own {
		return 1
	}
	return 2
}

// planHash identifies a submission apart from its time, so that a retried
// submission is recognised as the same.
func planHash(c SubmitJob) content.Ref {
	c.Now, c.Submitter, c.Canaries, c.Seed = 0, "", nil, ""
	if len(c.Inputs) == 0 {
		c.Inputs = nil
	}
	if len(c.Models) == 0 {
		c.Models = nil
	}
	h, err := content.HashOf(c)
	if err != nil {
		panic("coordinator: encoding a job submission: " + err.Error())
	}
	return h
}
