package queues

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// QueueStats is the state of one of a pool's queues (one per tier).
type QueueStats struct {
	Pool, Tier, Queue string
	Pending           int64
	// Active is asynq's count of the queue's jobs that a worker took from
	// it: Running + WaitingForSlot. It is not what runs: show Running.
	Active int64
	// Running counts the jobs whose handler runs: for a cluster-scoped
	// pool, those holding a slot of its gate (never more, across every
	// process, than the size in effect, but after a shrink); for a
	// process-scoped pool, asynq's active jobs (a job runs as soon as a
	// worker takes it).
	Running int64
	// WaitingForSlot counts the jobs a worker took from the queue that do
	// not run: waiting in their process for a cluster-wide slot (the
	// look-ahead, docs/CLUSTER.md), or in the instant between their
	// handler's end and asynq recording it. For up to 5 ms it also counts
	// a job that took over the held slot of a job of another of the pool's
	// queues, whose queue counts it as running meanwhile (docs/CLUSTER.md,
	// "What people see"). Always 0 for a process-scoped pool.
	WaitingForSlot   int64
	Scheduled, Retry int64
	Archived         int64
	Completed        int64
	// Processed is asynq's running count of the queue's jobs processed,
	// succeeded or failed, by every worker process (it grows by one per
	// attempt): the difference between two reads over the time between
	// them is the jobs done per second.
	Processed int64
	// OldestPending is how long the oldest pending job has been pending
	// (0 when none is), by this process's clock against the time asynq
	// stamped when the job became pending.
	OldestPending time.Duration
	// Paused: the queue is paused, by the cluster-wide gate (the pool is
	// full, or a higher tier has work) or by an operator (PausedByOperator,
	// see PausePool).
	Paused, PausedByOperator bool
	// BacklogLimit is the pool's backlog up to which the door admits jobs
	// of this tier (0: no limit).
	BacklogLimit int64
	// RefusedBacklog and RefusedRate count the jobs of this tier the door
	// refused, for a full backlog and for an enqueue rate, by every
	// producer (only for pools with a door).
	RefusedBacklog, RefusedRate int64
	// Reserved is the pool's slots reserved for this tier and the tiers
	// above it; MaxWait is the tier's maximum wait (0: none of either).
	Reserved int
	MaxWait  time.Duration
	// OverMaxWait: the oldest pending job has waited past MaxWait, so the
	// cluster-wide gate serves it before the higher tiers.
	OverMaxWait bool
}

// Stats is a snapshot of every pool's queues and cluster-wide slots. Each
// pool's part is read in one step: its counts describe one instant.
type Stats struct {
	// Queues lists every pool's queues, in pool order, highest tier first.
	Queues []QueueStats
	// ClusterSlots gives, for each cluster-scoped pool, the slots held
	// across every worker process (leases not expired by Redis's clock).
	ClusterSlots map[string]int64
	// Sizes gives, for each cluster-scoped pool, its size in effect: the
	// one an operator set (Client.Resize), or its configured size.
	Sizes map[string]int64
	// Slots gives, for each cluster-scoped pool, who holds its slots and
	// what the live worker processes can run.
	Slots map[string]PoolSlots
	// WaitingForRoom gives, for each pool with a backlog limit, the enqueue
	// requests waiting for room now.
	WaitingForRoom map[string]int64
	// Breakers gives, for each pool with a circuit breaker, its state
	// (BreakerClosed, BreakerOpen or BreakerHalfOpen) and the openings in a
	// row without a close (see Client.Breaker for the rest).
	Breakers map[string]BreakerSummary
	// UsefulWorkers gives, for each pool, how many worker processes its
	// work can keep busy now: the signal to scale worker processes on
	// (docs/AUTOSCALING.md). See UsefulWorkers (the function) for how it
	// is counted.
	UsefulWorkers map[string]int64
	// Silent gives, for each pool with such jobs, the running jobs whose
	// worker process has not renewed their lease for SilentAfter or longer
	// (asynq renews every 5 s): a process that died, froze or lost Redis.
	// They are taken back once that reaches RecoverAfter
	// (docs/RELIABILITY.md).
	Silent map[string][]SilentJob
	// Adaptive gives, for each adaptive pool (PoolConfig.Adaptive), its
	// limit and latest changes (up to StatsAdaptiveChanges).
	Adaptive map[string]*AdaptiveStatus
	// Dependencies gives each dependency's capacity and the pools' use of
	// it, in config order.
	Dependencies []DependencyStats
}

