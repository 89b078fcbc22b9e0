package app

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/lci-labs/compartment/queues"
)

// Status is the state of every pool and queue, read from Redis, so it sees
// every worker process.
type Status struct {
	Pools []PoolStatus `json:"pools"`
	// UsefulWorkers is the most worker processes any pool's work can keep
	// busy now (the largest PoolStatus.UsefulWorkers): a worker process
	// serves every pool, so it is how many to run (docs/AUTOSCALING.md).
	UsefulWorkers int `json:"useful_workers"`
	// Dependencies are the config's dependencies, in config order, read
	// with the pools' counts (docs/DEPENDENCIES.md). None without any.
	Dependencies []DependencyStatus `json:"dependencies,omitempty"`
	// Schedules are the config's schedules with their next and last runs.
	Schedules []ScheduleStatus `json:"schedules,omitempty"`
}

// DependencyStatus is one dependency: its capacity against what the pools
// claim of it and what their running jobs hold (queues.DependencyStats).
type DependencyStatus struct {
	Name     string `json:"name"`
	Capacity int    `json:"capacity"`
	// Claimed is what the pools claim of it: each its size in effect (an
	// adaptive pool its max_size) times its uses. Over Capacity only with
	// allow_overbooking.
	Claimed int `json:"claimed"`
	// InUse is what the pools' running jobs hold: each pool's slots held
	// across every worker process times its uses.
	InUse int `json:"in_use"`
	// Pools are the pools that use it, in config order; their Claimed and
	// InUse add up to the dependency's.
	Pools []DependencyUse `json:"pools"`
}

// DependencyUse is one pool's use of a dependency.
type DependencyUse struct {
	Pool string `json:"pool"`
	// Units is what one of its jobs holds (the pool's uses).
	Units   int `json:"units"`
	Claimed int `json:"claimed"`
	InUse   int `json:"in_use"`
}

// SilentJob is a running job whose worker stopped renewing its lease
// (queues.SilentJob).
type SilentJob struct {
	ID   string `json:"id"`
	Tier string `json:"tier,omitempty"`
	// SilentSeconds is how long its lease has gone unrenewed.
	SilentSeconds float64 `json:"silent_seconds"`
	// RecoverAfterSeconds is recover_after: when the job goes back.
	RecoverAfterSeconds float64 `json:"recover_after_seconds"`
	// Process is the worker that ran it (host:pid:server), while asynq
	// still lists it; empty after.
	Process string `json:"process,omitempty"`
}

