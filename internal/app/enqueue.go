package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
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
	Client *queues.Client
	Insp   *asynq.Inspector
	// RateKey names the caller (a requester, a tenant) for the pools'
	// enqueue_rate_per_key limits. Empty: none, and no per-key limit
	// applies (cmd/enqueue refuses that for a pool with one).
	RateKey string
	// StartedBy says who starts the runs this enqueuer creates (a person,
	// a schedule), for the runs' records.
	StartedBy string

	ownsRedis bool
	current   atomic.Pointer[Config] // set by a worker's reload; see now
}

// NewEnqueuer connects to the configured Redis (never starting an embedded
// one: that is the worker's) and prepares a client. Close closes the Redis
// connection it opened.
func NewEnqueuer(ctx context.Context, cfg *Config) (*Enqueuer, error) {
	r, err := OpenRedis(ctx, cfg.Redis, false, nil)
	if err != nil {
		return nil, err
	}
	e, err := NewEnqueuerFor(cfg, r)
	if err != nil {
		r.Close()
		return nil, err
	}
	e.ownsRedis = true
	return e, nil
}

// NewEnqueuerFor builds an enqueuer on an open Redis, for a process that
// also runs the worker. Close leaves r open: its opener closes it.
func NewEnqueuerFor(cfg *Config, r *Redis) (*Enqueuer, error) {
	return newEnqueuerFor(cfg, r, nil)
}

// newEnqueuerFor is NewEnqueuerFor whose client tells onBreakerChange (nil:
// nobody) of the breaker changes it forces.
func newEnqueuerFor(cfg *Config, r *Redis, onBreakerChange func(queues.BreakerChange)) (*Enqueuer, error) {
	ec := cfg.Engine
	ec.Handlers, ec.OnBreakerChange = nil, onBreakerChange
	c, err := queues.NewClient(r.Client, ec)
	if err != nil {
		return nil, err
	}
	return &Enqueuer{Config: cfg, Redis: r, Client: c, Insp: asynq.NewInspectorFromRedisClient(r.Client)}, nil
}

// Close releases what the enqueuer opened: the Redis connection, when
// NewEnqueuer opened it.
func (e *Enqueuer) Close() {
	if e.ownsRedis {
		e.Redis.Close()
	}
}

// ReportJob identifies an enqueued report.
type ReportJob struct {
	Report string `json:"report"`
	Period string `json:"period"`
	Tier   string `json:"tier"`
	ID     string `json:"id"`
	Queue  string `json:"queue"`
}

// OutcomeText says what an enqueue of a report did, for people.
func OutcomeText(o queues.EnqueueOutcome) string {
	switch o {
	case queues.Duplicate:
		return "already queued or running"
	case queues.Replaced:
		return "enqueued again (the previous run had finished)"
	case queues.NotEnqueued:
		return "not enqueued"
	default:
		return "enqueued"
	}
}

// EnqueueReport enqueues report for period at its tier (explicit tier >
// priorities mapping > default). A bad name, period or tier is a usage error
// and enqueues nothing. The same report for the same period is one job while
// it is queued or running, whatever its tier.
func (e *Enqueuer) EnqueueReport(ctx context.Context, report, period, tier string) (ReportJob, queues.EnqueueOutcome, error) {
	if _, ok := e.Config.Catalog.Get(report); !ok {
		return ReportJob{}, 0, cli.Usagef("unknown report %s (catalog: %s)", cli.Quote(report), strings.Join(e.Config.Catalog.Names(), ", "))
	}
	if _, err := reports.ParsePeriod(period); err != nil {
		return ReportJob{}, 0, cli.Usagef("%v", err)
	}
	policy := e.now().Policy
	if tier != "" && !policy.Has(tier) {
		return ReportJob{}, 0, cli.Usagef("priority: unknown tier %s (tiers, highest first: %q)", cli.Quote(tier), policy.Tiers())
	}
	resolved, err := policy.Resolve(report, tier)
	if err != nil {
		return ReportJob{}, 0, cli.Usagef("%v", err)
	}
	jobs, outcomes, _, err := e.enqueueMany(ctx, []reports.PlannedReport{{Name: report, Tier: resolved}}, period, nil)
	if err != nil {
		return ReportJob{}, 0, err
	}
	return jobs[0], outcomes[0], nil
}

