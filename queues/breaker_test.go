package queues_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// dbJob is the payload of the breaker tests' jobs.
type dbJob struct {
	Seq  int           `json:"seq"`
	Work time.Duration `json:"work"`
}

var dbQuery = queues.NewJob[dbJob]("db:query")

// dependency stands in for a pool's database, seen from inside the
// handlers: down makes every call fail; fail decides per call otherwise.
type dependency struct {
	mu        sync.Mutex
	down      bool
	fail      func(j dbJob, attempt int) error // nil: succeed
	calls     int
	attempts  map[int]int
	failedAt  []int // seqs, in the order their calls failed
	done      map[int]bool
	inside    int
	peakAfter time.Time // count the peak of calls that start after this
	peak      int
}

func newDependency() *dependency {
	return &dependency{attempts: map[int]int{}, done: map[int]bool{}}
}

func (d *dependency) set(f func(*dependency)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d)
}

func (d *dependency) read() (calls, done int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls, len(d.done)
}

func (d *dependency) handlers() *queues.Handlers {
	h := queues.NewHandlers()
	queues.AddHandler(h, dbQuery, func(ctx context.Context, j dbJob) error {
		d.mu.Lock()
		d.calls++
		d.attempts[j.Seq]++
		attempt := d.attempts[j.Seq]
		down, fail := d.down, d.fail
		d.inside++
		counted := !d.peakAfter.IsZero() && time.Now().After(d.peakAfter)
		if counted {
			d.peak = max(d.peak, d.inside)
		}
		d.mu.Unlock()
		t := time.NewTimer(j.Work)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		var err error
		switch {
		case down:
			err = errors.New("database unreachable")
		case fail != nil:
			err = fail(j, attempt)
		}
		d.mu.Lock()
		d.inside--
		if err != nil {
			d.failedAt = append(d.failedAt, j.Seq)
		} else {
			d.done[j.Seq] = true
		}
		d.mu.Unlock()
		return err
	})
	return h
}

// breakerEnv is a pool "db" with a breaker on a test Redis.
type breakerEnv struct {
	t      *testing.T
	r      *testredis.Redis
	cfg    queues.Config
	client *queues.Client
	insp   *asynq.Inspector
	dep    *dependency
}

func newBreakerEnv(t *testing.T, pool queues.PoolConfig) *breakerEnv {
	t.Helper()
	r := testredis.New(t)
	pool.Name, pool.JobTypes = "db", []string{"db:query"}
	pool.PollInterval = 10 * time.Millisecond
	cfg := queues.Config{
		Namespace: r.Namespace(t), Tiers: testPolicy(t), Pools: []queues.PoolConfig{pool},
		Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 5 * time.Second,
		RetryDelay:           func(int, error) time.Duration { return 10 * time.Millisecond },
		DelayedCheckInterval: 50 * time.Millisecond,
	}
	c, err := queues.NewClient(r.Client, cfg)
	require.NoError(t, err)
	return &breakerEnv{t: t, r: r, cfg: cfg, client: c, insp: asynq.NewInspectorFromRedisClient(r.Client), dep: newDependency()}
}

// start starts n runners ("processes"), each on its own Redis client.
func (e *breakerEnv) start(n int) {
	for range n {
		rdb := redis.NewClient(e.r.Options)
		e.t.Cleanup(func() { _ = rdb.Close() })
		cfg := e.cfg
		cfg.Handlers = e.dep.handlers()
		rn, err := queues.NewClient(rdb, cfg)
		require.NoError(e.t, err)
		require.NoError(e.t, rn.Start(context.Background()))
		e.t.Cleanup(func() { require.NoError(e.t, rn.Stop(context.Background())) })
	}
}

func (e *breakerEnv) enqueue(n int, work time.Duration, tier string) {
	for i := range n {
		payload, _ := json.Marshal(dbJob{Seq: i, Work: work})
		_, err := e.client.Enqueue(context.Background(), "db:query", payload,
			queues.EnqueueOptions{ID: fmt.Sprintf("job-%d", i), Retention: time.Hour, Tier: tier})
		require.NoError(e.t, err)
	}
}

func (e *breakerEnv) breaker() queues.BreakerState {
	st, err := e.client.Breaker(context.Background(), "db")
	require.NoError(e.t, err)
	return st
}

