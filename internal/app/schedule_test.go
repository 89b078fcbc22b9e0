package app_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/schedule"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// monthEndSchedule is a schedules: block running the shipped month-end
// plan at 02:00 on the 1st in Berlin, for the previous month.
func monthEndSchedule(extra string) string {
	return fmt.Sprintf(`schedules:
  - name: month-end
    plan: %s
    cron: "0 2 1 * *"
    timezone: Europe/Berlin
%s`, apptest.RepoPath("configs/month-end.yaml"), extra)
}

// planReports is the number of reports in configs/month-end.yaml.
func planReports(t *testing.T, cfg *app.Config) int {
	t.Helper()
	p, err := reports.LoadPlan(apptest.RepoPath("configs/month-end.yaml"), "2026-10", cfg.Catalog, cfg.Policy)
	require.NoError(t, err)
	return len(p.Entries)
}

func TestScheduleConfig(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg, err := app.Load(testConfig(t, r, monthEndSchedule("    catch_up: 6h\n  - name: adhoc\n    plan: "+apptest.RepoPath("configs/month-end.yaml")+"\n    cron: \"@daily\"\n    period: current\n    enabled: false\n")), nil)
	require.NoError(t, err)
	require.Len(t, cfg.Schedules, 2)
	me := cfg.Schedule("month-end")
	require.Equal(t, "Europe/Berlin", me.Timezone)
	require.Equal(t, schedule.PeriodPrevious, me.Period, "the default period")
	require.Equal(t, 6*time.Hour, me.CatchUp)
	require.False(t, me.Disabled, "enabled by default")
	require.Len(t, me.Plan, planReports(t, cfg))
	adhoc := cfg.Schedule("adhoc")
	require.True(t, adhoc.Disabled)
	require.Equal(t, "UTC", adhoc.Timezone, "the default zone")
	require.Equal(t, schedule.DefaultCatchUp, adhoc.CatchUp)
	require.Nil(t, cfg.Schedule("nope"))
}