// PoolStatus is one pool. Size is per worker process (asynq caps each
// process's server); Capacity is Size times the worker processes serving the
// pool now.
type PoolStatus struct {
	Name string `json:"name"`
	// Scope is "cluster" (Size holds across all worker processes) or
	// "process" (Size holds per process).
	Scope string `json:"scope"`
	// Size is the configured size.
	Size int `json:"size"`
	// EffectiveSize is the size in effect: for a cluster-scoped pool an
	// operator resized (enqueue resize), the size set, else Size.
	EffectiveSize int `json:"effective_size"`
	// Resized says an operator's size is in effect.
	Resized bool `json:"resized,omitempty"`
	// MaxSize is the most a cluster-scoped pool may be resized to.
	MaxSize int `json:"max_size"`
	Workers int `json:"workers"`
	// Capacity is EffectiveSize for a cluster-scoped pool, Size × Workers
	// otherwise.
	Capacity int `json:"capacity"`
	// WorkersCanRun is, for a cluster-scoped pool, how many of its jobs
	// the live worker processes can run at once between them (each its
	// own max_size); an EffectiveSize above it is reached only when more
	// workers start. 0 while no worker runs the pool.
	WorkersCanRun int `json:"workers_can_run,omitempty"`
	// Active counts the jobs whose handler runs: for a cluster-scoped
	// pool, the slots held across processes (never more than
	// EffectiveSize, except for the jobs still running after a resize
	// down); otherwise the active jobs in its queues.
	Active int `json:"active"`
	// WaitingForSlot counts the jobs workers took from the pool's queues
	// that do not run: waiting in their process for a cluster-wide slot
	// (the look-ahead, docs/CLUSTER.md), or for an instant just ended.
	// They are not in Active, nor in Backlog. Always 0 for a
	// process-scoped pool.
	WaitingForSlot int `json:"waiting_for_slot"`
	// UsefulWorkers is how many worker processes the pool's work can keep
	// busy now: its running and ready jobs (at most EffectiveSize for a
	// cluster-scoped pool) over MaxSize, rounded up; none of the ready
	// ones while its breaker is open or an operator paused it
	// (queues.UsefulWorkers).
	UsefulWorkers int  `json:"useful_workers"`
	Available     int  `json:"available"`
	IsFull        bool `json:"is_full"`
	// Holders says which processes (host:pid:id) hold a cluster-scoped
	// pool's slots, and how many each; read with Active in one step, so
	// they add up to it.
	Holders map[string]int `json:"holders,omitempty"`
	// Silent lists the pool's running jobs whose worker process stopped
	// renewing their lease (a worker that died, froze or lost Redis): they
	// go back to their queue once they have been silent for
	// recover_after (docs/RELIABILITY.md).
	Silent []SilentJob `json:"silent,omitempty"`
	// Backlog is the pool's jobs pending, scheduled or waiting for a
	// retry, in all of its tiers: what its door's limits count.
	Backlog int `json:"backlog"`
	// MaxBacklog is the door's limit on Backlog (0: unbounded).
	MaxBacklog int `json:"max_backlog,omitempty"`
	// WaitingForRoom counts the enqueue requests waiting for room now.
	WaitingForRoom int64 `json:"waiting_for_room,omitempty"`
	// Rates lists the pool's rate limits (enqueue and start).
	Rates []RateStatus `json:"rates,omitempty"`
	// Breaker is the pool's circuit breaker, for a pool with one: its
	// state, since when, why, and the counts that drove it.
	Breaker *queues.BreakerState `json:"breaker,omitempty"`
	// Adaptive is the pool's adaptive limit, for a pool with one
	// (adaptive: in its config): the limit now, its bounds (adaptive.min
	// and max_size), why and when it last changed, and its latest changes
	// (up to queues.StatsAdaptiveChanges), newest first, an operator's
	// resizes and resets among them (From 0 there; To 0 for a reset).
	// EffectiveSize is the limit unless an operator resized the pool
	// (Resized). See docs/DEPENDENCIES.md.
	Adaptive *queues.AdaptiveStatus `json:"adaptive,omitempty"`
	Queues   []QueueStatus          `json:"queues"`
}

// RateStatus is one rate limit of a pool.
type RateStatus struct {
	// Limit is the config key: enqueue_rate, enqueue_rate_per_key,
	// job_type_rates or start_rate.
	Limit string `json:"limit"`
	// JobType is set for a job type's limit.
	JobType string `json:"job_type,omitempty"`
	Rate    string `json:"rate"`
}

