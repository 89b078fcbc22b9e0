package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/schedule"
	"github.com/lci-labs/compartment/queues"
)

// ScheduleFile is one entry of the worker file's schedules: a month-end
// plan that enqueues itself on a cron schedule (package schedule).
type ScheduleFile struct {
	// Name identifies the schedule ([a-z0-9_-]). Required.
	Name string `yaml:"name"`
	// Plan is the month-end plan file, relative to this file. Required;
	// read and checked against the catalog and priorities at load.
	Plan string `yaml:"plan"`
	// Cron is a standard 5-field cron expression, read in Timezone.
	// Required.
	Cron string `yaml:"cron"`
	// Timezone is an IANA zone name. Defaults to UTC.
	Timezone string `yaml:"timezone,omitempty"`
	// Period is the month a run covers: previous or current. Defaults to
	// previous.
	Period string `yaml:"period,omitempty"`
	// Enabled turns the schedule off when false, without deleting it.
	// Defaults to true.
	Enabled *bool `yaml:"enabled,omitempty"`
	// CatchUp is how long after a fire time missed by every worker the run
	// is still done, by the first worker up. Defaults to 24h; from 1m to
	// 744h (31 days).
	CatchUp time.Duration `yaml:"catch_up,omitempty"`
	// OnComplete and OnFailure are the jobs each run of the schedule
	// enqueues when it ends (docs/RUNS.md); each replaces the plan's own.
	OnComplete *reports.Step `yaml:"on_complete,omitempty"`
	OnFailure  *reports.Step `yaml:"on_failure,omitempty"`
}

// Schedule is a loaded schedule: its timing and its validated plan.
type Schedule struct {
	*schedule.Schedule
	// PlanPath is the plan file, resolved against the config file.
	PlanPath string
	// Plan is the plan's reports with their tiers resolved.
	Plan []reports.PlannedReport
	// OnComplete and OnFailure are the run's steps: the schedule's, or
	// else its plan's.
	OnComplete, OnFailure *reports.Step
}

// loadSchedules reads every schedule's plan and validates the schedules,
// returning every problem, each naming its schedule (a second schedule of
// the same name by its place in the list, schedules[1] "m", after the
// problem that it is listed twice).
func (c *Config) loadSchedules() []string {
	var problems []string
	seen := map[string]int{}
	var reportPool PoolFile
	var served map[string]bool
	if p, ok := c.route(handlers.TypeReport); ok && p.Tiers != nil {
		reportPool, served = p, map[string]bool{}
		for _, t := range p.Tiers {
			served[t] = true
		}
	}
	for i, f := range c.File.Schedules {
		label := fmt.Sprintf("schedules[%d]", i)
		dup := false
		if schedule.ValidateName(f.Name) == nil {
			label = fmt.Sprintf("schedule %q", f.Name)
			var prev int
			if prev, dup = seen[f.Name]; dup {
				problems = append(problems, fmt.Sprintf("%s: listed twice (also schedules[%d])", label, prev))
				// The second one is still checked, its problems said
				// under its place in the list, since its name is the
				// first one's.
				label = fmt.Sprintf("schedules[%d] %q", i, f.Name)
			} else {
				seen[f.Name] = i
			}
		}
		add := func(format string, args ...any) {
			problems = append(problems, label+": "+fmt.Sprintf(format, args...))
		}
		s, err := schedule.New(schedule.Spec{
			Name: f.Name, Cron: f.Cron, Timezone: f.Timezone, Period: schedule.Period(f.Period),
			CatchUp: f.CatchUp, Disabled: f.Enabled != nil && !*f.Enabled,
		})
		if err != nil {
			add("%s", trimInvalid(err))
		}
		sc := &Schedule{Schedule: s}
		switch {
		case f.Plan == "":
			add("plan is required (a month-end plan file, relative to this file)")
		case c.Catalog == nil || c.Policy == nil:
			// The catalog or the priorities failed to load, which is
			// reported already: the plan cannot be checked against them.
		default:
			sc.PlanPath = relativeTo(c.Path, f.Plan)
			// The period is the run's; any valid one checks the plan.
			plan, err := reports.LoadPlan(sc.PlanPath, "2000-01", c.Catalog, c.Policy)
			if err != nil {
				add("%v", err)
				break
			}
			sc.Plan = plan.Entries
			sc.OnComplete, sc.OnFailure = plan.OnComplete, plan.OnFailure
			for _, e := range plan.Entries {
				if served != nil && !served[e.Tier] {
					add("plan %s: report %q has tier %q, which pool %q does not serve (its tiers: %q)", sc.PlanPath, e.Name, e.Tier, reportPool.Name, reportPool.Tiers)
				}
			}
		}
		for _, st := range []struct {
			name string
			step *reports.Step
			into **reports.Step
		}{{"on_complete", f.OnComplete, &sc.OnComplete}, {"on_failure", f.OnFailure, &sc.OnFailure}} {
			if st.step != nil {
				*st.into = st.step
				problems = append(problems, st.step.Problems(label+": "+st.name)...)
			}
		}
		for _, st := range []struct {
			name string
			step *reports.Step
		}{{"on_complete", sc.OnComplete}, {"on_failure", sc.OnFailure}} {
			if st.step != nil {
				problems = append(problems, c.StepProblems(label+": "+st.name, st.step)...)
			}
		}
		if s != nil && !dup {
			c.Schedules = append(c.Schedules, sc)
		}
	}
	return problems
}