// EnqueueJob enqueues one job of any routed job type, its payload JSON
// checked first exactly as its handler will decode it: a bad payload, an
// unknown job type or a tier the pool does not serve is a usage error and
// enqueues nothing. A report job goes through EnqueueReport, so it keeps
// its rule of one job per report and period.
func (e *Enqueuer) EnqueueJob(ctx context.Context, jobType string, payload []byte, tier string) (queues.EnqueueResult, error) {
	if err := handlers.Check(jobType, payload); err != nil {
		return queues.EnqueueResult{}, cli.Usagef("%v\nnothing was enqueued", err)
	}
	if jobType == handlers.TypeReport {
		p, _ := handlers.Report.Decode(payload) // checked above
		job, outcome, err := e.EnqueueReport(ctx, p.Report, p.Period, tier)
		if err != nil {
			return queues.EnqueueResult{}, err
		}
		return queues.EnqueueResult{ID: job.ID, Queue: job.Queue, Tier: job.Tier, Outcome: outcome}, nil
	}
	res, err := e.Client.Enqueue(ctx, jobType, payload, queues.EnqueueOptions{Tier: tier, RateKey: e.RateKey})
	if errors.Is(err, queues.ErrInvalidRequest) {
		return queues.EnqueueResult{}, cli.Usagef("%v", err)
	}
	return res, err
}

// as returns a copy of e whose runs say they were started by who.
func (e *Enqueuer) as(who string) *Enqueuer {
	c := &Enqueuer{Config: e.Config, Redis: e.Redis, Client: e.Client, Insp: e.Insp, RateKey: e.RateKey, StartedBy: who}
	c.current.Store(e.current.Load())
	return c
}

// runOptions are the options of the run that enqueues plan: a month-end
// of its period, with its steps, and an ID people can read.
func (e *Enqueuer) runOptions(plan *reports.Plan) *queues.RunOptions {
	period := plan.Period.String()
	o := &queues.RunOptions{
		ID:   "month-end-" + period + "-" + uuid.NewString()[:8],
		Kind: "month-end", Period: period, Plan: plan.Path, StartedBy: e.StartedBy,
	}
	o.OnComplete, o.OnFailure = runStep(plan.OnComplete), runStep(plan.OnFailure)
	return o
}

func runStep(s *reports.Step) *queues.RunStep {
	if s == nil {
		return nil
	}
	payload, _ := s.PayloadJSON() // checked when the plan was read
	return &queues.RunStep{JobType: s.JobType, Payload: payload, Tier: s.Tier}
}

// enqueueMany enqueues reports for period through the engine's batch
// enqueue: a report and period is one job (its ID) while it is queued or
// running, and each tier's reports start in the given order. With run,
// the reports are one run of those options (its ID is returned): a report
// whose job is already queued or running elsewhere is not part of it.
func (e *Enqueuer) enqueueMany(ctx context.Context, entries []reports.PlannedReport, period string, run *queues.RunOptions) ([]ReportJob, []queues.EnqueueOutcome, string, error) {
	if run == nil {
		jobs, outcomes, err := e.enqueueVia(ctx, entries, period, e.Client.EnqueueMany)
		return jobs, outcomes, "", err
	}
	runID := ""
	jobs, outcomes, err := e.enqueueVia(ctx, entries, period, func(ctx context.Context, reqs []queues.Request) ([]queues.EnqueueResult, error) {
		r, res, err := e.Client.EnqueueRun(ctx, *run, reqs)
		if r != nil {
			runID = r.ID()
		}
		return res, err
	})
	return jobs, outcomes, runID, err
}

// enqueueVia builds the reports' requests and enqueues them with enqueue.
func (e *Enqueuer) enqueueVia(ctx context.Context, entries []reports.PlannedReport, period string, enqueue func(context.Context, []queues.Request) ([]queues.EnqueueResult, error)) ([]ReportJob, []queues.EnqueueOutcome, error) {
	pool, err := e.Client.Route(handlers.TypeReport)
	if err != nil {
		return nil, nil, err
	}
	var bad []string
	for _, r := range entries {
		if _, err := pool.QueueFor(r.Tier); err != nil {
			bad = append(bad, fmt.Sprintf("report %s: %v", cli.Quote(r.Name), err))
		}
	}
	if len(bad) > 0 {
		return nil, nil, cli.Usagef("%s\nnothing was enqueued", strings.Join(bad, "\n"))
	}
	reqs := make([]queues.Request, len(entries))
	for i, r := range entries {
		req, err := handlers.Report.Request(handlers.ReportPayload{Report: r.Name, Period: period}, queues.EnqueueOptions{
			Tier: r.Tier, ID: handlers.ReportJobID(r.Name, period), Retention: e.Config.ReportRetention, RateKey: e.RateKey,
		})
		if err != nil {
			return nil, nil, err
		}
		reqs[i] = req
	}
	res, err := enqueue(ctx, reqs)
	if errors.Is(err, queues.ErrInvalidRequest) {
		return nil, nil, cli.Usagef("%v", err)
	}
	if err != nil {
		return nil, nil, err
	}
	jobs := make([]ReportJob, len(entries))
	outcomes := make([]queues.EnqueueOutcome, len(entries))
	for i, r := range res {
		jobs[i] = ReportJob{Report: entries[i].Name, Period: period, Tier: r.Tier, ID: r.ID, Queue: r.Queue}
		outcomes[i] = r.Outcome
	}
	return jobs, outcomes, nil
}