// QueueStatus is one asynq queue of a pool (one per tier).
type QueueStatus struct {
	Queue   string `json:"queue"`
	Tier    string `json:"tier,omitempty"`
	Pending int    `json:"pending"`
	// Active counts the tier's jobs whose handler runs (see
	// PoolStatus.Active); WaitingForSlot those taken from the queue that
	// do not run (PoolStatus.WaitingForSlot).
	Active         int `json:"active"`
	WaitingForSlot int `json:"waiting_for_slot"`
	Scheduled      int `json:"scheduled"`
	Retry          int `json:"retry"`
	Archived       int `json:"archived"`
	Completed      int `json:"completed"`
	// Processed is asynq's count of the queue's jobs processed, succeeded
	// or failed, by every worker process, since the queue was first used
	// (one per attempt): two reads give the jobs done per second.
	Processed int64 `json:"processed"`
	Paused    bool  `json:"paused"`
	// PausedByOperator says the pause is an operator's (enqueue pause, the
	// dashboard), not the cluster-wide gate's.
	PausedByOperator bool `json:"paused_by_operator,omitempty"`
	// OldestPendingSeconds is how long the oldest pending job has waited.
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	// BacklogLimit is the pool's backlog up to which the door admits jobs
	// of this tier (0: unbounded).
	BacklogLimit int `json:"backlog_limit,omitempty"`
	// Refused counts the jobs of this tier the door refused, by reason
	// ("backlog" or "rate"), since the namespace was created.
	Refused map[string]int64 `json:"refused,omitempty"`
	// Reserved is the pool's slots reserved for this tier and the tiers
	// above it (the config's reserved; 0: none).
	Reserved int `json:"reserved,omitempty"`
	// MaxWaitSeconds is the tier's maximum wait (max_wait; 0: none).
	MaxWaitSeconds float64 `json:"max_wait_seconds,omitempty"`
	// OverMaxWait says the oldest pending job has waited past MaxWait:
	// the cluster-wide gate serves it before the higher tiers.
	OverMaxWait bool `json:"over_max_wait,omitempty"`
}

// Status reads the pools' and queues' state: each pool's queues and
// slots in one step (queues.Client.Stats), so its counts describe one
// instant, plus the worker processes from asynq's server list.
func (e *Enqueuer) Status(ctx context.Context) (Status, error) {
	servers, err := e.Insp.Servers()
	if err != nil {
		return Status{}, err
	}
	stats, err := e.Client.Stats(ctx)
	if err != nil {
		return Status{}, err
	}
	byQueue := map[string]queues.QueueStats{}
	for _, q := range stats.Queues {
		byQueue[q.Queue] = q
	}
	var st Status
	for _, p := range e.Client.Pools() {
		// Every count below comes from the one read of Stats (the breaker's
		// details aside): no round trip per pool.
		ps := PoolStatus{Name: p.Name(), Size: p.Size(), EffectiveSize: p.Size(), MaxSize: p.MaxSize(), Scope: string(p.Scope())}
		if p.Scope() == queues.ScopeCluster {
			ps.EffectiveSize, ps.Resized = int(stats.Sizes[p.Name()]), stats.Slots[p.Name()].Resized
		}
		// A worker process runs one server per pool, serving all of its
		// queues, and for a pool with reserved slots a reserved lane that
		// serves only the reserved tiers: count the servers of the lowest
		// tier's queue, one per process.
		qs := p.Queues()
		lowest := qs[len(qs)-1]
		for _, s := range servers {
			if _, ok := s.Queues[lowest]; ok && s.Status == "active" {
				ps.Workers++
			}
		}
		pc := p.Config()
		ps.MaxBacklog, ps.Rates = pc.MaxBacklog, rateStatus(pc)
		ps.WaitingForRoom = stats.WaitingForRoom[p.Name()]
		if pc.Breaker != nil {
			b, err := e.Client.Breaker(ctx, p.Name())
			if err != nil {
				return Status{}, err
			}
			ps.Breaker = &b
		}
		tiers := p.Tiers()
		for i, q := range p.Queues() {
			qs := QueueStatus{Queue: q}
			if tiers != nil {
				qs.Tier = tiers[i]
			}
			info := byQueue[q]
			qs.BacklogLimit, qs.Refused = pc.MaxBacklog, refusedCounts(info)
			if l, ok := pc.TierLimits[qs.Tier]; ok {
				qs.BacklogLimit = l
			}
			qs.Pending, qs.Active, qs.WaitingForSlot = int(info.Pending), int(info.Running), int(info.WaitingForSlot)
			qs.Scheduled, qs.Retry = int(info.Scheduled), int(info.Retry)
			qs.Archived, qs.Completed, qs.Processed = int(info.Archived), int(info.Completed), info.Processed
			qs.Paused, qs.PausedByOperator = info.Paused, info.PausedByOperator
			qs.OldestPendingSeconds = info.OldestPending.Round(time.Millisecond).Seconds()
			qs.Reserved = pc.Reserved[qs.Tier]
			if w := pc.MaxWait[qs.Tier]; w > 0 {
				qs.MaxWaitSeconds = w.Seconds()
				qs.OverMaxWait = info.OverMaxWait
			}
			ps.Active += qs.Active
			ps.WaitingForSlot += qs.WaitingForSlot
			ps.Backlog += qs.Pending + qs.Scheduled + qs.Retry
			ps.Queues = append(ps.Queues, qs)
		}
		ps.Capacity = ps.Size * ps.Workers
		if p.Scope() == queues.ScopeCluster {
			slots := stats.Slots[p.Name()]
			// The size read with the slots, in the same step.
			ps.EffectiveSize = int(stats.Sizes[p.Name()])
			ps.Capacity, ps.Active, ps.WorkersCanRun = ps.EffectiveSize, int(slots.InUse), int(slots.Capacity)
			ps.Holders = map[string]int{}
			for h, n := range slots.Holders {
				ps.Holders[h] = int(n)
			}
		}
		ps.Adaptive = stats.Adaptive[p.Name()]
		ps.UsefulWorkers = int(stats.UsefulWorkers[p.Name()])
		st.UsefulWorkers = max(st.UsefulWorkers, ps.UsefulWorkers)
		for _, j := range stats.Silent[p.Name()] {
			ps.Silent = append(ps.Silent, SilentJob{ID: j.ID, Tier: j.Tier, SilentSeconds: j.For.Seconds(),
				RecoverAfterSeconds: e.Config.Engine.RecoverAfter.Seconds(), Process: j.Process})
		}
		ps.Available = max(0, ps.Capacity-ps.Active)
		ps.IsFull = ps.Workers > 0 && ps.Available == 0
		st.Pools = append(st.Pools, ps)
	}
	st.Dependencies = dependencyStatus(stats.Dependencies)
	if st.Schedules, err = e.Schedules(ctx, time.Now(), 0); err != nil {
		return Status{}, err
	}
	return st, nil
}

