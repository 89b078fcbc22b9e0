package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/queues"
)

// Enqueuer enqueues reports and reads the queues' state; cmd/enqueue and
// the demo use it.
type Enqueuer struct {
	Config *Config
	Redis  *Redis
	Pools  *queues.Registry
	Client *queues.Client
	Insp   *asynq.Inspector
}

// NewEnqueuer connects to the configured Redis (never starting an embedded
// one: that is the worker's) and prepares a client.
func NewEnqueuer(ctx context.Context, cfg *Config) (*Enqueuer, error) {
	pools, err := queues.NewRegistryFromConfig(&cfg.Config)
	if err != nil {
		return nil, err
	}
	r, err := OpenRedis(ctx, cfg, false, nil)
	if err != nil {
		return nil, err
	}
	return NewEnqueuerFor(cfg, pools, r), nil
}

// NewEnqueuerFor builds an enqueuer on an open Redis, for a process that
// also runs the worker.
func NewEnqueuerFor(cfg *Config, pools *queues.Registry, r *Redis) *Enqueuer {
	return &Enqueuer{
		Config: cfg, Redis: r, Pools: pools,
		Client: queues.NewClient(pools, r.Client),
		Insp:   asynq.NewInspectorFromRedisClient(r.Client),
	}
}

// Close releases the client (not the Redis connection, which the caller
// owns).
func (e *Enqueuer) Close() { _ = e.Client.Close() }

// Outcome says what EnqueueReport did.
type Outcome int

const (
	// Enqueued: a new job.
	Enqueued Outcome = iota
	// AlreadyQueued: the same report for the same period is queued or
	// running; nothing was added.
	AlreadyQueued
	// Rerun: the previous job for the report and period had finished (or
	// failed for good); it was replaced by a new one.
	Rerun
)

func (o Outcome) String() string {
	return [...]string{"enqueued", "already queued or running", "enqueued again (the previous run had finished)"}[o]
}

// ReportJob identifies an enqueued report.
type ReportJob struct {
	Report string `json:"report"`
	Period string `json:"period"`
	Tier   string `json:"tier"`
	ID     string `json:"id"`
	Queue  string `json:"queue"`
}

// EnqueueReport enqueues report for period at its tier (explicit tier >
// priorities mapping > default). A bad name, period or tier is a usage error
// and enqueues nothing.
func (e *Enqueuer) EnqueueReport(ctx context.Context, report, period, tier string) (ReportJob, Outcome, error) {
	if _, ok := e.Config.Catalog.Get(report); !ok {
		return ReportJob{}, 0, cli.Usagef("unknown report %q (catalog: %s)", report, strings.Join(e.Config.Catalog.Names(), ", "))
	}
	if _, err := reports.ParsePeriod(period); err != nil {
		return ReportJob{}, 0, cli.Usagef("%v", err)
	}
	resolved, err := e.Config.Policy.Resolve(report, tier)
	if err != nil {
		return ReportJob{}, 0, cli.Usagef("%v", err)
	}
	jobs, outcomes, err := e.enqueueMany(ctx, []reports.PlannedReport{{Name: report, Tier: resolved}}, period, 1)
	if err != nil {
		return ReportJob{}, 0, err
	}
	return jobs[0], outcomes[0], nil
}

// enqueueLockTTL bounds how long a crashed enqueuer can hold a report's lock.
const enqueueLockTTL = 60 * time.Second

// pipelineChunk bounds the commands sent in one pipeline.
const pipelineChunk = 2000

// taskKey is where asynq keeps a task's hash (asynq's internal key layout,
// unchanged from v0.24 to v0.26; TestTaskKeyLayout guards it). Reading it
// directly lets a plan's checks go in one pipeline instead of one inspector
// call per report and tier.
func taskKey(queue, id string) string { return "asynq:{" + queue + "}:t:" + id }

