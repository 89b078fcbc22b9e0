package queues_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/queues"
)

func pool(name string, size int, jobType string, tiers ...string) queues.PoolConfig {
	pc := queues.PoolConfig{Name: name, Size: size, JobTypes: []string{jobType}, PollInterval: 20 * time.Millisecond}
	if len(tiers) > 0 {
		pc.Tiers = tiers
	}
	return pc
}

// TestPoolCapsHoldUnderFlood floods three pools of sizes 2/2/1 at once and
// checks, inside the handlers, that no pool ever runs more jobs than its
// size, that each pool does fill up, and that every job completes.
func TestPoolCapsHoldUnderFlood(t *testing.T) {
	h := newHarness(t,
		pool("order", 2, "order:create"),
		pool("search", 2, "search:index"),
		pool("batch", 1, "report:run", "regulatory", "close", "adhoc"),
	)
	want := map[string]int{"order": 40, "search": 40, "batch": 15}
	sizes := map[string]int{"order": 2, "search": 2, "batch": 1}
	tiers := []string{"regulatory", "close", "adhoc"}
	for i := range want["order"] {
		h.enqueue("order:create", job{Seq: i, Work: 15 * time.Millisecond})
		h.enqueue("search:index", job{Seq: i, Work: 15 * time.Millisecond})
	}
	for i := range want["batch"] {
		h.enqueue("report:run", job{Seq: i, Tier: tiers[i%3], Work: 15 * time.Millisecond})
	}
	h.runner(h.obs.mux(t, "order:create", "search:index", "report:run"))
	for p, n := range want {
		h.obs.waitDone(t, p, n, 60*time.Second)
	}

	peak, starts, done := h.obs.snapshot()
	for p, size := range sizes {
		require.LessOrEqualf(t, peak[p], size, "pool %s ran more jobs at once than its size", p)
		require.Equalf(t, size, peak[p], "pool %s never filled up under a flood", p)
		require.Equalf(t, want[p], done[p], "pool %s lost or duplicated jobs", p)
	}
	require.Len(t, starts, want["order"]+want["search"]+want["batch"], "each job started exactly once")
	for _, p := range h.pools.Pools() {
		s := p.Bulkhead().Stats()
		require.Equal(t, uint64(want[p.Name()]), s.Accepted, p.Name())
		require.Zero(t, s.Rejected, "the server's concurrency equals the bulkhead size, so nothing is turned away")
		require.Zero(t, s.Active)
	}
}

// TestBatchFloodDoesNotDelayOrders measures how long order jobs wait
// (enqueue to handler start) without and then with a batch flood, in the same
// test. The comparison is generous: this checks isolation, not speed.
func TestBatchFloodDoesNotDelayOrders(t *testing.T) {
	h := newHarness(t,
		pool("order", 2, "order:create"),
		pool("batch", 1, "report:run", "regulatory", "close", "adhoc"),
	)
	h.runner(h.obs.mux(t, "order:create", "report:run"))

	const orders = 15
	measure := func(from int) []time.Duration {
		for i := range orders {
			h.enqueue("order:create", job{Seq: from + i, Work: 5 * time.Millisecond})
			time.Sleep(20 * time.Millisecond) // a steady trickle of orders, not a wait on a condition
		}
		h.obs.waitDone(t, "order", from+orders, 30*time.Second)
		_, starts, _ := h.obs.snapshot()
		var waits []time.Duration
		for _, s := range starts {
			if s.Pool == "order" && s.Job.Seq >= from {
				waits = append(waits, s.At.Sub(s.Job.EnqueuedAt))
			}
		}
		require.Len(t, waits, orders)
		return waits
	}

	quiet := measure(0)

	const flood = 200
	for i := range flood {
		h.enqueue("report:run", job{Seq: i, Work: 100 * time.Millisecond})
	}
	flooded := measure(orders)

	quietP50, floodP50 := percentile(quiet, 0.5), percentile(flooded, 0.5)
	quietMax, floodMax := percentile(quiet, 1), percentile(flooded, 1)
	t.Logf("order wait p50: quiet %s, during flood %s; max: quiet %s, during flood %s", quietP50, floodP50, quietMax, floodMax)

	// Had orders shared the batch's single slot, each would wait behind
	// 100ms reports, and the 200-report backlog would hold them for 20s.
	require.Less(t, floodP50, 3*quietP50+250*time.Millisecond, "orders waited much longer during the batch flood")
	require.Less(t, floodMax, 3*quietMax+time.Second, "an order waited much longer during the batch flood")

	peak, _, done := h.obs.snapshot()
	require.Equal(t, 1, peak["batch"])
	require.Less(t, done["batch"], flood, "the flood was still going on while orders ran")
}