func (e *breakerEnv) waitState(state queues.BreakerStatus, timeout time.Duration) queues.BreakerState {
	var st queues.BreakerState
	testwait.For(e.t, timeout, "breaker "+string(state), func() bool {
		st = e.breaker()
		return st.State == state
	})
	return st
}

// queues sums the pool's queues.
func (e *breakerEnv) queues() (sum asynq.QueueInfo) {
	p, err := e.client.Pool("db")
	require.NoError(e.t, err)
	for _, q := range p.Queues() {
		info, err := e.insp.GetQueueInfo(q)
		if err != nil {
			continue // never enqueued
		}
		sum.Pending += info.Pending
		sum.Active += info.Active
		sum.Retry += info.Retry
		sum.Scheduled += info.Scheduled
		sum.Archived += info.Archived
		sum.Completed += info.Completed
	}
	return sum
}

// pauses returns the value of each of the pool's pause keys ("" when not
// paused).
func (e *breakerEnv) pauses() map[string]string {
	p, err := e.client.Pool("db")
	require.NoError(e.t, err)
	out := map[string]string{}
	for _, q := range p.Queues() {
		v, err := e.r.Client.Get(context.Background(), "asynq:{"+q+"}:paused").Result()
		if errors.Is(err, redis.Nil) {
			v = ""
		} else {
			require.NoError(e.t, err)
		}
		out[q] = v
	}
	return out
}

// TestBreakerTripsOnRatioAndLosesNothing: the database goes down; the
// breaker opens after min_calls failed calls (plus what was already
// running); while open no job reaches the handler and none is archived:
// every job waits in its queue. The failures that tripped it are given
// back: with max_retry 1, a job that failed before the trip can fail once
// more after the close and still complete.
func TestBreakerTripsOnRatioAndLosesNothing(t *testing.T) {
	const jobs, size, minCalls = 12, 2, 4
	e := newBreakerEnv(t, queues.PoolConfig{Size: size, Scope: queues.ScopeProcess, MaxRetry: 1,
		Breaker: &queues.BreakerConfig{MinCalls: minCalls, FailureRatio: 0.5, Window: 10 * time.Second, CoolDown: time.Hour}})
	e.dep.set(func(d *dependency) { d.down = true })
	e.enqueue(jobs, 5*time.Millisecond, "")
	e.start(1)

	st := e.waitState(queues.BreakerOpen, 30*time.Second)
	require.Contains(t, st.Why, "calls failed")
	require.GreaterOrEqual(t, st.Calls, minCalls)
	require.GreaterOrEqual(t, st.Failures, minCalls)

	// Every job goes back to its queue and waits there: none is running,
	// waiting for a retry or archived.
	testwait.For(t, 30*time.Second, "every job pending", func() bool {
		q := e.queues()
		return q.Pending == jobs && q.Active == 0 && q.Retry == 0 && q.Scheduled == 0
	})
	calls, _ := e.dep.read()
	require.LessOrEqual(t, calls, minCalls+size, "at most min_calls plus the calls already running reached the database")
	require.Zero(t, e.queues().Archived)
	for q, v := range e.pauses() {
		require.Equal(t, "compartment-breaker", v, "queue %s is paused by the breaker", q)
	}
	// A job enqueued while open waits too; the handler sees nothing new.
	payload, _ := json.Marshal(dbJob{Seq: 100})
	_, err := e.client.Enqueue(context.Background(), "db:query", payload, queues.EnqueueOptions{ID: "late", Retention: time.Hour})
	require.NoError(t, err)
	testwait.For(t, 10*time.Second, "the late job pending", func() bool { return e.queues().Pending == jobs+1 })
	after, _ := e.dep.read()
	require.Equal(t, calls, after, "nothing was dequeued while the breaker was open")

	// The database is back, but the first job that failed fails once
	// more: with max_retry 1 it would be archived had its failure before
	// the trip counted.
	var first int
	e.dep.set(func(d *dependency) {
		first = d.failedAt[0]
		d.down = false
		d.fail = func(j dbJob, attempt int) error {
			if j.Seq == first && attempt == 2 {
				return errors.New("one more failure")
			}
			return nil
		}
	})
	st, err = e.client.ForceBreaker(context.Background(), "db", queues.BreakerReset)
	require.NoError(t, err)
	require.Equal(t, queues.BreakerClosed, st.State)
	// The handler's count comes before asynq records the completion, so
	// wait for both.
	testwait.For(t, 30*time.Second, "every job done (or one archived)", func() bool {
		_, done := e.dep.read()
		q := e.queues()
		return (done == jobs+1 && q.Completed == jobs+1) || q.Archived > 0
	})
	q := e.queues()
	require.Zero(t, q.Archived, "nothing archived")
	require.Equal(t, jobs+1, q.Completed)
	for q, v := range e.pauses() {
		require.Empty(t, v, "no pause left on %s", q)
	}
}