// StatsAdaptiveChanges is how many of an adaptive limit's latest changes
// Stats reads.
const StatsAdaptiveChanges = 20

// DependencyStats is one dependency in Stats.
type DependencyStats struct {
	Name     string `json:"name"`
	Capacity int    `json:"capacity"`
	// Claimed is what the pools claim of it, as the budget check counts
	// it (each its size in effect, or the slots its running jobs still
	// hold if more, × use; an adaptive pool's max_size × use), InUse what their running jobs
	// hold (slots held across every process × use): the sums of Pools.
	Claimed int64 `json:"claimed"`
	InUse   int64 `json:"in_use"`
	// Pools are the pools that use it, in config order.
	Pools []DependencyUse `json:"pools"`
}

// DependencyUse is one pool's use of a dependency.
type DependencyUse struct {
	Pool string `json:"pool"`
	// Units is what one of its jobs holds (PoolConfig.Uses).
	Units int `json:"units"`
	// Claimed and InUse: see DependencyStats.
	Claimed int64 `json:"claimed"`
	InUse   int64 `json:"in_use"`
	// HeldHere is what its jobs hold through their handles
	// (DependencyHandle.Acquire) in this process now.
	HeldHere int64 `json:"held_here"`
}

// SilentAfter is how long a running job's lease must go unrenewed for
// Stats to list it as Silent: one renewal missed, and two seconds.
const SilentAfter = 7 * time.Second

// SilentJob is a running job whose worker process stopped renewing its
// lease (Stats.Silent).
type SilentJob struct {
	ID, Tier string
	// For is how long its lease has gone unrenewed (by Redis's clock
	// against the worker's, in whole seconds).
	For time.Duration
	// Process is the process that ran it as asynq names it
	// (host:pid:server), while asynq still lists it (up to 10 s after
	// its last heartbeat); "" after that.
	Process string
}

// PoolSlots is a cluster-scoped pool's slots in Stats, read in the same
// step as its queues.
type PoolSlots struct {
	// InUse is the slots held (ClusterSlots).
	InUse int64
	// Holders gives the slots each worker process holds, by its ID
	// (host:pid:random); they add up to InUse.
	Holders map[string]int64
	// Processes counts the worker processes that run the pool now (each
	// says so every few seconds; a killed one drops out within
	// GateLeaseTTL).
	Processes int64
	// Capacity is how many of the pool's jobs those processes can run at
	// once between them (each its concurrency: the pool's max_size in its
	// own config). A size in effect above it cannot be reached until more
	// workers start.
	Capacity int64
	// Resized says an operator's size is in effect (Client.Resize), read
	// with the rest: Stats.Sizes holds it.
	Resized bool
}

// BreakerSummary is a pool's circuit breaker in Stats.
type BreakerSummary struct {
	State BreakerStatus
	Trips int64
}