// TestScheduleConfigMistakes: every bad setting is a config error naming
// the schedule and the setting, all reported together.
func TestScheduleConfigMistakes(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	dir := t.TempDir()
	badPlan := filepath.Join(dir, "bad-plan.yaml")
	require.NoError(t, os.WriteFile(badPlan, []byte("reports:\n  - name: payroll\n"), 0o600))
	plan := apptest.RepoPath("configs/month-end.yaml")
	cases := []struct {
		name, block string
		want        []string
	}{
		{"bad cron", `  - {name: m, plan: PLAN, cron: "0 25 1 * *"}`, []string{`schedule "m": cron "0 25 1 * *": end of range (25) above maximum (23): 25`}},
		{"unknown zone", `  - {name: m, plan: PLAN, cron: "0 2 1 * *", timezone: Europe/Atlantis}`, []string{`schedule "m": timezone "Europe/Atlantis": unknown time zone`}},
		{"missing plan file", `  - {name: m, plan: /nonexistent/plan.yaml, cron: "0 2 1 * *"}`, []string{`schedule "m": plan: open /nonexistent/plan.yaml: no such file or directory`}},
		{"invalid plan", `  - {name: m, plan: BAD, cron: "0 2 1 * *"}`, []string{`schedule "m": plan ` + badPlan + `: reports[0] "payroll": unknown report`}},
		{"no plan", `  - {name: m, cron: "0 2 1 * *"}`, []string{`schedule "m": plan is required`}},
		{"no cron", `  - {name: m, plan: PLAN}`, []string{`schedule "m": cron is required`}},
		{"bad period", `  - {name: m, plan: PLAN, cron: "0 2 1 * *", period: last}`, []string{`schedule "m": period "last": use previous`}},
		{"short catch-up", `  - {name: m, plan: PLAN, cron: "0 2 1 * *", catch_up: 10s}`, []string{`schedule "m": catch_up must be at least 1m0s, got 10s`}},
		{"duplicate name", "  - {name: m, plan: PLAN, cron: \"0 2 1 * *\"}\n  - {name: m, plan: PLAN, cron: \"0 3 1 * *\"}", []string{`schedule "m": listed twice (also schedules[0])`}},
		{"duplicate name with its own mistakes", "  - {name: m, plan: PLAN, cron: \"0 2 1 * *\"}\n  - {name: m, plan: /nonexistent/plan.yaml, cron: \"0 3 1 * *\", timezone: Nowhere}",
			[]string{`schedule "m": listed twice (also schedules[0])`, `schedules[1] "m": plan: open /nonexistent/plan.yaml: no such file or directory`, `schedules[1] "m": timezone "Nowhere"`}},
		{"bad name", `  - {name: "Month End", plan: PLAN, cron: "0 2 1 * *"}`, []string{`schedules[0]: name "Month End" may hold only a-z, 0-9, _ and -`}},
		{"unknown key", `  - {name: m, plan: PLAN, cron: "0 2 1 * *", when: tonight}`, []string{"unknown key schedules[0].when"}},
		{"completion steps", `  - {name: m, plan: PLAN, cron: "0 2 1 * *", on_complete: {job_type: nowhere}, on_failure: {job_type: report:bundle, tier: urgent, payload: {run: 1}}}`,
			[]string{`schedule "m": on_complete: job type "nowhere" is routed to no pool (job types: `, `schedule "m": on_failure: payload: the field "run" is the run's summary`, `schedule "m": on_failure: tier "urgent": pool "batch" does not serve it`}},
		{"everything at once", `  - {name: m, plan: BAD, cron: "99 * * * *", timezone: Nowhere, period: next}`,
			[]string{`schedule "m": cron "99 * * * *"`, `timezone "Nowhere"`, `period "next"`, `reports[0] "payroll": unknown report`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			block := strings.NewReplacer("PLAN", plan, "BAD", badPlan).Replace(tc.block)
			// A pool mistake too: schedule problems come with the others.
			path := testConfig(t, r, "schedules:\n"+block+"\n")
			apptest.ReplaceInConfig(t, path, "size: 3", "size: 0")
			_, err := app.Load(path, nil)
			var ce *queues.ConfigError
			require.ErrorAs(t, err, &ce)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.Contains(t, err.Error(), `pool "order": size must be >= 1, got 0`)
		})
	}

	t.Run("enabled not a bool", func(t *testing.T) {
		_, err := app.Load(testConfig(t, r, "schedules:\n  - {name: m, plan: "+plan+", cron: \"0 2 1 * *\", enabled: sometimes}\n"), nil)
		require.ErrorContains(t, err, "a string where true or false was expected")
	})

	t.Run("plan tier the pool does not serve", func(t *testing.T) {
		// A tier the business defined but the batch pool does not serve.
		prio, err := os.ReadFile(apptest.RepoPath("configs/priorities.yaml"))
		require.NoError(t, err)
		prioPath := filepath.Join(t.TempDir(), "priorities.yaml")
		require.NoError(t, os.WriteFile(prioPath, []byte(strings.Replace(string(prio), "tiers:\n  - regulatory", "tiers:\n  - urgent\n  - regulatory", 1)), 0o600))
		urgentPlan := filepath.Join(t.TempDir(), "plan.yaml")
		require.NoError(t, os.WriteFile(urgentPlan, []byte("reports:\n  - name: vat-return\n    tier: urgent\n"), 0o600))
		path := testConfig(t, r, "schedules:\n  - {name: m, plan: "+urgentPlan+", cron: \"0 2 1 * *\"}\n")
		apptest.ReplaceInConfig(t, path, "priorities: "+apptest.RepoPath("configs/priorities.yaml"), "priorities: "+prioPath)
		_, err = app.Load(path, nil)
		require.ErrorContains(t, err, `schedule "m": plan `+urgentPlan+`: report "vat-return" has tier "urgent", which pool "batch" does not serve`)
	})
}