// TestBreakerTripsOnSlowCalls: calls over slow_call count as failures; the
// slow jobs themselves complete.
func TestBreakerTripsOnSlowCalls(t *testing.T) {
	e := newBreakerEnv(t, queues.PoolConfig{Size: 1, Scope: queues.ScopeProcess,
		Breaker: &queues.BreakerConfig{MinCalls: 3, SlowCall: 20 * time.Millisecond, Window: 10 * time.Second, CoolDown: time.Hour}})
	e.enqueue(8, 60*time.Millisecond, "")
	e.start(1)
	st := e.waitState(queues.BreakerOpen, 30*time.Second)
	require.Equal(t, 3, st.Slow)
	require.Equal(t, 0, st.Failures)
	require.Contains(t, st.Why, "3 slow")
	testwait.For(t, 30*time.Second, "the rest pending", func() bool {
		q := e.queues()
		return q.Active == 0 && q.Retry == 0 && q.Completed+q.Pending == 8
	})
	_, done := e.dep.read()
	require.Equal(t, 3, done, "the slow calls completed")

	e.dep.set(func(d *dependency) { d.fail = nil })
	_, err := e.client.ForceBreaker(context.Background(), "db", queues.BreakerForceClose)
	require.NoError(t, err)
	testwait.For(t, 30*time.Second, "every job done", func() bool { _, done := e.dep.read(); return done == 8 })
	st = e.breaker()
	require.Equal(t, queues.BreakerClosed, st.State, "forced closed: slow calls no longer trip it")
	require.Equal(t, queues.BreakerClosed, st.Forced)
}

// TestBreakerIgnoresPermanentFailures: malformed payloads, panics,
// Permanent and NotDependency errors do not count; DependencyError does,
// even on a permanent failure.
func TestBreakerIgnoresPermanentFailures(t *testing.T) {
	for name, tc := range map[string]struct {
		err   error
		panic bool
		trips bool
	}{
		"permanent":            {err: queues.Permanent(errors.New("bad row"))},
		"skip retry":           {err: fmt.Errorf("bad: %w", asynq.SkipRetry)},
		"panic":                {panic: true},
		"not the dependency":   {err: queues.NotDependency(errors.New("bad input"))},
		"dependency permanent": {err: queues.DependencyError(queues.Permanent(errors.New("quota exhausted"))), trips: true},
	} {
		t.Run(name, func(t *testing.T) {
			e := newBreakerEnv(t, queues.PoolConfig{Size: 2, Scope: queues.ScopeProcess, MaxRetry: queues.NoRetry,
				Breaker: &queues.BreakerConfig{MinCalls: 2, Window: 10 * time.Second, CoolDown: time.Hour}})
			e.dep.set(func(d *dependency) {
				d.fail = func(dbJob, int) error {
					if tc.panic {
						panic("boom")
					}
					return tc.err
				}
			})
			e.enqueue(6, 0, "")
			e.start(1)
			if tc.trips {
				e.waitState(queues.BreakerOpen, 30*time.Second)
				// With max_retry 0 the failure before the trip archived its
				// job; the one that tripped it, though permanent, was the
				// outage's: it waits with the rest.
				testwait.For(t, 30*time.Second, "the jobs settled", func() bool {
					q := e.queues()
					return q.Active == 0 && q.Retry == 0 && q.Pending+q.Archived == 6
				})
				require.Equal(t, 1, e.queues().Archived)
				return
			}
			testwait.For(t, 30*time.Second, "every job archived", func() bool { return e.queues().Archived == 6 })
			st := e.breaker()
			require.Equal(t, queues.BreakerClosed, st.State)
			require.Zero(t, st.WindowFailures)
		})
	}
	// A malformed payload is the job's fault.
	e := newBreakerEnv(t, queues.PoolConfig{Size: 1, Scope: queues.ScopeProcess,
		Breaker: &queues.BreakerConfig{MinCalls: 1, Window: 10 * time.Second, CoolDown: time.Hour}})
	for i := range 3 {
		_, err := e.client.Enqueue(context.Background(), "db:query", []byte("not json"), queues.EnqueueOptions{ID: fmt.Sprint(i)})
		require.NoError(t, err)
	}
	e.start(1)
	testwait.For(t, 30*time.Second, "malformed jobs archived", func() bool { return e.queues().Archived == 3 })
	require.Equal(t, queues.BreakerClosed, e.breaker().State)
}

