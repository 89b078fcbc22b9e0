package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
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
	r, err := OpenRedis(ctx, cfg, false)
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
	return e.enqueue(ctx, reports.PlannedReport{Name: report, Tier: resolved}, period)
}

func (e *Enqueuer) enqueue(ctx context.Context, r reports.PlannedReport, period string) (ReportJob, Outcome, error) {
	payload, err := json.Marshal(handlers.ReportPayload{Report: r.Name, Period: period})
	if err != nil {
		return ReportJob{}, 0, err
	}
	job := ReportJob{Report: r.Name, Period: period, Tier: r.Tier, ID: handlers.ReportJobID(r.Name, period)}

	// asynq keeps job IDs unique per queue only, and each tier is its own
	// queue: look for the job in every tier, under a short lock so that two
	// enqueues of the same report and period cannot both pass the check.
	unlock, err := e.lock(ctx, job.ID)
	if err != nil {
		return job, 0, err
	}
	defer unlock()
	outcome := Enqueued
	prev, err := e.findReport(job.ID)
	if err != nil {
		return job, 0, err
	}
	if prev != nil {
		if prev.State != asynq.TaskStateCompleted && prev.State != asynq.TaskStateArchived {
			job.Queue = prev.Queue
			job.Tier = e.tierOf(prev.Queue)
			return job, AlreadyQueued, nil
		}
		// Finished (kept for retention) or failed for good: replace it.
		if err := e.Insp.DeleteTask(prev.Queue, prev.ID); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
			return job, 0, fmt.Errorf("replace finished job %s: %w", job.ID, err)
		}
		outcome = Rerun
	}
	info, err := e.Client.Enqueue(ctx, handlers.TypeReport, payload, queues.EnqueueOptions{Tier: r.Tier, ID: job.ID, Retention: e.Config.ReportRetention})
	if errors.Is(err, queues.ErrDuplicate) {
		// Enqueued by something that does not take the lock (asynq's own
		// tools, say) between the check and now.
		return job, AlreadyQueued, nil
	}
	if err != nil {
		return job, 0, err
	}
	job.Queue = info.Queue
	return job, outcome, nil
}

// enqueueLockTTL bounds how long a crashed enqueuer can hold a report's lock.
const enqueueLockTTL = 10 * time.Second

// lock takes the enqueue lock of a report job ID, waiting up to
// enqueueLockTTL for another enqueuer to finish.
func (e *Enqueuer) lock(ctx context.Context, id string) (func(), error) {
	key := e.Config.Namespace + ":enqueue-lock:" + id
	deadline := time.Now().Add(enqueueLockTTL)
	for {
		ok, err := e.Redis.Client.SetNX(ctx, key, "1", enqueueLockTTL).Result()
		if err != nil {
			return nil, fmt.Errorf("enqueue lock for %s: %w", id, err)
		}
		if ok {
			return func() { e.Redis.Client.Del(context.WithoutCancel(ctx), key) }, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("enqueue lock for %s: still held after %s by another enqueuer", id, enqueueLockTTL)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// findReport looks for a report job by ID in every tier queue of the
// report pool.
func (e *Enqueuer) findReport(id string) (*asynq.TaskInfo, error) {
	p, err := e.Pools.Route(handlers.TypeReport)
	if err != nil {
		return nil, err
	}
	for _, q := range p.Queues() {
		info, err := e.Insp.GetTaskInfo(q, id)
		if err == nil {
			return info, nil
		}
		if !errors.Is(err, asynq.ErrTaskNotFound) && !errors.Is(err, asynq.ErrQueueNotFound) {
			return nil, err
		}
	}
	return nil, nil
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

// EnqueuePlan enqueues every report of a validated plan. Each tier's
// reports go in plan order, one after the other, so they also start in plan
// order (asynq's queues are FIFO); the tiers, which are separate queues, are
// enqueued in parallel, up to parallel at once. It stops at the first Redis
// error; reports enqueued before it stay queued.
func (e *Enqueuer) EnqueuePlan(ctx context.Context, plan *reports.Plan, parallel int) (PlanResult, error) {
	res := PlanResult{Jobs: make([]ReportJob, len(plan.Entries)), Outcomes: make([]Outcome, len(plan.Entries))}
	byTier := map[string][]int{}
	var tiers []string
	for i, entry := range plan.Entries {
		if _, ok := byTier[entry.Tier]; !ok {
			tiers = append(tiers, entry.Tier)
		}
		byTier[entry.Tier] = append(byTier[entry.Tier], i)
	}
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, parallel))
	for _, tier := range tiers {
		g.Go(func() error {
			for _, i := range byTier[tier] {
				entry := plan.Entries[i]
				job, outcome, err := e.enqueue(gctx, entry, plan.Period.String())
				if err != nil {
					return fmt.Errorf("report %q: %w", entry.Name, err)
				}
				res.Jobs[i], res.Outcomes[i] = job, outcome
			}
			return nil
		})
	}
	err := g.Wait()
	res.Took = time.Since(start)
	return res, err
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