// TestStrictTierOrder enqueues a mixed backlog before the worker starts and
// checks that a batch pool of size 1 starts jobs sorted by tier, first in,
// first out within a tier.
func TestStrictTierOrder(t *testing.T) {
	h := newHarness(t, pool("batch", 1, "report:run", "adhoc", "regulatory", "close"))
	tiers := []string{"regulatory", "close", "adhoc"}
	rank := map[string]int{"regulatory": 0, "close": 1, "adhoc": 2}
	rng := rand.New(rand.NewPCG(1, 2))
	var enqueued []job
	for i := range 40 {
		j := job{Seq: i, Tier: tiers[rng.IntN(len(tiers))], Work: time.Millisecond}
		h.enqueue("report:run", j)
		enqueued = append(enqueued, j)
	}
	p, err := h.pools.Get("batch")
	require.NoError(t, err)
	require.Equal(t, []string{"regulatory", "close", "adhoc"}, p.Tiers(), "order comes from the priorities file")

	h.runner(h.obs.mux(t, "report:run"))
	h.obs.waitDone(t, "batch", len(enqueued), 60*time.Second)

	want := slices.Clone(enqueued)
	sort.SliceStable(want, func(i, j int) bool { return rank[want[i].Tier] < rank[want[j].Tier] })
	var wantSeq, gotSeq []int
	for _, j := range want {
		wantSeq = append(wantSeq, j.Seq)
	}
	_, starts, _ := h.obs.snapshot()
	for _, s := range starts {
		gotSeq = append(gotSeq, s.Job.Seq)
	}
	require.Equal(t, wantSeq, gotSeq, "start order must be by tier, FIFO within a tier")
}