// TestBreakerHalfOpenProbesAcrossProcesses: three processes serve a
// cluster-scoped pool of 6; after each cool-down exactly `probes` jobs run
// between them, never more at once; failed probes reopen it with a longer
// cool-down (capped); once the database is back the probes close it and
// every job completes.
func TestBreakerHalfOpenProbesAcrossProcesses(t *testing.T) {
	const probes, jobs = 2, 40
	e := newBreakerEnv(t, queues.PoolConfig{Size: 6, Scope: queues.ScopeCluster, MaxRetry: 1,
		Breaker: &queues.BreakerConfig{MinCalls: 3, Window: 10 * time.Second, CoolDown: time.Second, MaxCoolDown: 2 * time.Second, Probes: probes}})
	e.dep.set(func(d *dependency) { d.down = true })
	e.enqueue(jobs, 100*time.Millisecond, "")
	e.start(3)
	// The cool-down is cool_down at the trip, doubled by each failed probe
	// since, up to max_cool_down. Read at the first look at the open
	// breaker: the trip's, unless a busy machine missed its first second.
	coolDown := func(trips int) time.Duration { return min(time.Second<<(trips-1), 2*time.Second) }
	first := e.waitState(queues.BreakerOpen, 30*time.Second)
	require.Equal(t, coolDown(first.Trips), first.CoolDown, "after %d trips", first.Trips)
	// Jobs taken just before the pause finish; from then on only probes
	// start.
	testwait.For(t, 10*time.Second, "the running jobs to end", func() bool { return e.queues().Active == 0 })
	calls, _ := e.dep.read()
	e.dep.set(func(d *dependency) { d.peakAfter = time.Now() })

	// Three half-open trials whose probes fail: each reopens the breaker
	// (Trips counts the openings) with a longer cool-down, up to the cap.
	var st queues.BreakerState
	testwait.For(t, 30*time.Second, "three failed half-open trials", func() bool {
		st = e.breaker()
		return st.Trips >= first.Trips+3
	})
	require.Contains(t, st.Why, "a probe failed")
	require.Equal(t, 2*time.Second, st.CoolDown, "doubled, up to max_cool_down")
	now, _ := e.dep.read()
	trials := st.Trips - first.Trips
	require.LessOrEqual(t, now-calls, (trials+1)*probes, "at most `probes` calls per trial")
	e.dep.set(func(d *dependency) { d.down = false })
	st = e.waitState(queues.BreakerClosed, 30*time.Second)
	require.Contains(t, st.Why, "probes succeeded")
	testwait.For(t, time.Minute, "every job done", func() bool { _, done := e.dep.read(); return done == jobs })
	e.dep.mu.Lock()
	peak := e.dep.peak
	e.dep.mu.Unlock()
	require.Greater(t, peak, probes, "once closed, more than the probes run at once again")
	require.LessOrEqual(t, peak, 6, "within the pool's size")
	require.Zero(t, e.queues().Archived)
	for q, v := range e.pauses() {
		require.NotEqual(t, "compartment-breaker", v, "no breaker pause left on %s", q)
	}
}

// TestBreakerProbesNeverExceedWhileHalfOpen measures the probes' overlap
// alone: with the database down, no more than `probes` calls are ever
// inside the handlers at once after the trip.
func TestBreakerProbesNeverExceedWhileHalfOpen(t *testing.T) {
	const probes = 2
	e := newBreakerEnv(t, queues.PoolConfig{Size: 6, Scope: queues.ScopeProcess, MaxRetry: 1,
		Breaker: &queues.BreakerConfig{MinCalls: 3, Window: 10 * time.Second, CoolDown: time.Second, MaxCoolDown: time.Second, Probes: probes}})
	e.dep.set(func(d *dependency) { d.down = true })
	e.enqueue(30, 200*time.Millisecond, "")
	e.start(3)
	e.waitState(queues.BreakerOpen, 30*time.Second)
	testwait.For(t, 10*time.Second, "the running jobs to end", func() bool { return e.queues().Active == 0 })
	e.dep.set(func(d *dependency) { d.peakAfter = time.Now() })
	first := e.breaker().Trips
	testwait.For(t, 30*time.Second, "three failed half-open trials", func() bool { return e.breaker().Trips >= first+3 })
	e.dep.mu.Lock()
	peak := e.dep.peak
	e.dep.mu.Unlock()
	require.LessOrEqual(t, peak, probes)
	require.GreaterOrEqual(t, peak, 1, "the probes ran")
	require.Zero(t, e.queues().Archived)
}