// Stats reads every pool's queues and cluster-wide slots in one pipelined
// round trip to Redis (one per node on a Redis Cluster), whatever the number
// of pools, tiers and jobs: one script per pool, for pools with a door its
// refusal counts and waiting line, for pools with a breaker its state. It
// never scans jobs: a deep backlog costs what an empty queue does.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	type poolRef struct {
		pool  *Pool
		stats *rdb.PoolStatsRead
	}
	var pools []poolRef
	refused := map[string]*rdb.RefusalsRead{}
	waiting := map[string]*rdb.CountRead{}
	silent := map[string]*rdb.UnrenewedRead{}
	breakers := map[string]*rdb.BreakerRead{}
	adaptive := map[string]*rdb.AdaptiveRead{}
	batch := rdb.NewPools(c.rdb, c.ks).Batch()
	reg := c.pools()
	for _, p := range reg.pools {
		if p.cfg.Adaptive != nil && p.Scope() == ScopeCluster {
			adaptive[p.Name()] = batch.Adaptive(p.Name(), StatsAdaptiveChanges)
		}
		if p.cfg.Breaker != nil {
			breakers[p.Name()] = batch.BreakerSummary(p.Name())
		}
		if p.cfg.HasDoor() {
			refused[p.Name()] = batch.DoorRefusals(p.Name())
			if p.cfg.MaxBacklog > 0 {
				waiting[p.Name()] = batch.DoorWaiting(p.Name())
			}
		}
		silent[p.Name()] = batch.Unrenewed(p.queues, SilentAfter)
		pools = append(pools, poolRef{p, batch.PoolStats(rdb.PoolStatsArgs{Pool: p.Name(), Queues: p.queues, Cluster: p.Scope() == ScopeCluster})})
	}
	if err := batch.Exec(ctx); err != nil {
		return Stats{}, fmt.Errorf("queue stats: %w", err)
	}
	now := time.Now()
	st := Stats{ClusterSlots: map[string]int64{}, Sizes: map[string]int64{}, Slots: map[string]PoolSlots{},
		WaitingForRoom: map[string]int64{}, Breakers: map[string]BreakerSummary{}, UsefulWorkers: map[string]int64{}, Silent: map[string][]SilentJob{},
		Adaptive: map[string]*AdaptiveStatus{}}
	operator := map[string]bool{}
	for name, read := range adaptive {
		a, err := read.Result()
		if err != nil {
			return Stats{}, fmt.Errorf("queue stats: pool %q: adaptive limit: %w", name, err)
		}
		st.Adaptive[name] = adaptiveStatus(reg.byName[name], a)
		operator[name] = a.Operator
	}
	if err := c.silentJobs(ctx, silent, st.Silent); err != nil {
		return Stats{}, err
	}
	for name, read := range breakers {
		s, err := read.Result()
		if err != nil {
			return Stats{}, fmt.Errorf("queue stats: pool %q: %w", name, err)
		}
		st.Breakers[name] = BreakerSummary{State: cmp.Or(BreakerStatus(s.State), BreakerClosed), Trips: s.Trips}
	}
	for name, read := range waiting {
		n, err := read.Result()
		if err != nil {
			return Stats{}, fmt.Errorf("queue stats: pool %q: %w", name, err)
		}
		st.WaitingForRoom[name] = n
	}
	for _, ref := range pools {
		p := ref.pool
		ps, err := ref.stats.Result()
		if err != nil {
			return Stats{}, fmt.Errorf("queue stats: pool %q: %w", p.Name(), err)
		}
		var refusals rdb.Refusals
		read, door := refused[p.Name()]
		if door {
			if refusals, err = read.Result(); err != nil {
				return Stats{}, fmt.Errorf("queue stats: pool %q: %w", p.Name(), err)
			}
		}
		summary, hasBreaker := st.Breakers[p.Name()]
		demand := PoolDemand{Scope: p.Scope(), Size: int64(p.Size()), PerProcess: int64(p.MaxSize()),
			BreakerOpen: hasBreaker && summary.State == BreakerOpen}
		for i, q := range ps.Queues {
			qs := QueueStats{
				Pool: p.Name(), Tier: p.TierOf(p.queues[i]), Queue: p.queues[i],
				Pending: q.Pending, Active: q.Active, Scheduled: q.Scheduled, Retry: q.Retry, Archived: q.Archived, Completed: q.Completed,
				Running: q.Running, Processed: q.Processed,
				Paused: q.Paused, PausedByOperator: q.PausedByOperator,
			}
			qs.WaitingForSlot = max(0, qs.Active-qs.Running)
			if !q.PendingSince.IsZero() && qs.Pending > 0 {
				qs.OldestPending = max(0, now.Sub(q.PendingSince))
			}
			qs.Reserved, qs.MaxWait = p.cfg.Reserved[qs.Tier], p.cfg.MaxWait[qs.Tier]
			qs.OverMaxWait = qs.MaxWait > 0 && qs.OldestPending > qs.MaxWait
			if p.cfg.MaxBacklog > 0 {
				qs.BacklogLimit = int64(p.cfg.tierLimit(qs.Tier))
			}
			if door {
				qs.RefusedBacklog, qs.RefusedRate = refusals.Count(qs.Tier, "backlog"), refusals.Count(qs.Tier, "rate")
			}
			st.Queues = append(st.Queues, qs)
			demand.Running += qs.Running
			demand.Taken += qs.WaitingForSlot
			if !qs.PausedByOperator {
				demand.Pending += qs.Pending
			}
		}
		if p.Scope() != ScopeCluster {
			st.UsefulWorkers[p.Name()] = UsefulWorkers(demand)
			continue
		}
		slots := ps.Slots
		st.ClusterSlots[p.Name()] = slots.InUse
		resized := slots.OperatorSize >= 1
		if p.cfg.Adaptive != nil {
			resized = resized && operator[p.Name()] // else the size is the adaptive limit
		}
		st.Slots[p.Name()] = PoolSlots{InUse: slots.InUse, Holders: slots.Holders, Processes: slots.Processes, Capacity: slots.Capacity,
			Resized: resized}
		st.Sizes[p.Name()] = slots.OperatorSize
		if slots.OperatorSize < 1 {
			st.Sizes[p.Name()] = int64(p.Size())
		}
		demand.Size = st.Sizes[p.Name()]
		if slots.Processes > 0 && slots.Capacity > 0 {
			// What the live workers say they run, each by its own
			// config, may differ from this client's max_size.
			demand.PerProcess = max(1, slots.Capacity/slots.Processes)
		}
		st.UsefulWorkers[p.Name()] = UsefulWorkers(demand)
	}
	st.Dependencies = dependencyStats(reg, st)
	return st, nil
}

