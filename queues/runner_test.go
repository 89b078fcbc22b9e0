package queues_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/lci-labs/compartment/internal/testwait"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

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
	r := h.run(h.obs.mux(t, "order:create", "search:index", "report:run"))
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
	for _, p := range r.Pools() {
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
	h.run(h.obs.mux(t, "order:create", "report:run"))

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
	p, err := h.client.Pool("batch")
	require.NoError(t, err)
	require.Equal(t, []string{"regulatory", "close", "adhoc"}, p.Tiers(), "order comes from the priority policy")

	h.run(h.obs.mux(t, "report:run"))
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
	t.Parallel()
	h := newHarness(t, pool("order", 1, "order:create"), pool("batch", 1, "report:run", "adhoc", "regulatory", "close"))
	obsMux := h.obs.mux(t, "report:run")
	mux := queues.NewHandlers()
	mux.HandleFunc("order:create", func(ctx context.Context, t *asynq.Task) error {
		if string(t.Payload()) == `"panic"` {
			panic("order table is on fire")
		}
		return obsMux.ProcessTask(ctx, asynq.NewTask("report:run", t.Payload()))
	})
	mux.Handle("report:run", obsMux)
	h.run(mux)

	ctx := context.Background()
	panicked, err := h.client.Enqueue(ctx, "order:create", []byte(`"panic"`), queues.EnqueueOptions{Retention: time.Hour})
	require.NoError(t, err)
	malformed, err := h.client.Enqueue(ctx, "report:run", []byte(`{"seq": "one"}`), queues.EnqueueOptions{Retention: time.Hour})
	require.NoError(t, err)
	// A report enqueued by hand into the order pool's queue.
	raw := asynq.NewClientFromRedisClient(h.redis.Client)
	defer raw.Close()
	orderPool, _ := h.client.Pool("order")
	misrouted, err := raw.Enqueue(asynq.NewTask("report:run", []byte(`{"seq": 1}`)), asynq.Queue(orderPool.Queues()[0]))
	require.NoError(t, err)

	for _, tc := range []struct {
		name      string
		queue, id string
		want      string
	}{
		{"panic", panicked.Queue, panicked.ID, `handler panicked: job type "order:create": order table is on fire`},
		{"malformed payload", malformed.Queue, malformed.ID, `job type "report:run": malformed payload: json: cannot unmarshal string`},
		{"wrong pool", misrouted.Queue, misrouted.ID, `job type not routed to this pool: job type "report:run" arrived in pool "order"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got *asynq.TaskInfo
			testwait.For(t, 30*time.Second, fmt.Sprintf("job %s to be archived", tc.id), func() bool {
				got, err = h.insp.GetTaskInfo(tc.queue, tc.id)
				return err == nil && got.State == asynq.TaskStateArchived
			})
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
//
// The pool is scoped per process: this is asynq's shutdown of the jobs it
// runs. A cluster-scoped pool also holds jobs taken ahead of a slot (its
// look-ahead); what a stop does with those is TestStopReturnsLookAheadJobs.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	pc := pool("batch", 2, "report:run", "adhoc", "regulatory", "close")
	pc.Scope = queues.ScopeProcess
	h := newHarness(t, pc)
	h.enqueue("report:run", job{Seq: 0, Work: 300 * time.Millisecond}) // finishes within the timeout
	h.enqueue("report:run", job{Seq: 1, Work: time.Hour})              // does not
	for i := 2; i < 6; i++ {
		h.enqueue("report:run", job{Seq: i, Work: time.Millisecond})
	}
	cfg := h.cfg
	cfg.Handlers, cfg.ShutdownTimeout = h.obs.mux(t, "report:run"), time.Second
	r, err := queues.NewClient(h.redis.Client, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	testwait.For(t, 10*time.Second, "two jobs to start", func() bool { _, s, _ := h.obs.snapshot(); return len(s) == 2 })

	began := time.Now()
	require.NoError(t, r.Stop(context.Background()))
	took := time.Since(began)
	require.NoError(t, r.Stop(context.Background()), "Stop is idempotent")
	require.Less(t, took, 10*time.Second)
	select {
	case <-r.Stopped():
	default:
		t.Fatal("Stopped is closed once Stop has returned nil")
	}

	_, starts, done := h.obs.snapshot()
	require.Len(t, starts, 2, "no new job starts once shutdown begins")
	require.Equal(t, 1, done["batch"], "the short in-flight job finished")

	q := h.client.Pools()[0].Queues()[2] // adhoc, the default tier
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

func TestLifecycle(t *testing.T) {
	t.Parallel()
	h := newHarness(t, pool("order", 1, "order:create"))
	cfg := h.cfg
	cfg.Handlers = h.obs.mux(t, "order:create")

	r, err := queues.NewClient(h.redis.Client, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Stop(context.Background()), "Stop before Start is safe")
	<-r.Stopped()
	require.ErrorIs(t, r.Start(context.Background()), queues.ErrStopped)

	r, err = queues.NewClient(h.redis.Client, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	require.EqualError(t, r.Start(context.Background()), "queues: Start: already started")
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { require.NoError(t, r.Stop(context.Background())) })
	}
	wg.Wait()
	<-r.Stopped()

	// A client without handlers enqueues but cannot run.
	require.EqualError(t, h.client.Start(context.Background()), "queues: Start: the client has no Handlers (Config.Handlers); it can only enqueue")
	require.NoError(t, h.client.Stop(context.Background()))
	<-h.client.Stopped()
}

// Stop is bounded by its context: with a job that outlives the context,
// Stop returns the context's error, and the stop completes in the
// background within the shutdown timeout.
func TestStopBoundedByContext(t *testing.T) {
	t.Parallel()
	h := newHarness(t, pool("order", 1, "order:create"))
	cfg := h.cfg
	cfg.Handlers, cfg.ShutdownTimeout = h.obs.mux(t, "order:create"), 2*time.Second
	r, err := queues.NewClient(h.redis.Client, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	h.enqueue("order:create", job{Seq: 1, Work: time.Hour})
	testwait.For(t, 10*time.Second, "the job to start", func() bool { _, s, _ := h.obs.snapshot(); return len(s) == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, r.Stop(ctx), context.DeadlineExceeded)
	select {
	case <-r.Stopped():
		t.Fatal("the stop cannot be complete while the job still has its shutdown timeout")
	default:
	}
	select {
	case <-r.Stopped():
	case <-time.After(30 * time.Second):
		t.Fatal("the stop did not complete after the shutdown timeout")
	}
}

// Start's context bounds the start: a cancelled one starts nothing.
func TestStartHonoursItsContext(t *testing.T) {
	t.Parallel()
	h := newHarness(t, pool("order", 1, "order:create"))
	cfg := h.cfg
	cfg.Handlers = h.obs.mux(t, "order:create")
	r, err := queues.NewClient(h.redis.Client, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, r.Start(ctx), context.Canceled)
	require.NoError(t, r.Stop(context.Background()))
}

func TestClientRouting(t *testing.T) {
	t.Parallel()
	h := newHarness(t, pool("order", 1, "order:create"), pool("batch", 1, "report:run", "adhoc", "regulatory"))
	ctx := context.Background()
	ns := h.cfg.Namespace

	res, err := h.client.Enqueue(ctx, "report:run", []byte(`{}`), queues.EnqueueOptions{Tier: "regulatory"})
	require.NoError(t, err)
	require.Equal(t, ns+":batch:regulatory", res.Queue)
	require.Equal(t, "regulatory", res.Tier)
	require.Equal(t, queues.Enqueued, res.Outcome)

	res, err = h.client.Enqueue(ctx, "report:run", []byte(`{}`), queues.EnqueueOptions{})
	require.NoError(t, err)
	require.Equal(t, ns+":batch:adhoc", res.Queue, "no tier means the default tier")

	res, err = h.client.Enqueue(ctx, "order:create", []byte(`{}`), queues.EnqueueOptions{})
	require.NoError(t, err)
	require.Equal(t, ns+":order", res.Queue)
	info, err := h.insp.GetTaskInfo(res.Queue, res.ID)
	require.NoError(t, err)
	require.Equal(t, queues.DefaultMaxRetry+queues.CrashRetries, info.MaxRetry, "room for crashes on top of max_retry")
	require.Equal(t, queues.DefaultJobTimeout, info.Timeout)

	for _, tc := range []struct {
		name    string
		jobType string
		tier    string
		want    string
	}{
		{"tier the pool does not serve", "report:run", "close", `invalid enqueue request: pool "batch" does not serve tier "close" (its tiers: ["regulatory" "adhoc"]); nothing was enqueued`},
		{"tier for a pool without tiers", "order:create", "adhoc", `invalid enqueue request: pool "order" has no tiers; got tier "adhoc"; nothing was enqueued`},
		{"job type routed to no pool", "refund:issue", "", `invalid enqueue request: job type "refund:issue" is routed to no pool (pools: ["order" "batch"]); nothing was enqueued`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.client.Enqueue(ctx, tc.jobType, nil, queues.EnqueueOptions{Tier: tc.tier})
			require.ErrorIs(t, err, queues.ErrInvalidRequest)
			require.EqualError(t, err, tc.want)
		})
	}

	p, err := h.client.Route("order:create")
	require.NoError(t, err)
	require.Equal(t, "order", p.Name())
	require.Equal(t, 1, p.Bulkhead().MaxConcurrent())
	_, err = h.client.Pool("bad")
	require.EqualError(t, err, `unknown pool "bad" (pools: ["order" "batch"])`)
	// Every method given a pool name says ErrUnknownPool for one the
	// config does not have.
	for name, call := range map[string]func() error{
		"Pool":       func() error { _, err := h.client.Pool("bad"); return err },
		"PausePool":  func() error { return h.client.PausePool(ctx, "bad") },
		"ResumePool": func() error { return h.client.ResumePool(ctx, "bad") },
		"PoolSize":   func() error { _, err := h.client.PoolSize(ctx, "bad"); return err },
		"Resize":     func() error { return h.client.Resize(ctx, "bad", 2) },
		"ResetSize":  func() error { return h.client.ResetSize(ctx, "bad") },
		"DoorStats":  func() error { _, err := h.client.DoorStats(ctx, "bad"); return err },
		"Breaker":    func() error { _, err := h.client.Breaker(ctx, "bad"); return err },
	} {
		require.ErrorIs(t, call(), queues.ErrUnknownPool, name)
	}
}

// TestUniqueIDAcrossTiers: a job ID is unique in its pool whatever the
// tier: a second enqueue while the first is queued adds nothing, and says
// where the first is; once it has finished, it is replaced.
func TestUniqueIDAcrossTiers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, pool("batch", 1, "report:run", "adhoc", "regulatory", "close"))
	ctx := context.Background()
	first, err := h.client.Enqueue(ctx, "report:run", []byte(`{}`), queues.EnqueueOptions{ID: "vat-2026-10", Tier: "close", Retention: time.Hour})
	require.NoError(t, err)
	require.Equal(t, queues.Enqueued, first.Outcome)
	for _, tier := range []string{"close", "regulatory", ""} {
		again, err := h.client.Enqueue(ctx, "report:run", []byte(`{}`), queues.EnqueueOptions{ID: "vat-2026-10", Tier: tier})
		require.NoError(t, err)
		require.Equal(t, queues.Duplicate, again.Outcome, "tier %q", tier)
		require.Equal(t, first.Queue, again.Queue, "the duplicate names where the job already is")
		require.Equal(t, "close", again.Tier)
	}

	// Twelve clients at once, each in another tier: one job.
	var wg sync.WaitGroup
	outcomes := make([]queues.EnqueueOutcome, 12)
	tiers := []string{"adhoc", "regulatory", "close"}
	for i := range outcomes {
		wg.Go(func() {
			c, err := queues.NewClient(h.redis.Client, h.cfg)
			require.NoError(t, err)
			r, err := c.Enqueue(ctx, "report:run", []byte(`{}`), queues.EnqueueOptions{ID: "ar-2026-08", Tier: tiers[i%3]})
			require.NoError(t, err)
			outcomes[i] = r.Outcome
		})
	}
	wg.Wait()
	added := 0
	for _, o := range outcomes {
		if o == queues.Enqueued {
			added++
		}
	}
	require.Equal(t, 1, added, "exactly one of twelve concurrent enqueues adds the job: %v", outcomes)

	// A batch with the same ID twice adds it once.
	res, err := h.client.EnqueueMany(ctx, []queues.Request{
		{JobType: "report:run", Options: queues.EnqueueOptions{ID: "tb-2026-10"}},
		{JobType: "report:run", Options: queues.EnqueueOptions{ID: "tb-2026-10", Tier: "regulatory"}},
	})
	require.NoError(t, err)
	require.Equal(t, []queues.EnqueueOutcome{queues.Enqueued, queues.Duplicate}, []queues.EnqueueOutcome{res[0].Outcome, res[1].Outcome})

	// Once the first has finished, the ID runs again.
	h.run(h.obs.mux(t, "report:run"))
	testwait.For(t, 30*time.Second, "the first job to complete", func() bool {
		info, err := h.insp.GetTaskInfo(first.Queue, first.ID)
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	again, err := h.client.Enqueue(ctx, "report:run", []byte(`{}`), queues.EnqueueOptions{ID: "vat-2026-10", Tier: "regulatory"})
	require.NoError(t, err)
	require.Equal(t, queues.Replaced, again.Outcome)
	require.Equal(t, h.cfg.Namespace+":batch:regulatory", again.Queue)
}

// TestEnqueueManyRefusesInvalidBatch: one bad request means nothing of the
// batch is enqueued, and every problem is named.
func TestEnqueueManyRefusesInvalidBatch(t *testing.T) {
	t.Parallel()
	h := newHarness(t, pool("batch", 1, "report:run", "adhoc", "regulatory"))
	_, err := h.client.EnqueueMany(context.Background(), []queues.Request{
		{JobType: "report:run"},
		{JobType: "report:run", Options: queues.EnqueueOptions{Tier: "urgent"}},
		{JobType: "refund:issue"},
	})
	require.ErrorIs(t, err, queues.ErrInvalidRequest)
	require.ErrorContains(t, err, `pool "batch" does not serve tier "urgent"`)
	require.ErrorContains(t, err, `job type "refund:issue" is routed to no pool`)
	for _, q := range h.client.Pools()[0].Queues() {
		_, err := h.insp.GetQueueInfo(q)
		require.Error(t, err, "queue %s was never written to", q)
	}
}

// TestMaxRetryCountsFailuresNotCrashes: a job that keeps failing runs
// 1 + max_retry times and is then archived with the count in its reason;
// a job that fails once and then succeeds leaves no counter behind.
func TestMaxRetryCountsFailures(t *testing.T) {
	t.Parallel()
	pc := pool("order", 2, "order:create")
	pc.MaxRetry = 2
	h := newHarness(t, pc)
	var mu sync.Mutex
	runs := map[string]int{}
	mux := queues.NewHandlers()
	mux.HandleFunc("order:create", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		runs[id]++
		n := runs[id]
		mu.Unlock()
		if string(task.Payload()) == "flaky" && n > 1 {
			return nil
		}
		return errors.New("database unavailable")
	})
	h.cfg.RetryDelay = func(int, error) time.Duration { return 10 * time.Millisecond }
	h.cfg.DelayedCheckInterval = 50 * time.Millisecond
	h.run(mux)

	ctx := context.Background()
	broken, err := h.client.Enqueue(ctx, "order:create", []byte("broken"), queues.EnqueueOptions{Retention: time.Hour})
	require.NoError(t, err)
	flaky, err := h.client.Enqueue(ctx, "order:create", []byte("flaky"), queues.EnqueueOptions{Retention: time.Hour})
	require.NoError(t, err)

	var info *asynq.TaskInfo
	testwait.For(t, 60*time.Second, "the broken job to be archived", func() bool {
		info, err = h.insp.GetTaskInfo(broken.Queue, broken.ID)
		return err == nil && info.State == asynq.TaskStateArchived
	})
	require.Contains(t, info.LastErr, "failed more times than max_retry allows (3 failures, max_retry 2): database unavailable")
	testwait.For(t, 60*time.Second, "the flaky job to complete", func() bool {
		info, err = h.insp.GetTaskInfo(flaky.Queue, flaky.ID)
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	mu.Lock()
	require.Equal(t, 3, runs[broken.ID], "1 run + max_retry 2 retries")
	require.Equal(t, 2, runs[flaky.ID])
	mu.Unlock()
	n, err := h.redis.Client.Exists(ctx, h.cfg.Namespace+":failures:"+flaky.Queue+":"+flaky.ID, h.cfg.Namespace+":failures:"+broken.Queue+":"+broken.ID).Result()
	require.NoError(t, err)
	require.Zero(t, n, "failure counters are removed once a job is done")
}

// TestDequeueLoopsKeepThePoolsSize: a process-scoped pool of 4 with three
// dequeue loops (asynq servers) takes its jobs through all of them and
// still never runs more than 4 at once; the bulkhead turns nothing away, so
// the loops split the pool's workers rather than each having all of them.
func TestDequeueLoopsKeepThePoolsSize(t *testing.T) {
	pc := pool("order", 4, "order:create")
	pc.Scope, pc.DequeueLoops = queues.ScopeProcess, 3
	h := newHarness(t, pc)
	const jobs = 200
	for i := range jobs {
		h.enqueue("order:create", job{Seq: i, Work: 5 * time.Millisecond})
	}
	r := h.run(h.obs.mux(t, "order:create"))
	h.obs.waitDone(t, "order", jobs, time.Minute)
	peak, starts, done := h.obs.snapshot()
	require.LessOrEqual(t, peak["order"], 4, "the pool ran more jobs at once than its size")
	require.Equal(t, 4, peak["order"], "the pool never filled up")
	require.Equal(t, jobs, done["order"])
	require.Len(t, starts, jobs, "each job started exactly once")
	s := r.Pools()[0].Bulkhead().Stats()
	require.Zero(t, s.Rejected, "the loops' workers together are the pool's size: the bulkhead turns nothing away")
	require.Equal(t, uint64(jobs), s.Accepted)
}