// TestBreakerLeavesOperatorPauseAlone: a queue an operator paused stays
// paused through the breaker's open and close; the breaker's own pauses are
// gone after the close.
func TestBreakerLeavesOperatorPauseAlone(t *testing.T) {
	e := newBreakerEnv(t, queues.PoolConfig{Size: 1, Scope: queues.ScopeProcess, Tiers: []string{"regulatory", "adhoc"},
		Breaker: &queues.BreakerConfig{MinCalls: 2, Window: 10 * time.Second, CoolDown: time.Hour}})
	regulatory := e.cfg.Namespace + ":db:regulatory"
	adhoc := e.cfg.Namespace + ":db:adhoc"
	e.dep.set(func(d *dependency) { d.down = true })
	e.enqueue(4, 0, "adhoc")
	payload, _ := json.Marshal(dbJob{Seq: 50})
	_, err := e.client.Enqueue(context.Background(), "db:query", payload, queues.EnqueueOptions{Tier: "regulatory", ID: "reg"})
	require.NoError(t, err)
	require.NoError(t, e.insp.PauseQueue(regulatory))
	e.start(1)
	e.waitState(queues.BreakerOpen, 30*time.Second)
	p := e.pauses()
	require.Equal(t, "compartment-breaker", p[adhoc])
	require.NotEqual(t, "compartment-breaker", p[regulatory], "the operator's pause keeps its value")
	require.NotEmpty(t, p[regulatory])

	e.dep.set(func(d *dependency) { d.down = false })
	_, err = e.client.ForceBreaker(context.Background(), "db", queues.BreakerReset)
	require.NoError(t, err)
	testwait.For(t, 30*time.Second, "the adhoc jobs done", func() bool { _, done := e.dep.read(); return done == 4 })
	p = e.pauses()
	require.Empty(t, p[adhoc])
	require.NotEmpty(t, p[regulatory], "the operator's pause stays")
	info, err := e.insp.GetQueueInfo(regulatory)
	require.NoError(t, err)
	require.Equal(t, 1, info.Pending)
}

// TestBreakerForceOpen: an operator opens the breaker; nothing runs until
// it is closed; forced open does not move to half-open on its own.
func TestBreakerForceOpen(t *testing.T) {
	e := newBreakerEnv(t, queues.PoolConfig{Size: 2, Scope: queues.ScopeCluster,
		Breaker: &queues.BreakerConfig{CoolDown: time.Second}})
	e.start(2)
	st, err := e.client.ForceBreaker(context.Background(), "db", queues.BreakerForceOpen)
	require.NoError(t, err)
	require.Equal(t, queues.BreakerOpen, st.State)
	require.Equal(t, queues.BreakerOpen, st.Forced)
	require.True(t, st.ReopensAt.IsZero(), "open until an operator acts")
	e.enqueue(5, 0, "")
	// It stays open past its cool-down (by Redis's clock), and no job runs.
	testwait.For(t, 10*time.Second, "two cool-downs to pass", func() bool {
		now, err := e.r.Client.Time(context.Background()).Result()
		require.NoError(t, err)
		return now.Sub(st.Since) > 2*time.Second+breakerTickSlack
	})
	require.Equal(t, 5, e.queues().Pending)
	st = e.breaker()
	require.Equal(t, queues.BreakerOpen, st.State)
	require.Equal(t, "forced open by an operator", st.Why)
	calls, _ := e.dep.read()
	require.Zero(t, calls)

	_, err = e.client.ForceBreaker(context.Background(), "db", "sideways")
	require.ErrorIs(t, err, queues.ErrInvalidRequest)
	_, err = e.client.ForceBreaker(context.Background(), "db", queues.BreakerReset)
	require.NoError(t, err)
	testwait.For(t, 30*time.Second, "every job done", func() bool { _, done := e.dep.read(); return done == 5 })
}

