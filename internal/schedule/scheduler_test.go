package schedule_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/schedule"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
)

// fakeClock is a clock the test moves; the scheduler's loop waits on it.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{c.now.Add(d), ch})
	return ch
}

// next waits until the loop waits on the clock, and returns when it wants
// to wake.
func (c *fakeClock) next(t *testing.T) time.Time {
	t.Helper()
	var at time.Time
	testwait.For(t, 10*time.Second, "the scheduler to wait on the clock", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.waiters) == 0 {
			return false
		}
		at = c.waiters[0].at
		return true
	})
	return at
}

// set moves the clock to now and wakes the waiters that are due.
func (c *fakeClock) set(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(now) {
			w.ch <- now
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

// plan counts the runs a RunFunc did, by period.
type plan struct {
	mu      sync.Mutex
	periods []string
	fail    atomic.Int32 // fail this many more runs
	block   chan struct{}
}

func (p *plan) run(ctx context.Context, s *schedule.Schedule, period string) (schedule.Counts, error) {
	if p.block != nil {
		<-p.block
	}
	if p.fail.Load() > 0 {
		p.fail.Add(-1)
		return schedule.Counts{Enqueued: 2}, errors.New("redis went away")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.periods = append(p.periods, period)
	return schedule.Counts{Enqueued: 10}, nil
}

func (p *plan) runs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.periods...)
}

func newStore(t *testing.T, r *testredis.Redis) *schedule.Store {
	t.Helper()
	s, _ := newStoreNS(t, r)
	return s
}

func newStoreNS(t *testing.T, r *testredis.Redis) (*schedule.Store, string) {
	t.Helper()
	ns := r.Namespace(t)
	return schedule.NewStore(r.Client, ns), ns
}

func monthEnd(t *testing.T) *schedule.Schedule {
	return mustNew(t, schedule.Spec{Name: "month-end", Cron: "0 2 1 * *", Timezone: "Europe/Berlin"})
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestThreeSchedulersOneRun: three schedulers (three workers) on one Redis
// reach the same fire time at the same instant: the plan runs once and
// one record is written.
func TestThreeSchedulersOneRun(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	store := newStore(t, r)
	sch := monthEnd(t)
	fire := at(t, "Europe/Berlin", "2026-11-01 02:00")
	p := &plan{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	did := make([][]schedule.Record, 3)
	for i := range 3 {
		s := schedule.NewScheduler([]*schedule.Schedule{sch}, store, p.run, schedule.Options{Logger: quiet()})
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			did[i] = s.Tick(context.Background(), fire)
		}()
	}
	close(start)
	wg.Wait()
	require.Equal(t, []string{"2026-10"}, p.runs(), "the plan ran once, for October")
	ran := 0
	for _, d := range did {
		ran += len(d)
	}
	require.Equal(t, 1, ran, "one scheduler did the run")
	recs, err := store.Runs(context.Background(), "month-end", 0)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	rec := recs[0]
	require.Equal(t, schedule.StateDone, rec.State)
	require.Equal(t, schedule.TriggerSchedule, rec.Trigger)
	require.Equal(t, "2026-10", rec.Period)
	require.Equal(t, "2026-11-01T01:00:00Z", rec.ID)
	require.Equal(t, 10, rec.Enqueued)
	require.Equal(t, 1, rec.Attempt)
	require.NotEmpty(t, rec.ClaimedBy)
	require.True(t, rec.ScheduledFor.Equal(fire))
}

// TestCatchUpOnce: the fire time passed with no worker up; the first
// scheduler to start runs it (and says so in its log), the second does not.
func TestCatchUpOnce(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	store := newStore(t, r)
	sch := monthEnd(t)
	fire := at(t, "Europe/Berlin", "2026-11-01 02:00")
	p := &plan{}
	var log apptest.SyncBuffer
	first := schedule.NewScheduler([]*schedule.Schedule{sch}, store, p.run, schedule.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	did := first.Tick(context.Background(), fire.Add(5*time.Hour))
	require.Len(t, did, 1)
	require.Equal(t, schedule.TriggerCatchUp, did[0].Trigger)
	require.Contains(t, log.String(), "catching up a run missed while no worker ran it")
	require.Contains(t, log.String(), "late_by=5h0m0s")

	second := schedule.NewScheduler([]*schedule.Schedule{sch}, store, p.run, schedule.Options{Logger: quiet()})
	require.Empty(t, second.Tick(context.Background(), fire.Add(5*time.Hour+time.Minute)))
	require.Empty(t, first.Tick(context.Background(), fire.Add(6*time.Hour)))
	require.Equal(t, []string{"2026-10"}, p.runs())

	// Outside the window (24h by default) a missed run is not run.
	other := mustNew(t, schedule.Spec{Name: "late", Cron: "0 2 1 * *", Timezone: "Europe/Berlin"})
	late := schedule.NewScheduler([]*schedule.Schedule{other}, store, p.run, schedule.Options{Logger: quiet()})
	require.Empty(t, late.Tick(context.Background(), fire.Add(25*time.Hour)))
	require.Equal(t, []string{"2026-10"}, p.runs())
}

// TestFailedRunIsRetried: a run whose enqueue failed is recorded as
// failed, keeps the others off for RetryAfter, then one of them runs it
// again (attempt 2); the plan then counts as run once.
func TestFailedRunIsRetried(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	store := newStore(t, r)
	store.RetryAfter = 300 * time.Millisecond
	sch := monthEnd(t)
	fire := at(t, "Europe/Berlin", "2026-11-01 02:00")
	p := &plan{}
	p.fail.Store(1)
	a := schedule.NewScheduler([]*schedule.Schedule{sch}, store, p.run, schedule.Options{Logger: quiet()})
	b := schedule.NewScheduler([]*schedule.Schedule{sch}, store, p.run, schedule.Options{Logger: quiet()})
	did := a.Tick(context.Background(), fire)
	require.Len(t, did, 1)
	require.Equal(t, schedule.StateFailed, did[0].State)
	require.Equal(t, "redis went away", did[0].Error)
	require.Equal(t, 2, did[0].Enqueued, "what the failed attempt did is kept")
	require.Empty(t, b.Tick(context.Background(), fire.Add(time.Second)), "inside the retry delay")
	var again []schedule.Record
	testwait.For(t, 10*time.Second, "another attempt after the retry delay", func() bool {
		again = b.Tick(context.Background(), fire.Add(time.Minute))
		return len(again) > 0
	})
	require.Equal(t, schedule.StateDone, again[0].State)
	require.Equal(t, 2, again[0].Attempt)
	require.Empty(t, a.Tick(context.Background(), fire.Add(2*time.Minute)))
	require.Equal(t, []string{"2026-10"}, p.runs())
	recs, err := store.Runs(context.Background(), "month-end", 0)
	require.NoError(t, err)
	require.Len(t, recs, 1, "one record per run, its last attempt")
}

// TestAbandonedClaimIsTakenOver: a claimant that vanished before finishing
// (its record says running) holds the run only until its lease lapses.
func TestAbandonedClaimIsTakenOver(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	store := newStore(t, r)
	store.Lease = 300 * time.Millisecond
	sch := monthEnd(t)
	fire := at(t, "Europe/Berlin", "2026-11-01 02:00")
	// The vanished claimant: a claim with no finish.
	rec := &schedule.Record{Schedule: "month-end", ID: fire.UTC().Format(time.RFC3339), Period: "2026-10", ScheduledFor: fire, ClaimedBy: "gone"}
	cr, err := store.Claim(context.Background(), rec, "gone", fire)
	require.NoError(t, err)
	require.Equal(t, schedule.Claimed, cr.Result)
	running, err := store.Get(context.Background(), "month-end", rec.ID)
	require.NoError(t, err)
	require.Equal(t, schedule.StateRunning, running.State)
	require.Equal(t, 1, running.Attempt, "a running record says its attempt")

	p := &plan{}
	s := schedule.NewScheduler([]*schedule.Schedule{sch}, store, p.run, schedule.Options{Logger: quiet()})
	require.Empty(t, s.Tick(context.Background(), fire), "the lease is still held")
	testwait.For(t, 10*time.Second, "the run taken over after the lease", func() bool {
		return len(s.Tick(context.Background(), fire.Add(time.Second))) > 0
	})
	require.Equal(t, []string{"2026-10"}, p.runs())
	got, err := store.Get(context.Background(), "month-end", rec.ID)
	require.NoError(t, err)
	require.Equal(t, schedule.StateDone, got.State)
	require.Equal(t, 2, got.Attempt)
	require.Equal(t, s.ID(), got.ClaimedBy)

	// The vanished claimant coming back late cannot overwrite it.
	rec.State = schedule.StateDone
	require.NoError(t, store.Finish(context.Background(), *rec, "gone"), "nobody holds the lease now: its record is written")
}

// TestLateFinishAfterTakeover: a claimant that outlived its lease while
// another took the run over does not overwrite the other's record.
func TestLateFinishAfterTakeover(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	store := newStore(t, r)
	store.Lease = 200 * time.Millisecond
	fire := at(t, "UTC", "2026-11-01 02:00")
	rec := &schedule.Record{Schedule: "m", ID: "x", Period: "2026-10"}
	_, err := store.Claim(context.Background(), rec, "slow", fire)
	require.NoError(t, err)
	var cr schedule.ClaimResult
	testwait.For(t, 10*time.Second, "a takeover", func() bool {
		other := &schedule.Record{Schedule: "m", ID: "x", Period: "2026-10"}
		cr, err = store.Claim(context.Background(), other, "quick", fire)
		require.NoError(t, err)
		return cr.Result == schedule.Retry
	})
	require.Equal(t, schedule.StateRunning, cr.Previous)
	rec.State = schedule.StateDone
	require.ErrorIs(t, store.Finish(context.Background(), *rec, "slow"), schedule.ErrLeaseLost)
}

// TestHistoryIsBounded keeps the newest records only.
func TestHistoryIsBounded(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	store, ns := newStoreNS(t, r)
	store.History = 3
	sch := mustNew(t, schedule.Spec{Name: "daily", Cron: "0 2 * * *"})
	p := &plan{}
	s := schedule.NewScheduler([]*schedule.Schedule{sch}, store, p.run, schedule.Options{Logger: quiet()})
	day := at(t, "UTC", "2026-11-01 02:00")
	for i := range 5 {
		require.Len(t, s.Tick(context.Background(), day.AddDate(0, 0, i)), 1)
	}
	recs, err := store.Runs(context.Background(), "daily", 0)
	require.NoError(t, err)
	require.Len(t, recs, 3)
	require.Equal(t, "2026-11-05T02:00:00Z", recs[0].ID, "newest first")
	require.Equal(t, "2026-11-03T02:00:00Z", recs[2].ID)
	n, err := r.Client.Exists(context.Background(), ns+":schedule:{daily}:run:2026-11-01T02:00:00Z").Result()
	require.NoError(t, err)
	require.Zero(t, n, "a trimmed run's hash is deleted too")
}

// TestLoopAcrossDaylightSaving drives the scheduler's own loop with a
// fake clock across both of Berlin's 2026 clock changes: a daily 02:30
// schedule runs once each local day, neither skipped nor doubled, and the
// loop wakes at the fire times without real waiting.
func TestLoopAcrossDaylightSaving(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	store := newStore(t, r)
	store.History = 100
	sch := mustNew(t, schedule.Spec{Name: "daily", Cron: "30 2 * * *", Timezone: "Europe/Berlin", Period: schedule.PeriodCurrent})
	for _, span := range [][2]string{{"2026-03-27 12:00", "2026-04-01 12:00"}, {"2026-10-23 12:00", "2026-10-28 12:00"}} {
		p := &plan{}
		clock := &fakeClock{now: at(t, "Europe/Berlin", span[0])}
		s := schedule.NewScheduler([]*schedule.Schedule{sch}, store, p.run, schedule.Options{Clock: clock, Logger: quiet(), Recheck: 20 * time.Minute})
		require.NoError(t, s.Start(context.Background()))
		end := at(t, "Europe/Berlin", span[1])
		for {
			wake := clock.next(t)
			if wake.After(end) {
				break
			}
			clock.set(wake)
		}
		require.NoError(t, s.Stop(context.Background()))
		recs, err := store.Runs(context.Background(), "daily", 0)
		require.NoError(t, err)
		days := map[string]int{}
		for _, rec := range recs {
			if rec.ScheduledFor.After(at(t, "Europe/Berlin", span[0])) && rec.ScheduledFor.Before(end) {
				days[rec.ScheduledFor.In(sch.Location).Format("2006-01-02")]++
				require.Equal(t, schedule.TriggerSchedule, rec.Trigger, "the loop woke at the fire time")
			}
		}
		require.Len(t, days, 5, "one run each local day from %s: %v", span[0], days)
		for d, n := range days {
			require.Equal(t, 1, n, "runs on %s", d)
		}
		// And the catch-up, at the start, of the run 10 hours before it.
		require.Len(t, p.runs(), 6)
	}
}

// TestRunNow runs a schedule by hand, disabled or not; an unknown name is
// an error naming the schedules.
func TestRunNow(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	store := newStore(t, r)
	off := mustNew(t, schedule.Spec{Name: "month-end", Cron: "0 2 1 * *", Disabled: true})
	p := &plan{}
	clock := &fakeClock{now: at(t, "UTC", "2026-11-15 10:00")}
	s := schedule.NewScheduler([]*schedule.Schedule{off}, store, p.run, schedule.Options{Clock: clock, Logger: quiet()})
	require.Empty(t, s.Tick(context.Background(), at(t, "UTC", "2026-11-01 02:00")), "a disabled schedule does not fire")
	rec, err := s.RunNow(context.Background(), "month-end", "")
	require.NoError(t, err)
	require.Equal(t, "2026-10", rec.Period, "the period a run now would cover")
	require.Equal(t, schedule.TriggerManual, rec.Trigger)
	rec, err = s.RunNow(context.Background(), "month-end", "2026-09")
	require.NoError(t, err)
	require.Equal(t, "2026-09", rec.Period)
	require.Equal(t, []string{"2026-10", "2026-09"}, p.runs())
	_, err = s.RunNow(context.Background(), "year-end", "")
	require.ErrorIs(t, err, schedule.ErrUnknown)
	require.Contains(t, err.Error(), `unknown schedule "year-end" (schedules: month-end)`)
	recs, err := store.Runs(context.Background(), "month-end", 0)
	require.NoError(t, err)
	require.Len(t, recs, 2)
}

// TestStopIsSafe: Stop before Start, twice, and Start after Stop are safe.
func TestStopIsSafe(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	s := schedule.NewScheduler([]*schedule.Schedule{monthEnd(t)}, newStore(t, r), (&plan{}).run, schedule.Options{Logger: quiet()})
	require.NoError(t, s.Stop(context.Background()))
	require.NoError(t, s.Start(context.Background()))
	require.NoError(t, s.Stop(context.Background()))
	require.NoError(t, s.Stop(context.Background()))
}

// TestStartShortlyAfterFireIsCatchUp: a worker that starts 30 s after a
// fire time nobody ran still says it is catching up.
func TestStartShortlyAfterFireIsCatchUp(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	store := newStore(t, r)
	fire := at(t, "Europe/Berlin", "2026-11-01 02:00")
	clock := &fakeClock{now: fire.Add(30 * time.Second)}
	var log apptest.SyncBuffer
	p := &plan{}
	s := schedule.NewScheduler([]*schedule.Schedule{monthEnd(t)}, store, p.run, schedule.Options{Clock: clock, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.NoError(t, s.Start(context.Background()))
	clock.next(t) // the first tick is done once the loop waits
	require.NoError(t, s.Stop(context.Background()))
	recs, err := store.Runs(context.Background(), "month-end", 0)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, schedule.TriggerCatchUp, recs[0].Trigger)
	require.Contains(t, log.String(), "catching up a run missed while no worker ran it")
	require.Equal(t, []string{"2026-10"}, p.runs())
}