// dependencyStatus is the dependencies' part of Stats. What a process's
// own jobs hold through their handles (DependencyUse.HeldHere) is left
// out: the status is read by an Enqueuer's client, which runs no job.
func dependencyStatus(deps []queues.DependencyStats) []DependencyStatus {
	var out []DependencyStatus
	for _, d := range deps {
		ds := DependencyStatus{Name: d.Name, Capacity: d.Capacity, Claimed: int(d.Claimed), InUse: int(d.InUse), Pools: []DependencyUse{}}
		for _, u := range d.Pools {
			ds.Pools = append(ds.Pools, DependencyUse{Pool: u.Pool, Units: u.Units, Claimed: int(u.Claimed), InUse: int(u.InUse)})
		}
		out = append(out, ds)
	}
	return out
}

// refusedCounts gives the door's refusals of a tier by reason, only the
// reasons it refused for (nil when none).
func refusedCounts(q queues.QueueStats) map[string]int64 {
	var out map[string]int64
	for reason, n := range map[string]int64{"backlog": q.RefusedBacklog, "rate": q.RefusedRate} {
		if n > 0 {
			if out == nil {
				out = map[string]int64{}
			}
			out[reason] = n
		}
	}
	return out
}

// rateStatus lists a pool's rate limits.
func rateStatus(pc queues.PoolConfig) []RateStatus {
	var out []RateStatus
	add := func(limit, jobType string, r *queues.Rate) {
		if r != nil {
			out = append(out, RateStatus{Limit: limit, JobType: jobType, Rate: r.String()})
		}
	}
	add("enqueue_rate", "", pc.EnqueueRate)
	add("enqueue_rate_per_key", "", pc.EnqueueRatePerKey)
	for _, jt := range slices.Sorted(maps.Keys(pc.JobTypeRates)) {
		r := pc.JobTypeRates[jt]
		add("job_type_rates", jt, &r)
	}
	add("start_rate", "", pc.StartRate)
	return out
}