// breakerTickSlack covers a process's look at the breaker (every 250ms).
const breakerTickSlack = 500 * time.Millisecond

func TestBreakerConfigProblems(t *testing.T) {
	t.Parallel()
	cfg := queues.Config{Pools: []queues.PoolConfig{{Name: "db", Size: 1, JobTypes: []string{"x"},
		Breaker: &queues.BreakerConfig{FailureRatio: 1.5, MinCalls: -1, Window: 10 * time.Millisecond, SlowCall: -time.Second,
			CoolDown: 100 * time.Millisecond, MaxCoolDown: 50 * time.Millisecond, Probes: -2}}}}
	err := cfg.Validate()
	var ce *queues.ConfigError
	require.ErrorAs(t, err, &ce)
	msg := strings.Join(ce.Problems, "\n")
	for _, want := range []string{
		`pool "db": breaker: failure_ratio`, `pool "db": breaker: min_calls`, `pool "db": breaker: window`,
		`pool "db": breaker: slow_call`, `pool "db": breaker: cool_down`, `pool "db": breaker: max_cool_down`, `pool "db": breaker: probes`,
	} {
		require.Contains(t, msg, want)
	}
	d := queues.PoolConfig{Name: "db", Size: 1, JobTypes: []string{"x"}, Breaker: &queues.BreakerConfig{}}.WithDefaults()
	require.Equal(t, queues.BreakerConfig{FailureRatio: 0.5, MinCalls: 10, Window: time.Minute, CoolDown: 30 * time.Second,
		MaxCoolDown: 5 * time.Minute, Probes: 1}, *d.Breaker)
}

func TestBreakerNeedsOne(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	c, err := queues.NewClient(r.Client, queues.Config{Namespace: r.Namespace(t), Pools: []queues.PoolConfig{{Name: "db", Size: 1, JobTypes: []string{"x"}}}})
	require.NoError(t, err)
	_, err = c.Breaker(context.Background(), "db")
	require.ErrorIs(t, err, queues.ErrNoBreaker)
	_, err = c.ForceBreaker(context.Background(), "nope", queues.BreakerReset)
	require.ErrorIs(t, err, queues.ErrInvalidRequest)
}

// TestBreakerBringsTrippingJobsBack: the jobs whose failures tripped the
// breaker do not wait out their own retry backoff (an hour here): they are
// back in their queue at once, waiting for the close with the rest, and run
// as soon as it closes.
func TestBreakerBringsTrippingJobsBack(t *testing.T) {
	const jobs = 6
	e := newBreakerEnv(t, queues.PoolConfig{Size: 1, Scope: queues.ScopeProcess,
		Breaker: &queues.BreakerConfig{MinCalls: 3, Window: 10 * time.Second, CoolDown: time.Hour}})
	e.cfg.RetryDelay = func(int, error) time.Duration { return time.Hour }
	e.dep.set(func(d *dependency) { d.down = true })
	e.enqueue(jobs, 0, "")
	e.start(1)
	e.waitState(queues.BreakerOpen, 30*time.Second)
	testwait.For(t, 30*time.Second, "every job pending, none waiting for a retry", func() bool {
		q := e.queues()
		return q.Pending == jobs && q.Retry == 0 && q.Active == 0
	})
	e.dep.set(func(d *dependency) { d.down = false })
	_, err := e.client.ForceBreaker(context.Background(), "db", queues.BreakerReset)
	require.NoError(t, err)
	testwait.For(t, 30*time.Second, "every job done", func() bool { _, done := e.dep.read(); return done == jobs })
}

// lateObserver holds up the end of job "job-0"'s failed attempt (after the
// runner counted it, before asynq writes its retry) until the breaker is
// open: the trip gives back a failure whose retry asynq has not written.
type lateObserver struct {
	e       *breakerEnv
	once    sync.Once
	failing chan struct{} // closed when job-0's failure has been counted
}

func (o *lateObserver) JobStarted(queues.JobStart) {}

func (o *lateObserver) JobFinished(end queues.JobEnd) {
	if end.JobID != "job-0" || end.Err == nil {
		return
	}
	o.once.Do(func() {
		close(o.failing)
		deadline := time.Now().Add(20 * time.Second)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for time.Now().Before(deadline) {
			if st, err := o.e.client.Breaker(context.Background(), "db"); err == nil && st.State != queues.BreakerClosed {
				return
			}
			<-tick.C
		}
	})
}