// TestPermanentFailures checks that a panic, a malformed payload and a job
// in the wrong pool are archived at once with their reason, and that the
// worker keeps running.
func TestPermanentFailures(t *testing.T) {
	h := newHarness(t, pool("order", 1, "order:create"), pool("batch", 1, "report:run", "adhoc", "regulatory", "close"))
	obsMux := h.obs.mux(t, "report:run")
	mux := handlers.NewMux()
	require.NoError(t, mux.HandleFunc("order:create", func(ctx context.Context, t *asynq.Task) error {
		if string(t.Payload()) == `"panic"` {
			panic("order table is on fire")
		}
		return obsMux.ProcessTask(ctx, asynq.NewTask("report:run", t.Payload()))
	}))
	require.NoError(t, mux.Handle("report:run", obsMux))
	h.runner(mux)

	ctx := context.Background()
	panicked, err := h.client.Enqueue(ctx, "order:create", []byte(`"panic"`), queues.EnqueueOptions{Retention: time.Hour})
	require.NoError(t, err)
	malformed, err := h.client.Enqueue(ctx, "report:run", []byte(`{"seq": "one"}`), queues.EnqueueOptions{Retention: time.Hour})
	require.NoError(t, err)
	// A report enqueued by hand into the order pool's queue.
	raw := asynq.NewClientFromRedisClient(h.redis.Client)
	defer raw.Close()
	orderPool, _ := h.pools.Get("order")
	misrouted, err := raw.Enqueue(asynq.NewTask("report:run", []byte(`{"seq": 1}`)), asynq.Queue(orderPool.Queues()[0]))
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		info *asynq.TaskInfo
		want string
	}{
		{"panic", panicked, `handler panicked: job type "order:create": order table is on fire`},
		{"malformed payload", malformed, `job type "report:run": malformed payload: json: cannot unmarshal string`},
		{"wrong pool", misrouted, `job type not routed to this pool: job type "report:run" arrived in pool "order"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got *asynq.TaskInfo
			waitFor(t, 30*time.Second, func() bool {
				got, err = h.insp.GetTaskInfo(tc.info.Queue, tc.info.ID)
				return err == nil && got.State == asynq.TaskStateArchived
			}, "job %s to be archived", tc.info.ID)
			require.Contains(t, got.LastErr, tc.want)
			require.Contains(t, got.LastErr, "skip retry")
			require.Zero(t, got.Retried, "a permanent failure is not retried")
		})
	}

	// The worker is still alive and serving.
	h.enqueue("order:create", job{Seq: 99, Work: time.Millisecond})
	h.obs.waitDone(t, "batch", 1, 30*time.Second)
}

// TestGracefulShutdown: in-flight jobs get the shutdown timeout to finish; a
// job still running then goes back to its queue without using a retry; jobs
// not started stay queued. Nothing is lost.
func TestGracefulShutdown(t *testing.T) {
	h := newHarness(t, pool("batch", 2, "report:run", "adhoc", "regulatory", "close"))
	h.cfg.ShutdownTimeout = time.Second
	h.enqueue("report:run", job{Seq: 0, Work: 300 * time.Millisecond}) // finishes within the timeout
	h.enqueue("report:run", job{Seq: 1, Work: time.Hour})              // does not
	for i := 2; i < 6; i++ {
		h.enqueue("report:run", job{Seq: i, Work: time.Millisecond})
	}
	r, err := queues.NewRunner(queues.RunnerConfig{Pools: h.pools, Redis: h.redis.Client, Handlers: h.obs.mux(t, "report:run"), ShutdownTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	waitFor(t, 10*time.Second, func() bool { _, s, _ := h.obs.snapshot(); return len(s) == 2 }, "two jobs to start")

	began := time.Now()
	r.Shutdown()
	took := time.Since(began)
	r.Shutdown() // idempotent
	require.Less(t, took, 10*time.Second)

	_, starts, done := h.obs.snapshot()
	require.Len(t, starts, 2, "no new job starts once shutdown begins")
	require.Equal(t, 1, done["batch"], "the short in-flight job finished")

	q := h.pools.Pools()[0].Queues()[2] // adhoc, the default tier
	info, err := h.insp.GetQueueInfo(q)
	require.NoError(t, err)
	require.Equal(t, 5, info.Pending, "the unfinished job and the four never started are queued")
	require.Zero(t, info.Active)
	pending, err := h.insp.ListPendingTasks(q)
	require.NoError(t, err)
	for _, ti := range pending {
		require.Zero(t, ti.Retried, "a shutdown does not use up a retry")
	}
}

func TestRunnerLifecycle(t *testing.T) {
	h := newHarness(t, pool("order", 1, "order:create"))
	mux := h.obs.mux(t, "order:create")

	r, err := queues.NewRunner(queues.RunnerConfig{Pools: h.pools, Redis: h.redis.Client, Handlers: mux, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	r.Shutdown() // before Start: safe
	require.EqualError(t, r.Start(context.Background()), "runner: already shut down")

	r, err = queues.NewRunner(queues.RunnerConfig{Pools: h.pools, Redis: h.redis.Client, Handlers: mux, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	require.EqualError(t, r.Start(context.Background()), "runner: already started")
	r.Shutdown()
	<-r.Done()
}

func TestNewRunnerChecksHandlers(t *testing.T) {
	h := newHarness(t, pool("order", 1, "order:create"))
	mux := handlers.NewMux()
	require.NoError(t, mux.HandleFunc("stray:job", func(context.Context, *asynq.Task) error { return nil }))
	_, err := queues.NewRunner(queues.RunnerConfig{Pools: h.pools, Redis: h.redis.Client, Handlers: mux, Logger: slog.New(slog.DiscardHandler)})
	require.EqualError(t, err, "pool \"order\": job type \"order:create\" has no handler\n"+
		"job type \"stray:job\" has a handler but is routed to no pool")

	_, err = queues.NewRunner(queues.RunnerConfig{})
	require.EqualError(t, err, "runner: no pools\nrunner: no Redis client\nrunner: no handlers")
}

func TestClientRouting(t *testing.T) {
	h := newHarness(t, pool("order", 1, "order:create"), pool("batch", 1, "report:run", "adhoc", "regulatory"))
	ctx := context.Background()
	ns := h.cfg.Namespace

	info, err := h.client.Enqueue(ctx, "report:run", []byte(`{}`), queues.EnqueueOptions{Tier: "regulatory"})
	require.NoError(t, err)
	require.Equal(t, ns+":batch:regulatory", info.Queue)

	info, err = h.client.Enqueue(ctx, "report:run", []byte(`{}`), queues.EnqueueOptions{})
	require.NoError(t, err)
	require.Equal(t, ns+":batch:adhoc", info.Queue, "no tier means the default tier")

	info, err = h.client.Enqueue(ctx, "order:create", []byte(`{}`), queues.EnqueueOptions{})
	require.NoError(t, err)
	require.Equal(t, ns+":order", info.Queue)
	require.Equal(t, queues.DefaultMaxRetry+queues.CrashRetries, info.MaxRetry, "room for crashes on top of max_retry")
	require.Equal(t, queues.DefaultJobTimeout, info.Timeout)

	_, err = h.client.Enqueue(ctx, "report:run", nil, queues.EnqueueOptions{Tier: "close"})
	require.EqualError(t, err, `pool "batch" does not serve tier "close" (its tiers: ["regulatory" "adhoc"])`)
	_, err = h.client.Enqueue(ctx, "order:create", nil, queues.EnqueueOptions{Tier: "adhoc"})
	require.EqualError(t, err, `pool "order" has no tiers; got tier "adhoc"`)
	_, err = h.client.Enqueue(ctx, "refund:issue", nil, queues.EnqueueOptions{})
	require.EqualError(t, err, `job type "refund:issue" is routed to no pool (pools: ["order" "batch"])`)

	_, err = h.client.Enqueue(ctx, "report:run", nil, queues.EnqueueOptions{ID: "vat-2026-10"})
	require.NoError(t, err)
	_, err = h.client.Enqueue(ctx, "report:run", nil, queues.EnqueueOptions{ID: "vat-2026-10"})
	require.True(t, errors.Is(err, queues.ErrDuplicate), err)
}

func TestRegistry(t *testing.T) {
	h := newHarness(t, pool("order", 2, "order:create"))
	p, err := h.pools.Route("order:create")
	require.NoError(t, err)
	require.Equal(t, "order", p.Name())
	require.Equal(t, 2, p.Bulkhead().MaxConcurrent())

	_, err = h.pools.Register(pool("order", 1, "x:y"))
	require.EqualError(t, err, `pool "order": duplicate pool name`)
	_, err = h.pools.Register(pool("other", 1, "order:create"))
	require.EqualError(t, err, `job type "order:create" is routed to two pools: "order" and "other"`)
	_, err = h.pools.Register(queues.PoolConfig{Name: "bad", Size: 0, JobTypes: []string{"a"}, QueueOrder: "strict", PollInterval: time.Second, JobTimeout: time.Second})
	require.ErrorContains(t, err, `pool "bad": size must be >= 1, got 0`)
	_, err = h.pools.Get("bad")
	require.EqualError(t, err, `unknown pool "bad" (pools: ["order"])`)
	require.Len(t, h.pools.Pools(), 1, "failed registrations change nothing")
	require.Len(t, h.pools.Bulkheads().All(), 1)
}

// TestMaxRetryCountsFailuresNotCrashes: a job that keeps failing runs
// 1 + max_retry times and is then archived with the count in its reason;
// a job that fails once and then succeeds leaves no counter behind.
func TestMaxRetryCountsFailures(t *testing.T) {
	two := 2
	pc := pool("order", 2, "order:create")
	pc.MaxRetry = &two
	h := newHarness(t, pc)
	var mu sync.Mutex
	runs := map[string]int{}
	mux := handlers.NewMux()
	require.NoError(t, mux.HandleFunc("order:create", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		runs[id]++
		n := runs[id]
		mu.Unlock()
		if string(task.Payload()) == "flaky" && n > 1 {
			return nil
		}
		return errors.New("database unavailable")
	}))
	r, err := queues.NewRunner(queues.RunnerConfig{Pools: h.pools, Redis: h.redis.Client, Handlers: mux,
		Logger: slog.New(slog.DiscardHandler), RetryDelay: func(int, error) time.Duration { return 10 * time.Millisecond },
		DelayedCheckInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(r.Shutdown)

	ctx := context.Background()
	broken, err := h.client.Enqueue(ctx, "order:create", []byte("broken"), queues.EnqueueOptions{Retention: time.Hour})
	require.NoError(t, err)
	flaky, err := h.client.Enqueue(ctx, "order:create", []byte("flaky"), queues.EnqueueOptions{Retention: time.Hour})
	require.NoError(t, err)

	var info *asynq.TaskInfo
	waitFor(t, 60*time.Second, func() bool {
		info, err = h.insp.GetTaskInfo(broken.Queue, broken.ID)
		return err == nil && info.State == asynq.TaskStateArchived
	}, "the broken job to be archived")
	require.Contains(t, info.LastErr, "failed more times than max_retry allows (3 failures, max_retry 2): database unavailable")
	waitFor(t, 60*time.Second, func() bool {
		info, err = h.insp.GetTaskInfo(flaky.Queue, flaky.ID)
		return err == nil && info.State == asynq.TaskStateCompleted
	}, "the flaky job to complete")
	mu.Lock()
	require.Equal(t, 3, runs[broken.ID], "1 run + max_retry 2 retries")
	require.Equal(t, 2, runs[flaky.ID])
	mu.Unlock()
	n, err := h.redis.Client.Exists(ctx, h.cfg.Namespace+":failures:"+flaky.ID, h.cfg.Namespace+":failures:"+broken.ID).Result()
	require.NoError(t, err)
	require.Zero(t, n, "failure counters are removed once a job is done")
}