// newSchedulerEnv is a config with the month-end schedule and n enqueuers
// (each its own Redis connection, as n worker processes have) on one test
// Redis, with no worker running.
func newSchedulerEnv(t *testing.T, n int, extra string) (*testredis.Redis, *app.Config, []*app.Enqueuer) {
	t.Helper()
	r := testredis.New(t)
	cfg, err := app.Load(testConfig(t, r, monthEndSchedule(extra)), nil)
	require.NoError(t, err)
	var out []*app.Enqueuer
	for range n {
		c := redis.NewClient(r.Options)
		t.Cleanup(func() { _ = c.Close() })
		enq, err := app.NewEnqueuerFor(cfg, &app.Redis{Client: c, Addr: r.Options.Addr})
		require.NoError(t, err)
		t.Cleanup(enq.Close)
		out = append(out, enq)
	}
	return r, cfg, out
}

// reportJobs lists the report jobs in the namespace's queues by ID, each
// with how many times it is there.
func reportJobs(t *testing.T, r *testredis.Redis, cfg *app.Config) map[string]int {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(r.Client)
	out := map[string]int{}
	for _, tier := range cfg.Policy.Tiers() {
		q := queues.QueueName(cfg.Engine.Namespace, "batch", tier)
		for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
			insp.ListPendingTasks, insp.ListActiveTasks, insp.ListCompletedTasks, insp.ListArchivedTasks, insp.ListRetryTasks,
		} {
			tasks, err := list(q, asynq.PageSize(1000))
			if err != nil && !strings.Contains(err.Error(), "not found") && !strings.Contains(err.Error(), "does not exist") {
				require.NoError(t, err)
			}
			for _, ti := range tasks {
				out[ti.ID]++
			}
		}
	}
	return out
}

// TestThreeWorkersOneMonthEnd: three workers' schedulers, each with its own
// Redis connection, reach the month-end fire time at the same instant: the
// plan is enqueued once (one run did it, every report once, nothing found
// already there) and one run is recorded.
func TestThreeWorkersOneMonthEnd(t *testing.T) {
	t.Parallel()
	r, cfg, enqs := newSchedulerEnv(t, 3, "")
	fire := time.Date(2026, 11, 1, 1, 0, 0, 0, time.UTC) // 02:00 in Berlin
	var wg sync.WaitGroup
	start := make(chan struct{})
	did := make([][]schedule.Record, 3)
	for i, enq := range enqs {
		s := app.NewScheduler(cfg, enq, app.SchedulerOptions{Logger: slog.New(slog.DiscardHandler)})
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			did[i] = s.Tick(context.Background(), fire)
		}()
	}
	close(start)
	wg.Wait()
	var runs []schedule.Record
	for _, d := range did {
		runs = append(runs, d...)
	}
	n := planReports(t, cfg)
	require.Len(t, runs, 1, "one of the three ran the month-end")
	require.Equal(t, schedule.StateDone, runs[0].State)
	require.Equal(t, schedule.Counts{Enqueued: n}, runs[0].Counts, "every report enqueued by that one run, none found there")

	jobs := reportJobs(t, r, cfg)
	require.Len(t, jobs, n)
	for id, count := range jobs {
		require.Equal(t, 1, count, id)
		require.True(t, strings.HasSuffix(id, ":2026-10"), "the previous month: %s", id)
	}
	recs, err := enqs[0].ScheduleStore().Runs(context.Background(), "month-end", 0)
	require.NoError(t, err)
	require.Len(t, recs, 1, "one run record")
	require.Equal(t, runs[0].ClaimedBy, recs[0].ClaimedBy)
}