// dependencyStats is each dependency's capacity and use, from the pools'
// sizes in effect and slots held in st.
func dependencyStats(reg *registry, st Stats) []DependencyStats {
	var out []DependencyStats
	for _, d := range reg.budget.Dependencies {
		ds := DependencyStats{Name: d.Name, Capacity: d.Capacity, Pools: []DependencyUse{}}
		for _, p := range reg.pools {
			units := p.cfg.Uses[d.Name]
			if units < 1 {
				continue
			}
			size := st.Sizes[p.Name()]
			if size < 1 {
				size = int64(p.Size())
			}
			// As the budget check counts it: a pool just shrunk claims the
			// slots its running jobs still hold.
			size = max(size, st.ClusterSlots[p.Name()])
			u := DependencyUse{Pool: p.Name(), Units: units,
				Claimed:  int64(p.cfg.claimSize(int(size)) * units),
				InUse:    st.ClusterSlots[p.Name()] * int64(units),
				HeldHere: reg.deps.held(p.Name(), d.Name)}
			ds.Claimed += u.Claimed
			ds.InUse += u.InUse
			ds.Pools = append(ds.Pools, u)
		}
		out = append(out, ds)
	}
	return out
}

// PoolDemand is what UsefulWorkers counts from: a pool's work now and
// what one worker process can run of it.
type PoolDemand struct {
	Scope Scope
	// Size is the size in effect (cluster-wide for a cluster-scoped pool,
	// per process otherwise); PerProcess is how many of the pool's jobs one
	// worker process runs at once: for a cluster-scoped pool, what the live
	// workers announce on average (each its own max_size), or this
	// client's max_size while none runs.
	Size, PerProcess int64
	// Running counts the pool's jobs whose handler runs; Taken the jobs a
	// worker took ahead of a slot (QueueStats.WaitingForSlot); Pending the
	// jobs ready to start, not counting the queues an operator paused.
	Running, Taken, Pending int64
	// BreakerOpen: the pool's circuit breaker is open, so pending jobs do
	// not start.
	BreakerOpen bool
}

