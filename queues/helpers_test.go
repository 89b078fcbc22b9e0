package queues_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/lci-labs/compartment/internal/testleak"
	"github.com/lci-labs/compartment/internal/testwait"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/queues"
)

func TestMain(m *testing.M) { testleak.VerifyMain(m) }

func noop(context.Context, *asynq.Task) error { return nil }

// harness is a set of pools on a test Redis with a unique namespace: an
// enqueue-only client, and runners started with run.
type harness struct {
	t      *testing.T
	redis  *testredis.Redis
	cfg    queues.Config
	client *queues.Client
	insp   *asynq.Inspector
	obs    *observer
}

func newHarness(t *testing.T, pools ...queues.PoolConfig) *harness {
	t.Helper()
	r := testredis.New(t)
	cfg := queues.Config{
		Namespace:       r.Namespace(t),
		Tiers:           testPolicy(t),
		ShutdownTimeout: 5 * time.Second,
		Pools:           pools,
		Logger:          slog.New(slog.DiscardHandler),
	}
	client, err := queues.NewClient(r.Client, cfg)
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(r.Client)
	return &harness{t: t, redis: r, cfg: cfg, client: client, insp: insp, obs: newObserver(client)}
}

// run starts a client that runs the pools with h's handlers and stops it
// when the test ends.
func (h *harness) run(handlers *queues.Handlers) *queues.Client {
	h.t.Helper()
	cfg := h.cfg
	cfg.Handlers = handlers
	c, err := queues.NewClient(h.redis.Client, cfg)
	require.NoError(h.t, err)
	require.NoError(h.t, c.Start(context.Background()))
	h.t.Cleanup(func() { require.NoError(h.t, c.Stop(context.Background())) })
	return c
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
	pools *queues.Client

	mu     sync.Mutex
	inside map[string]int
	peak   map[string]int
	starts []start
	done   map[string]int
	cond   *sync.Cond
}

func newObserver(reg *queues.Client) *observer {
	o := &observer{pools: reg, inside: map[string]int{}, peak: map[string]int{}, done: map[string]int{}}
	o.cond = sync.NewCond(&o.mu)
	return o
}

// handler returns a handler that records the job and works for job.Work.
func (o *observer) handler(t *testing.T, jobType string) asynq.Handler {
	p, err := o.pools.Route(jobType)
	require.NoError(t, err)
	pool := p.Name()
	typed := queues.NewJob[job](jobType)
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		j, err := typed.Decode(t.Payload())
		if err != nil {
			return err
		}
		o.mu.Lock()
		o.inside[pool]++
		if o.inside[pool] > o.peak[pool] {
			o.peak[pool] = o.inside[pool]
		}
		o.starts = append(o.starts, start{Pool: pool, Job: j, At: time.Now()})
		o.mu.Unlock()

		timer := time.NewTimer(j.Work) // the job's simulated work
		defer timer.Stop()
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

func (o *observer) mux(t *testing.T, jobTypes ...string) *queues.Handlers {
	m := queues.NewHandlers()
	for _, jt := range jobTypes {
		m.Handle(jt, o.handler(t, jt))
	}
	return m
}

// waitDone waits until pool has completed n jobs, or fails after timeout.
func (o *observer) waitDone(t *testing.T, pool string, n int, timeout time.Duration) {
	t.Helper()
	testwait.For(t, timeout, fmt.Sprintf("pool %s to complete %d jobs", pool, n), func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.done[pool] >= n
	})
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

func percentile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := int(p * float64(len(s)-1))
	return s[idx]
}