// PlanRun is a month-end's run filled in parts: the demo enqueues its
// plans tier by tier, each plan one run.
type PlanRun struct {
	e      *Enqueuer
	run    *queues.Run
	period string
}

// StartPlanRun starts plan's run (its steps included) without enqueuing
// anything; Enqueue adds reports, Seal ends the adding.
func (e *Enqueuer) StartPlanRun(ctx context.Context, plan *reports.Plan) (*PlanRun, error) {
	r, err := e.Client.StartRun(ctx, *e.runOptions(plan))
	if errors.Is(err, queues.ErrInvalidRequest) {
		return nil, cli.Usagef("%v", err)
	}
	if err != nil {
		return nil, err
	}
	return &PlanRun{e: e, run: r, period: plan.Period.String()}, nil
}

// ID returns the run's ID.
func (p *PlanRun) ID() string { return p.run.ID() }

// Enqueue enqueues entries as reports of the run.
func (p *PlanRun) Enqueue(ctx context.Context, entries []reports.PlannedReport) (PlanResult, error) {
	start := time.Now()
	jobs, outcomes, err := p.e.enqueueVia(ctx, entries, p.period, p.run.EnqueueMany)
	return PlanResult{Jobs: jobs, Outcomes: outcomes, Took: time.Since(start), Run: p.run.ID()}, err
}

// Seal says no more reports join the run.
func (p *PlanRun) Seal(ctx context.Context) error { return p.run.Seal(ctx) }

// PlanResult is what EnqueuePlan did.
type PlanResult struct {
	Jobs     []ReportJob
	Outcomes []queues.EnqueueOutcome
	Took     time.Duration
	// Run is the ID of the run the plan's reports are ("" when it could
	// not be created).
	Run string
}

// EnqueuePlan enqueues every report of a validated plan (see enqueueMany
// for the order and the uniqueness rules). A plan the batch pool's door
// refuses (queues.ErrRefused) is refused whole: nothing is enqueued. It
// stops at the first Redis error; reports enqueued before it stay queued.
func (e *Enqueuer) EnqueuePlan(ctx context.Context, plan *reports.Plan) (PlanResult, error) {
	start := time.Now()
	jobs, outcomes, run, err := e.enqueueMany(ctx, plan.Entries, plan.Period.String(), e.runOptions(plan))
	return PlanResult{Jobs: jobs, Outcomes: outcomes, Took: time.Since(start), Run: run}, err
}

// JobState is the state of one report job, as Progress sees it.
type JobState struct {
	Job     ReportJob
	State   string // pending, active, scheduled, retry, completed, archived, missing
	LastErr string
}

// Ended reports whether the job can change no more: completed, archived
// (failed for good or cancelled with its run) or deleted by someone else.
// TierCount.Finished is the same rule over a tier's counts.
func (s JobState) Ended() bool {
	return s.State == "completed" || s.State == "archived" || s.State == "missing"
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

// Progress reads the state of every job. asynq's reads take no context:
// once ctx ends or a read fails, the reads not started yet are skipped, so
// an interrupt waits for at most the reads under way.
func (e *Enqueuer) Progress(ctx context.Context, jobs []ReportJob) ([]JobState, error) {
	out := make([]JobState, len(jobs))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, j := range jobs {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			st := JobState{Job: j}
			info, err := e.Insp.GetTaskInfo(j.Queue, j.ID)
			if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
				// It may have been promoted to another tier since.
				st.Job, info, err = e.findMoved(j)
			}
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

// findMoved looks for a job in the other queues of its pool (an operator
// may have promoted it), and returns it with its queue and tier updated;
// asynq.ErrTaskNotFound when no queue holds it.
func (e *Enqueuer) findMoved(j ReportJob) (ReportJob, *asynq.TaskInfo, error) {
	pool, err := e.Client.Route(handlers.TypeReport)
	if err != nil {
		return j, nil, err
	}
	for _, q := range pool.Queues() {
		if q == j.Queue {
			continue
		}
		info, err := e.Insp.GetTaskInfo(q, j.ID)
		if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
			continue
		}
		if err == nil {
			j.Queue, j.Tier = q, pool.TierOf(q)
		}
		return j, info, err
	}
	return j, nil, asynq.ErrTaskNotFound
}