// UsefulWorkers says how many worker processes a pool's work can keep
// busy now. The jobs that could run now are those running, those taken
// ahead of a slot and those pending (none of the pending while the
// breaker is open or an operator paused the queue); a cluster-scoped pool
// runs at most its size in effect of them across every process, however
// many processes there are. Each process runs PerProcess of them, so the
// answer is those jobs over PerProcess, rounded up: 0 when the pool has
// nothing to do. Scheduled jobs and jobs waiting for a retry are not
// ready and do not count. A worker process serves every pool, so the
// processes worth running are the largest answer over the pools.
func UsefulWorkers(d PoolDemand) int64 {
	if d.PerProcess < 1 {
		return 0
	}
	ready := d.Running + d.Taken
	if !d.BreakerOpen {
		ready += d.Pending
	}
	if d.Scope == ScopeCluster {
		// Jobs still running after a resize down count until they end.
		ready = max(d.Running, min(ready, d.Size))
	}
	return (ready + d.PerProcess - 1) / d.PerProcess
}

// PausePool pauses every queue of the pool, across every worker process:
// no job of the pool starts until ResumePool. Running jobs finish. It is
// the pause asynq's tools set (the queue's paused key, holding the Unix
// time), so they show it; the cluster-wide gate never lifts it. Pausing a
// paused pool changes nothing. An unknown pool is an error and changes
// nothing.
func (c *Client) PausePool(ctx context.Context, name string) error {
	p, err := c.pools().get(name)
	if err != nil {
		return err
	}
	if err := rdb.PauseQueues(ctx, c.rdb, p.queues, time.Now()); err != nil {
		return fmt.Errorf("pause pool %q: %w", name, err)
	}
	return nil
}

// ResumePool lifts an operator's pause of every queue of the pool (see
// PausePool). Pauses the cluster-wide gate or the circuit breaker set stay:
// each lifts its own (the gate when slots free up, the breaker when it
// closes). An unknown pool is an error and changes nothing.
func (c *Client) ResumePool(ctx context.Context, name string) error {
	p, err := c.pools().get(name)
	if err != nil {
		return err
	}
	if err := rdb.ResumeQueues(ctx, c.rdb, p.queues); err != nil {
		return fmt.Errorf("resume pool %q: %w", name, err)
	}
	return nil
}

// silentJobs fills out, by pool, the jobs the reads found silent, with the
// process asynq still lists for each.
func (c *Client) silentJobs(ctx context.Context, reads map[string]*rdb.UnrenewedRead, out map[string][]SilentJob) error {
	var ids []string
	for name, read := range reads {
		jobs, err := read.Result()
		if err != nil {
			return fmt.Errorf("queue stats: pool %q: %w", name, err)
		}
		p := c.pools().byName[name]
		for _, j := range jobs {
			out[name] = append(out[name], SilentJob{ID: j.ID, Tier: p.TierOf(j.Queue), For: j.Silent})
			ids = append(ids, j.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	procs, err := rdb.RunningOn(ctx, c.rdb, ids)
	if err != nil {
		return fmt.Errorf("queue stats: %w", err)
	}
	for name, jobs := range out {
		for i := range jobs {
			jobs[i].Process = procs[jobs[i].ID]
		}
		slices.SortFunc(jobs, func(a, b SilentJob) int { return cmp.Compare(a.ID, b.ID) })
		out[name] = jobs
	}
	return nil
}