// TestBreakerBringsBackAJobWhoseRetryWasNotWrittenYet: job-0 fails first
// (counted, the breaker still closed); before asynq has written its retry
// (an hour's backoff here), job-1's failure trips the breaker. The trip
// gives job-0's failure back although job-0 is not in its retry set yet;
// once asynq writes it there, the next tick brings it forward, so job-0
// runs when the breaker closes instead of an hour later.
func TestBreakerBringsBackAJobWhoseRetryWasNotWrittenYet(t *testing.T) {
	e := newBreakerEnv(t, queues.PoolConfig{Size: 2, Scope: queues.ScopeProcess, MaxRetry: 1,
		Breaker: &queues.BreakerConfig{MinCalls: 2, FailureRatio: 0.5, Window: 10 * time.Second, CoolDown: time.Second}})
	e.cfg.RetryDelay = func(int, error) time.Duration { return time.Hour }
	obs := &lateObserver{e: e, failing: make(chan struct{})}
	e.cfg.Observer = obs
	e.dep.set(func(d *dependency) {
		d.fail = func(j dbJob, attempt int) error {
			if attempt > 1 {
				return nil // the dependency is back
			}
			if j.Seq == 1 {
				select {
				case <-obs.failing:
				case <-time.After(20 * time.Second):
				}
			}
			return errors.New("database unreachable")
		}
	})
	e.enqueue(2, 0, "")
	e.start(1)
	e.waitState(queues.BreakerOpen, 30*time.Second)
	testwait.For(t, 15*time.Second, "both jobs done once the breaker closes", func() bool {
		_, done := e.dep.read()
		return done == 2
	})
	require.Zero(t, e.queues().Archived)
	e.waitState(queues.BreakerClosed, 5*time.Second)
}

// TestBreakerSuccessClearsTheFailuresCounted: in a pool with a breaker the
// runner counts a job's failures itself. A job that failed once and then
// succeeded, in another process a moment later, must leave no count behind:
// run again under the same ID (its first run completed and is gone), it
// gets all of its retries. A stale count would archive it at its first
// failure (max_retry 1).
func TestBreakerSuccessClearsTheFailuresCounted(t *testing.T) {
	const jobs = 20
	e := newBreakerEnv(t, queues.PoolConfig{Size: 4, Scope: queues.ScopeCluster, MaxRetry: 1,
		Breaker: &queues.BreakerConfig{MinCalls: 1000, FailureRatio: 1, Window: 10 * time.Second, CoolDown: time.Second}})
	e.dep.set(func(d *dependency) {
		// Every run of a job fails first, then succeeds: attempts 1 and
		// 3 fail, 2 and 4 succeed.
		d.fail = func(_ dbJob, attempt int) error {
			if attempt%2 == 1 {
				return errors.New("deadlock detected")
			}
			return nil
		}
	})
	e.start(2)
	enqueue := func() {
		for i := range jobs {
			payload, _ := json.Marshal(dbJob{Seq: i})
			_, err := e.client.Enqueue(context.Background(), "db:query", payload, queues.EnqueueOptions{ID: fmt.Sprintf("job-%d", i)})
			require.NoError(t, err)
		}
	}
	calls := func(n int) func() bool {
		return func() bool {
			c, _ := e.dep.read()
			return c >= n
		}
	}
	enqueue()
	testwait.For(t, 20*time.Second, "every job failed once, then succeeded", calls(2*jobs))
	testwait.For(t, 10*time.Second, "every first run completed and gone", func() bool {
		q := e.queues()
		return q.Pending+q.Active+q.Retry+q.Scheduled == 0
	})
	enqueue()
	t.Cleanup(func() {
		if t.Failed() {
			e.dep.mu.Lock()
			t.Logf("attempts %v queues %+v", e.dep.attempts, e.queues())
			e.dep.mu.Unlock()
		}
	})
	testwait.For(t, 20*time.Second, "every job ran twice more", calls(4*jobs))
	testwait.For(t, 10*time.Second, "the second runs settled", func() bool {
		q := e.queues()
		return q.Pending+q.Active+q.Retry+q.Scheduled == 0
	})
	require.Zero(t, e.queues().Archived, "a job archived at its first failure of its second run: a stale failure count")
	e.dep.mu.Lock()
	defer e.dep.mu.Unlock()
	for i := range jobs {
		require.Equal(t, 4, e.dep.attempts[i], "job %d", i)
	}
	require.Equal(t, queues.BreakerClosed, e.breaker().State)
}