// enqueueMany enqueues reports for period. A report and period is one job
// while it is queued or running, whatever its tier: asynq keeps task IDs
// unique per queue only and each tier is its own queue, so every tier is
// checked, under a short lock per report so that two enqueuers cannot both
// pass the check. The locks and checks go to Redis in pipelines. Each tier's
// reports are enqueued in the given order, one after the other, so they
// also start in that order; tiers go in parallel, up to parallel at once.
func (e *Enqueuer) enqueueMany(ctx context.Context, entries []reports.PlannedReport, period string, parallel int) ([]ReportJob, []Outcome, error) {
	pool, err := e.Pools.Route(handlers.TypeReport)
	if err != nil {
		return nil, nil, err
	}
	jobs := make([]ReportJob, len(entries))
	outcomes := make([]Outcome, len(entries))
	var bad []string
	for i, r := range entries {
		jobs[i] = ReportJob{Report: r.Name, Period: period, Tier: r.Tier, ID: handlers.ReportJobID(r.Name, period)}
		if _, err := pool.QueueFor(r.Tier); err != nil {
			bad = append(bad, fmt.Sprintf("report %q: %v", r.Name, err))
		}
	}
	if len(bad) > 0 {
		return nil, nil, cli.Usagef("%s\nnothing was enqueued", strings.Join(bad, "\n"))
	}

	tierQueues := pool.Queues()
	found, unlock, err := e.lockAndFind(ctx, jobs, tierQueues)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	var fresh []int
	for i := range jobs {
		existing, state := found[i].queue, found[i].state
		switch {
		case existing == "":
			outcomes[i] = Enqueued
			fresh = append(fresh, i)
		case state == "completed" || state == "archived":
			// Finished (kept for retention) or failed for good: replace it.
			if err := e.Insp.DeleteTask(existing, jobs[i].ID); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
				return nil, nil, fmt.Errorf("replace finished job %s: %w", jobs[i].ID, err)
			}
			outcomes[i] = Rerun
			fresh = append(fresh, i)
		default:
			outcomes[i] = AlreadyQueued
			jobs[i].Queue, jobs[i].Tier = existing, e.tierOf(existing)
		}
	}

	byTier := map[string][]int{}
	var tiers []string
	for _, i := range fresh {
		t := jobs[i].Tier
		if _, ok := byTier[t]; !ok {
			tiers = append(tiers, t)
		}
		byTier[t] = append(byTier[t], i)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, parallel))
	for _, tier := range tiers {
		g.Go(func() error {
			for _, i := range byTier[tier] {
				payload, err := json.Marshal(handlers.ReportPayload{Report: jobs[i].Report, Period: period})
				if err != nil {
					return err
				}
				info, err := e.Client.Enqueue(gctx, handlers.TypeReport, payload, queues.EnqueueOptions{Tier: tier, ID: jobs[i].ID, Retention: e.Config.ReportRetention})
				switch {
				case errors.Is(err, queues.ErrDuplicate):
					// Enqueued meanwhile by something that does not take
					// the lock (asynq's own tools, say).
					outcomes[i] = AlreadyQueued
					jobs[i].Queue = pool.Queues()[slices.Index(pool.Tiers(), tier)]
				case err != nil:
					return fmt.Errorf("report %q: %w", jobs[i].Report, err)
				default:
					jobs[i].Queue = info.Queue
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	return jobs, outcomes, nil
}

// lockAndFindScript takes, for each report job, its enqueue lock (SET NX
// with a TTL) and, when it got the lock, looks for the job's hash in each
// tier queue. ARGV: the lock TTL in ms, the number of tier queues q, then
// per job its lock key followed by its q task keys. It returns per job
// "locked" (another enqueuer holds it), "new", or "<k>:<state>" for the
// first tier queue k (1-based) that has the job. One call checks a whole
// chunk of a plan inside Redis instead of five commands per report.
var lockAndFindScript = redis.NewScript(`
local ttl, q, out = ARGV[1], tonumber(ARGV[2]), {}
local i = 3
while i <= #ARGV do
  if redis.call("SET", ARGV[i], "1", "NX", "PX", ttl) then
    local found = "new"
    for k = 1, q do
      local st = redis.call("HGET", ARGV[i + k], "state")
      if st then
        found = k .. ":" .. st
        break
      end
    end
    out[#out + 1] = found
  else
    out[#out + 1] = "locked"
  end
  i = i + 1 + q
end
return out
`)

// existingJob is where lockAndFind found a job: its queue and state, or
// nothing.
type existingJob struct{ queue, state string }

// lockAndFind takes the enqueue lock of every job, waiting up to
// enqueueLockTTL for locks another enqueuer holds, and reports where each
// job already exists. The returned func releases the locks.
func (e *Enqueuer) lockAndFind(ctx context.Context, jobs []ReportJob, tierQueues []string) ([]existingJob, func(), error) {
	lockKey := func(id string) string { return e.Config.Namespace + ":enqueue-lock:" + id }
	var held []string
	unlock := func() {
		bg := context.WithoutCancel(ctx)
		for start := 0; start < len(held); start += pipelineChunk {
			e.Redis.Client.Del(bg, held[start:min(len(held), start+pipelineChunk)]...)
		}
	}
	found := make([]existingJob, len(jobs))
	waiting := make([]int, len(jobs))
	for i := range jobs {
		waiting[i] = i
	}
	chunk := max(1, pipelineChunk/(1+len(tierQueues)))
	deadline := time.Now().Add(enqueueLockTTL)
	for {
		var still []int
		for start := 0; start < len(waiting); start += chunk {
			part := waiting[start:min(len(waiting), start+chunk)]
			args := []any{enqueueLockTTL.Milliseconds(), len(tierQueues)}
			for _, i := range part {
				args = append(args, lockKey(jobs[i].ID))
				for _, q := range tierQueues {
					args = append(args, taskKey(q, jobs[i].ID))
				}
			}
			res, err := lockAndFindScript.Run(ctx, e.Redis.Client, nil, args...).StringSlice()
			if err != nil {
				unlock()
				return nil, nil, fmt.Errorf("enqueue locks: %w", err)
			}
			for k, i := range part {
				switch r := res[k]; r {
				case "locked":
					still = append(still, i)
				case "new":
					held = append(held, lockKey(jobs[i].ID))
				default:
					held = append(held, lockKey(jobs[i].ID))
					n, state, _ := strings.Cut(r, ":")
					idx, _ := strconv.Atoi(n)
					found[i] = existingJob{queue: tierQueues[idx-1], state: state}
				}
			}
		}
		if len(still) == 0 {
			return found, unlock, nil
		}
		if time.Now().After(deadline) {
			unlock()
			return nil, nil, fmt.Errorf("enqueue lock for %s: still held after %s by another enqueuer", jobs[still[0]].ID, enqueueLockTTL)
		}
		select {
		case <-ctx.Done():
			unlock()
			return nil, nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		waiting = still
	}
}

func (e *Enqueuer) tierOf(queue string) string {
	if i := strings.LastIndex(queue, ":"); i >= 0 {
		return queue[i+1:]
	}
	return ""
}

// PlanResult is what EnqueuePlan did.
type PlanResult struct {
	Jobs     []ReportJob
	Outcomes []Outcome
	Took     time.Duration
}

// EnqueuePlan enqueues every report of a validated plan (see enqueueMany
// for the order and the uniqueness rules). It stops at the first Redis
// error; reports enqueued before it stay queued.
func (e *Enqueuer) EnqueuePlan(ctx context.Context, plan *reports.Plan, parallel int) (PlanResult, error) {
	start := time.Now()
	jobs, outcomes, err := e.enqueueMany(ctx, plan.Entries, plan.Period.String(), parallel)
	return PlanResult{Jobs: jobs, Outcomes: outcomes, Took: time.Since(start)}, err
}

// JobState is the state of one report job, as Progress sees it.
type JobState struct {
	Job     ReportJob
	State   string // pending, active, scheduled, retry, completed, archived, missing
	LastErr string
}

// TierCount counts a plan's jobs of one tier by state.
type TierCount struct {
	Tier    string
	Total   int
	Done    int // completed
	Failed  int // archived: failed for good
	Running int // active
	Retry   int // failed, waiting for a retry
	Waiting int // pending or scheduled
	Missing int // deleted by someone else
}

// Finished reports whether no job of the tier can change any more.
func (c TierCount) Finished() bool { return c.Done+c.Failed+c.Missing == c.Total }

// CountByTier groups states by tier, in the order of tiers.
func CountByTier(states []JobState, tiers []string) []TierCount {
	idx := map[string]int{}
	out := make([]TierCount, 0, len(tiers))
	for _, t := range tiers {
		idx[t] = len(out)
		out = append(out, TierCount{Tier: t})
	}
	for _, s := range states {
		i, ok := idx[s.Job.Tier]
		if !ok {
			idx[s.Job.Tier] = len(out)
			i = len(out)
			out = append(out, TierCount{Tier: s.Job.Tier})
		}
		c := &out[i]
		c.Total++
		switch s.State {
		case "completed":
			c.Done++
		case "archived":
			c.Failed++
		case "active":
			c.Running++
		case "retry":
			c.Retry++
		case "missing":
			c.Missing++
		default:
			c.Waiting++
		}
	}
	return out
}

// Progress reads the state of every job.
func (e *Enqueuer) Progress(ctx context.Context, jobs []ReportJob) ([]JobState, error) {
	out := make([]JobState, len(jobs))
	var mu sync.Mutex
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, j := range jobs {
		g.Go(func() error {
			st := JobState{Job: j}
			info, err := e.Insp.GetTaskInfo(j.Queue, j.ID)
			switch {
			case errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound):
				st.State = "missing"
			case err != nil:
				return err
			default:
				st.State = info.State.String()
				st.LastErr = info.LastErr
			}
			mu.Lock()
			out[i] = st
			mu.Unlock()
			return nil
		})
	}
	return out, g.Wait()
}