// TestMissedMonthEndCaughtUpOnce: no worker ran at the fire time; the first
// to start (five hours later, inside the 24h window) enqueues the plan and
// logs a catch-up; the second to start finds it done.
func TestMissedMonthEndCaughtUpOnce(t *testing.T) {
	t.Parallel()
	r, cfg, enqs := newSchedulerEnv(t, 2, "")
	fire := time.Date(2026, 11, 1, 1, 0, 0, 0, time.UTC)
	var log apptest.SyncBuffer
	first := app.NewScheduler(cfg, enqs[0], app.SchedulerOptions{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	did := first.Tick(context.Background(), fire.Add(5*time.Hour))
	require.Len(t, did, 1)
	require.Equal(t, schedule.TriggerCatchUp, did[0].Trigger)
	require.Contains(t, log.String(), "catching up a run missed while no worker ran it")
	require.Contains(t, log.String(), "period=2026-10")

	second := app.NewScheduler(cfg, enqs[1], app.SchedulerOptions{Logger: slog.New(slog.DiscardHandler)})
	require.Empty(t, second.Tick(context.Background(), fire.Add(5*time.Hour+2*time.Minute)))
	require.Len(t, reportJobs(t, r, cfg), planReports(t, cfg))

	st, err := enqs[1].Schedules(context.Background(), fire.Add(6*time.Hour), 0)
	require.NoError(t, err)
	require.Len(t, st, 1)
	require.NotNil(t, st[0].LastRun)
	require.Equal(t, schedule.TriggerCatchUp, st[0].LastRun.Trigger)
	require.Equal(t, "2026-10", st[0].LastRun.Period)
	require.Equal(t, planReports(t, cfg), st[0].LastRun.Enqueued)
	require.Equal(t, "2026-12-01T02:00:00+01:00", st[0].NextRun.Format(time.RFC3339))
	require.Equal(t, "2026-11", st[0].NextPeriod)
}

// TestEnqueueMissingAtMostOnce: a second run for the same period adds
// nothing, whether the jobs are queued or finished; a report enqueued by
// hand before the run is counted as already there.
func TestEnqueueMissingAtMostOnce(t *testing.T) {
	t.Parallel()
	r, cfg, enqs := newSchedulerEnv(t, 1, "")
	enq := enqs[0]
	ctx := context.Background()
	_, _, err := enq.EnqueueReport(ctx, "vat-return", "2026-10", "")
	require.NoError(t, err)
	period, err := reports.ParsePeriod("2026-10")
	require.NoError(t, err)
	plan := &reports.Plan{Period: period, Entries: cfg.Schedule("month-end").Plan}
	n := len(plan.Entries)
	c, err := enq.EnqueueMissing(ctx, plan)
	require.NoError(t, err)
	require.Equal(t, schedule.Counts{Enqueued: n - 1, AlreadyPresent: 1}, c)
	c, err = enq.EnqueueMissing(ctx, plan)
	require.NoError(t, err)
	require.Equal(t, schedule.Counts{AlreadyPresent: n}, c)

	// A finished job is there too: run one to completion and try again.
	insp := asynq.NewInspectorFromRedisClient(r.Client)
	q := queues.QueueName(cfg.Engine.Namespace, "batch", "regulatory")
	require.NoError(t, insp.DeleteTask(q, handlers.ReportJobID("vat-return", "2026-10")))
	c, err = enq.EnqueueMissing(ctx, plan)
	require.NoError(t, err)
	require.Equal(t, schedule.Counts{Enqueued: 1, AlreadyPresent: n - 1}, c, "a job deleted by hand is enqueued again")
}

// TestScheduledMonthEndRunsInWorker: a worker whose clock is just before
// the month-end fire time enqueues the plan by itself, and every report
// completes.
func TestScheduledMonthEndRunsInWorker(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	// A small plan: the reports' own work is tested elsewhere.
	plan := filepath.Join(t.TempDir(), "plan.yaml")
	require.NoError(t, os.WriteFile(plan, []byte("reports:\n  - name: vat-return\n  - name: trial-balance\n  - name: refunds-analysis\n"), 0o600))
	// The schedule's own completion step replaces the plan's (none here).
	block := strings.Replace(monthEndSchedule("    catch_up: 1m\n    on_complete: {job_type: report:bundle, payload: {notify: ops}}\n"), apptest.RepoPath("configs/month-end.yaml"), plan, 1)
	cfg, err := app.Load(testConfig(t, r, block), nil)
	require.NoError(t, err)
	fire := time.Date(2026, 11, 1, 1, 0, 0, 0, time.UTC)
	clock := &shiftedClock{}
	var mu sync.Mutex
	done := map[string]int{}
	var log apptest.SyncBuffer
	w, err := app.NewWorker(context.Background(), cfg, app.WorkerOptions{
		Logger: slog.New(slog.NewTextHandler(&log, nil)),
		Clock:  clock,
		OnReportDone: func(p handlers.ReportPayload, _ reports.Result) {
			mu.Lock()
			done[p.Report+" "+p.Period]++
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	ctx := context.Background()
	// Set here, after the database was seeded: the fire time comes a
	// second after the start.
	clock.off.Store(int64(time.Until(fire.Add(-time.Second))))
	require.NoError(t, w.Start(ctx))
	n := 3
	testwait.For(t, 60*time.Second, "every report of the scheduled month-end to complete", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == n
	})
	// The fire started a run, which ends and writes its bundle once.
	manifest := filepath.Join(cfg.OutputDir, "month-end_2026-10.json")
	testwait.For(t, 30*time.Second, "the scheduled run's bundle", func() bool {
		_, err := os.Stat(manifest)
		return err == nil
	})
	runs, err := w.Client.Runs(ctx, 10)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, "schedule month-end", runs[0].StartedBy)
	require.Equal(t, "month-end", runs[0].Kind)
	require.Equal(t, "2026-10", runs[0].Period)
	require.Equal(t, queues.RunSucceeded, runs[0].State)
	require.Equal(t, n, runs[0].Succeeded)
	require.Equal(t, "complete", runs[0].Fired)
	data, err := os.ReadFile(manifest)
	require.NoError(t, err)
	require.Contains(t, string(data), `"notify": "ops"`)
	require.NoError(t, w.Stop(ctx))
	for k, v := range done {
		require.Equal(t, 1, v, k)
		require.True(t, strings.HasSuffix(k, " 2026-10"), k)
	}
	recs, err := schedule.NewStore(r.Client, cfg.Engine.Namespace).Runs(ctx, "month-end", 0)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	// On time, unless this machine took over a second to start the pools
	// (then the worker catches it up): either way, once.
	require.Contains(t, []string{schedule.TriggerSchedule, schedule.TriggerCatchUp}, recs[0].Trigger)
	require.Equal(t, n, recs[0].Enqueued)
	require.Contains(t, log.String(), "schedule: run done")
}

// TestShippedSchedule: configs/worker.yaml carries the month-end schedule,
// off.
func TestShippedSchedule(t *testing.T) {
	t.Parallel()
	cfg, err := app.Load(apptest.RepoPath("configs/worker.yaml"), nil)
	require.NoError(t, err)
	require.Len(t, cfg.Schedules, 1)
	s := cfg.Schedules[0]
	require.Equal(t, "month-end", s.Name)
	require.True(t, s.Disabled)
	require.Equal(t, apptest.RepoPath("configs/month-end.yaml"), s.PlanPath)
	require.Len(t, s.Plan, planReports(t, cfg))
}

// shiftedClock is the real clock shifted by off, which the test sets.
type shiftedClock struct{ off atomic.Int64 }

func (c *shiftedClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

func (c *shiftedClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// TestRunsForOnePeriodTakeTurns: while another run for the period holds its
// lock, a run waits (here until its context ends) and enqueues nothing;
// once the lock is free it proceeds.
func TestRunsForOnePeriodTakeTurns(t *testing.T) {
	t.Parallel()
	r, cfg, enqs := newSchedulerEnv(t, 1, "")
	enq := enqs[0]
	period, err := reports.ParsePeriod("2026-10")
	require.NoError(t, err)
	plan := &reports.Plan{Period: period, Entries: cfg.Schedule("month-end").Plan}
	store := enq.ScheduleStore()
	ok, err := store.LockPeriod(context.Background(), "2026-10", "other-run", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = enq.EnqueueMissing(ctx, plan)
	require.ErrorContains(t, err, "waiting for another run for 2026-10 to finish enqueuing")
	require.Empty(t, reportJobs(t, r, cfg), "nothing enqueued while the other run holds the period")

	type result struct {
		c   schedule.Counts
		err error
	}
	done := make(chan result)
	go func() {
		c, err := enq.EnqueueMissing(context.Background(), plan)
		done <- result{c, err}
	}()
	require.NoError(t, store.UnlockPeriod(context.Background(), "2026-10", "other-run"))
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, schedule.Counts{Enqueued: len(plan.Entries)}, res.c)
	holder, err := store.PeriodLockHolder(context.Background(), "2026-10")
	require.NoError(t, err)
	require.Empty(t, holder, "the lock is released after the run")
}