// changeLog collects the changes a Config.OnBreakerChange hook sees.
type changeLog struct {
	mu      sync.Mutex
	changes []queues.BreakerChange
}

func (l *changeLog) hook(c queues.BreakerChange) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.changes = append(l.changes, c)
}

func (l *changeLog) read() []queues.BreakerChange {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]queues.BreakerChange(nil), l.changes...)
}

// TestBreakerChangesReachTheHook: in a trip-and-recover run the worker's
// Config.OnBreakerChange sees closed -> open -> half-open -> closed, each
// once and in order, with why and when (Redis's clock); a change an
// operator forces is seen by the forcing client's hook, not by the
// worker's, and forcing the state the breaker is in is no change.
func TestBreakerChangesReachTheHook(t *testing.T) {
	e := newBreakerEnv(t, queues.PoolConfig{Size: 1, Scope: queues.ScopeProcess, MaxRetry: 3,
		Breaker: &queues.BreakerConfig{MinCalls: 2, FailureRatio: 0.5, Window: 10 * time.Second, CoolDown: time.Second, Probes: 1}})
	// The dependency fails the first two calls: they trip the breaker;
	// the probe after the cool-down succeeds and closes it.
	var calls atomic.Int32
	e.dep.set(func(d *dependency) {
		d.fail = func(dbJob, int) error {
			if calls.Add(1) <= 2 {
				return errors.New("database unreachable")
			}
			return nil
		}
	})
	var worker, operator changeLog
	e.cfg.OnBreakerChange = worker.hook
	e.enqueue(4, 0, "")
	e.start(1)
	testwait.For(t, 30*time.Second, "every job done", func() bool { _, done := e.dep.read(); return done == 4 })
	e.waitState(queues.BreakerClosed, 10*time.Second)

	// Changes made on different goroutines (the tick's half-open, the
	// probe's close) may reach the hook in either order: At orders them,
	// and within one millisecond the breaker's own order does.
	got := worker.read()
	step := map[queues.BreakerStatus]int{queues.BreakerClosed: 0, queues.BreakerOpen: 1, queues.BreakerHalfOpen: 2}
	sort.SliceStable(got, func(i, j int) bool {
		if !got[i].At.Equal(got[j].At) {
			return got[i].At.Before(got[j].At)
		}
		return step[got[i].From] < step[got[j].From]
	})
	var steps []string
	for _, c := range got {
		require.Equal(t, "db", c.Pool)
		steps = append(steps, string(c.From)+" -> "+string(c.To)+": "+c.Why)
	}
	require.Equal(t, []string{
		"closed -> open: 2 of 2 calls failed (2 errors, 0 slow) in the window, ratio 1.00 >= 0.50",
		"open -> half-open: cool-down over",
		"half-open -> closed: 1 of 1 probes succeeded",
	}, steps)
	now, err := e.r.Client.Time(context.Background()).Result()
	require.NoError(t, err)
	require.WithinDuration(t, now, got[0].At, time.Minute, "by Redis's clock")
	require.GreaterOrEqual(t, got[1].At.Sub(got[0].At), time.Second, "half-open after the cool-down")
	require.False(t, got[2].At.Before(got[1].At))
	require.Equal(t, got[2].At, e.breaker().Since, "the change's time is the state's")

	// An operator forces it open, through a client of its own.
	cfg := e.cfg
	cfg.OnBreakerChange = operator.hook
	admin, err := queues.NewClient(e.r.Client, cfg)
	require.NoError(t, err)
	st, err := admin.ForceBreaker(context.Background(), "db", queues.BreakerForceOpen)
	require.NoError(t, err)
	_, err = admin.ForceBreaker(context.Background(), "db", queues.BreakerForceOpen)
	require.NoError(t, err)
	require.Equal(t, []queues.BreakerChange{{Pool: "db", From: queues.BreakerClosed, To: queues.BreakerOpen,
		Why: "forced open by an operator", At: st.Since}}, operator.read(), "forced once: one change; forced again: none")
	_, err = admin.ForceBreaker(context.Background(), "db", queues.BreakerReset)
	require.NoError(t, err)
	require.Len(t, operator.read(), 2)
	require.Len(t, worker.read(), 3, "the worker does not see what an operator forces")
}