// trimInvalid drops package schedule's "invalid schedule: " marker.
func trimInvalid(err error) string {
	msg := err.Error()
	prefix := schedule.ErrInvalid.Error() + ": "
	if len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
		return msg[len(prefix):]
	}
	return msg
}

// Schedule returns the loaded schedule called name, or nil.
func (c *Config) Schedule(name string) *Schedule {
	for _, s := range c.Schedules {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// SchedulerOptions tune NewScheduler.
type SchedulerOptions struct {
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock defaults to the system clock.
	Clock schedule.Clock
	// ID names the process in claims and records; defaults to
	// host:pid:random.
	ID string
}

// NewScheduler returns the scheduler of cfg's schedules, whose runs
// enqueue through e and are recorded in e's Redis under the namespace.
func NewScheduler(cfg *Config, e *Enqueuer, o SchedulerOptions) *schedule.Scheduler {
	list := make([]*schedule.Schedule, len(cfg.Schedules))
	for i, s := range cfg.Schedules {
		list[i] = s.Schedule
	}
	run := func(ctx context.Context, s *schedule.Schedule, period string) (schedule.Counts, error) {
		sc := e.now().Schedule(s.Name) // its plan's tiers as of the last reload
		p, err := reports.ParsePeriod(period)
		if err != nil {
			return schedule.Counts{}, err
		}
		e := e.as("schedule " + s.Name)
		return e.EnqueueMissing(ctx, &reports.Plan{Period: p, Entries: sc.Plan, Path: sc.PlanPath, OnComplete: sc.OnComplete, OnFailure: sc.OnFailure})
	}
	return schedule.NewScheduler(list, e.ScheduleStore(), run, schedule.Options{Logger: o.Logger, Clock: o.Clock, ID: o.ID})
}

// ScheduleStore is the store of run records in e's Redis.
func (e *Enqueuer) ScheduleStore() *schedule.Store {
	return schedule.NewStore(e.Redis.Client, e.Client.Namespace())
}

// EnqueueMissing enqueues the plan's reports that have no job for its
// period yet: a report whose job is queued, running or finished (kept for
// report_retention) is counted as already present and left alone, so a
// run taken up again, or run by hand after the schedule, enqueues each
// report at most once. The rest go through the same batch enqueue as
// EnqueuePlan. A plan the batch pool's door refuses (queues.ErrRefused)
// counts every missing report as refused, and is the run's error.
//
// Runs for the same period take turns (a lock in Redis per period, waited
// for up to periodLockWait): otherwise a job another run enqueued, and that
// finished between this run's look-up and its enqueue, would be replaced
// and run again.
func (e *Enqueuer) EnqueueMissing(ctx context.Context, plan *reports.Plan) (schedule.Counts, error) {
	var counts schedule.Counts
	period := plan.Period.String()
	unlock, err := e.lockPeriod(ctx, period)
	if err != nil {
		return counts, err
	}
	defer unlock()
	present, err := e.present(ctx, plan.Entries, period)
	if err != nil {
		return counts, err
	}
	var todo []reports.PlannedReport
	for i, r := range plan.Entries {
		if present[i] {
			counts.AlreadyPresent++
		} else {
			todo = append(todo, r)
		}
	}
	if len(todo) == 0 {
		return counts, nil
	}
	_, outcomes, _, err := e.enqueueMany(ctx, todo, period, e.runOptions(plan))
	if errors.Is(err, queues.ErrRefused) {
		// The batch pool's door refused the plan whole: nothing of it was
		// enqueued. The run fails with the door's reason and is tried
		// again while its fire time is inside the catch-up window.
		counts.Refused = len(todo)
		return counts, err
	}
	if err != nil {
		return counts, err
	}
	for _, o := range outcomes {
		switch o {
		case queues.Enqueued, queues.Replaced:
			counts.Enqueued++
		case queues.Duplicate:
			counts.AlreadyPresent++
		default:
			counts.Refused++
		}
	}
	return counts, nil
}

// Bounds of the per-period lock of EnqueueMissing: how long it is held at
// most (a run that crashed frees it then), and how long a run waits for it.
const (
	periodLockTTL  = 2 * time.Minute
	periodLockWait = time.Minute
)

// lockPeriod takes the period's lock, waiting for another run to release
// it; the returned func releases it (if it is still this call's).
func (e *Enqueuer) lockPeriod(ctx context.Context, period string) (func(), error) {
	store := e.ScheduleStore()
	token := schedule.ProcessID()
	deadline := time.Now().Add(periodLockWait)
	for {
		ok, err := store.LockPeriod(ctx, period, token, periodLockTTL)
		if err != nil {
			return nil, fmt.Errorf("lock the period %s: %w", period, err)
		}
		if ok {
			return func() {
				_ = store.UnlockPeriod(context.WithoutCancel(ctx), period, token) // or it lapses after periodLockTTL
			}, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("another run for %s has been enqueuing for over %s; try again later", period, periodLockWait)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for another run for %s to finish enqueuing: %w", period, ctx.Err())
		case <-t.C:
		}
	}
}

// present reports, per report, whether its job for period exists in any
// queue of the reports pool, in any state, in one pipelined round trip.
func (e *Enqueuer) present(ctx context.Context, entries []reports.PlannedReport, period string) ([]bool, error) {
	ids := make([]string, len(entries))
	for i, r := range entries {
		ids[i] = handlers.ReportJobID(r.Name, period)
	}
	return e.Client.Exists(ctx, handlers.TypeReport, ids)
}

// ScheduleStatus is one schedule in Status: how it is set, its next run
// and its last.
type ScheduleStatus struct {
	Name     string `json:"name"`
	Enabled  bool   `json:"enabled"`
	Cron     string `json:"cron"`
	Timezone string `json:"timezone"`
	// Period is previous or current.
	Period  string `json:"period"`
	Plan    string `json:"plan"`
	Reports int    `json:"reports"`
	// CatchUp is the catch-up window, as text ("24h0m0s").
	CatchUp string `json:"catch_up"`
	// NextRun is the next fire time (none when disabled), NextPeriod the
	// month it will cover.
	NextRun    *time.Time `json:"next_run,omitempty"`
	NextPeriod string     `json:"next_period,omitempty"`
	// LastRun is the newest run's record; Runs, when asked for, the newest
	// few, newest first.
	LastRun *schedule.Record  `json:"last_run,omitempty"`
	Runs    []schedule.Record `json:"runs,omitempty"`
}

// Schedules reads each schedule's state at now: its next fire time from
// the config, and its newest runs (up to runs of them; at least the last)
// from Redis.
func (e *Enqueuer) Schedules(ctx context.Context, now time.Time, runs int) ([]ScheduleStatus, error) {
	store := e.ScheduleStore()
	out := make([]ScheduleStatus, 0, len(e.Config.Schedules))
	for _, s := range e.Config.Schedules {
		st := ScheduleStatus{
			Name: s.Name, Enabled: !s.Disabled, Cron: s.Cron, Timezone: s.Timezone, Period: string(s.Period),
			Plan: s.PlanPath, Reports: len(s.Plan), CatchUp: s.CatchUp.String(),
		}
		if !s.Disabled {
			if next := s.Next(now); !next.IsZero() {
				next = next.In(s.Location)
				st.NextRun, st.NextPeriod = &next, s.PeriodFor(next)
			}
		}
		recs, err := store.Runs(ctx, s.Name, max(runs, 1))
		if err != nil {
			return nil, err
		}
		if len(recs) > 0 {
			st.LastRun = &recs[0]
		}
		if runs > 0 {
			st.Runs = recs
		}
		out = append(out, st)
	}
	return out, nil
}

// startSchedules builds and starts the scheduler of the enabled schedules
// on the worker's Redis; without any, it does nothing.
func (w *Worker) startSchedules(ctx context.Context, log *slog.Logger, clock schedule.Clock) error {
	if w.Scheduler != nil {
		return w.Scheduler.Start(ctx) // started already: does nothing
	}
	enabled := 0
	for _, s := range w.Config.Schedules {
		if !s.Disabled {
			enabled++
		}
	}
	if enabled == 0 {
		return nil
	}
	enq, err := w.NewEnqueuer()
	if err != nil {
		return err
	}
	w.Scheduler = NewScheduler(w.Config, enq, SchedulerOptions{Logger: log, Clock: clock})
	now := time.Now()
	if clock != nil {
		now = clock.Now()
	}
	for _, s := range w.Config.Schedules {
		if s.Disabled {
			log.Info("schedule: disabled", "schedule", s.Name)
			continue
		}
		next := s.Next(now).In(s.Location)
		log.Info("schedule: enabled", "schedule", s.Name, "cron", s.Cron, "timezone", s.Timezone,
			"next_run", next.Format(time.RFC3339), "next_period", s.PeriodFor(next), "catch_up", s.CatchUp.String())
	}
	return w.Scheduler.Start(ctx)
}
