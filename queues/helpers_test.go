package queues_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-redis keeps a process-wide goroutine for its connection pools'
		// idle checks; it is not ours to stop.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}

const testPriorities = "tiers: [regulatory, close, adhoc]\ndefault: adhoc\n"

// harness is a set of pools on a test Redis with a unique namespace.
type harness struct {
	t      *testing.T
	redis  *testredis.Redis
	cfg    *queues.Config
	pools  *queues.Registry
	client *queues.Client
	insp   *asynq.Inspector
	obs    *observer
}

func newHarness(t *testing.T, pools ...queues.PoolConfig) *harness {
	t.Helper()
	r := testredis.New(t)
	policy, err := priority.Parse([]byte(testPriorities))
	require.NoError(t, err)
	cfg := &queues.Config{
		Redis:           queues.RedisConfig{URL: r.URL},
		Namespace:       r.Namespace(t),
		Priorities:      "(test)",
		Policy:          policy,
		ShutdownTimeout: 5 * time.Second,
		Pools:           pools,
	}
	cfg.SetDefaults()
	require.NoError(t, cfg.Validate(nil))
	reg, err := queues.NewRegistryFromConfig(cfg)
	require.NoError(t, err)
	client := queues.NewClient(reg, r.Client)
	insp := asynq.NewInspectorFromRedisClient(r.Client)
	t.Cleanup(func() { _ = client.Close() })
	return &harness{t: t, redis: r, cfg: cfg, pools: reg, client: client, insp: insp, obs: newObserver(reg)}
}

// runner starts a runner over mux and shuts it down when the test ends.
func (h *harness) runner(mux *handlers.Mux) *queues.Runner {
	h.t.Helper()
	r, err := queues.NewRunner(queues.RunnerConfig{
		Pools:           h.pools,
		Redis:           h.redis.Client,
		Handlers:        mux,
		ShutdownTimeout: h.cfg.ShutdownTimeout,
		Logger:          slog.New(slog.DiscardHandler),
	})
	require.NoError(h.t, err)
	require.NoError(h.t, r.Start(context.Background()))
	h.t.Cleanup(r.Shutdown)
	return r
}

// job is the payload of test jobs.
type job struct {
	Seq        int           `json:"seq"`
	Tier       string        `json:"tier,omitempty"`
	EnqueuedAt time.Time     `json:"enqueued_at"`
	Work       time.Duration `json:"work"`
}

func (h *harness) enqueue(jobType string, j job) {
	h.t.Helper()
	j.EnqueuedAt = time.Now()
	payload, err := json.Marshal(j)
	require.NoError(h.t, err)
	_, err = h.client.Enqueue(context.Background(), jobType, payload, queues.EnqueueOptions{Tier: j.Tier})
	require.NoError(h.t, err)
}

// start records one job starting, as seen inside its handler.
type start struct {
	Pool string
	Job  job
	At   time.Time
}

// observer counts, from inside the handlers, how many jobs of each pool run
// at once, and records every start.
type observer struct {
	pools *queues.Registry

	mu     sync.Mutex
	inside map[string]int
	peak   map[string]int
	starts []start
	done   map[string]int
	cond   *sync.Cond
}

func newObserver(reg *queues.Registry) *observer {
	o := &observer{pools: reg, inside: map[string]int{}, peak: map[string]int{}, done: map[string]int{}}
	o.cond = sync.NewCond(&o.mu)
	return o
}

// handler returns a handler that records the job and works for job.Work.
func (o *observer) handler(t *testing.T, jobType string) asynq.Handler {
	p, err := o.pools.Route(jobType)
	require.NoError(t, err)
	pool := p.Name()
	return handlers.JSON(func(ctx context.Context, j job) error {
		o.mu.Lock()
		o.inside[pool]++
		if o.inside[pool] > o.peak[pool] {
			o.peak[pool] = o.inside[pool]
		}
		o.starts = append(o.starts, start{Pool: pool, Job: j, At: time.Now()})
		o.mu.Unlock()

		timer := time.NewTimer(j.Work) // the job's simulated work
		defer timer.Stop()
		var err error
		select {
		case <-timer.C:
		case <-ctx.Done():
			err = ctx.Err()
		}

		o.mu.Lock()
		o.inside[pool]--
		if err == nil {
			o.done[pool]++
		}
		o.cond.Broadcast()
		o.mu.Unlock()
		return err
	})
}

func (o *observer) mux(t *testing.T, jobTypes ...string) *handlers.Mux {
	m := handlers.NewMux()
	for _, jt := range jobTypes {
		require.NoError(t, m.Handle(jt, o.handler(t, jt)))
	}
	return m
}

// waitDone waits until pool has completed n jobs, or fails after timeout.
func (o *observer) waitDone(t *testing.T, pool string, n int, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.done[pool] >= n
	}, "pool %s to complete %d jobs", pool, n)
}

func (o *observer) snapshot() (peak map[string]int, starts []start, done map[string]int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	peak = map[string]int{}
	for k, v := range o.peak {
		peak[k] = v
	}
	done = map[string]int{}
	for k, v := range o.done {
		done[k] = v
	}
	return peak, append([]start(nil), o.starts...), done
}

// waitFor polls cond every 5ms until it holds, failing the test after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for "+format, append([]any{timeout}, args...)...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := int(p * float64(len(s)-1))
	return s[idx]
}
