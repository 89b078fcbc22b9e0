package queues_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// batchPool is a tiered pool with a door.
func batchPool(max int, tierLimits map[string]int) queues.PoolConfig {
	return queues.PoolConfig{
		Name: "batch", Size: 2, JobTypes: []string{"report"}, Tiers: []string{"regulatory", "close", "adhoc"},
		MaxBacklog: max, TierLimits: tierLimits, PollInterval: 20 * time.Millisecond,
	}
}

// backlog counts a pool's jobs pending, scheduled or waiting for a retry,
// from asynq's own view of the queues.
func (h *harness) backlog(pool string) int {
	h.t.Helper()
	p, err := h.client.Pool(pool)
	require.NoError(h.t, err)
	ctx, n := context.Background(), int64(0)
	for _, q := range p.Queues() {
		n += h.redis.Client.LLen(ctx, "asynq:{"+q+"}:pending").Val() +
			h.redis.Client.ZCard(ctx, "asynq:{"+q+"}:scheduled").Val() +
			h.redis.Client.ZCard(ctx, "asynq:{"+q+"}:retry").Val()
	}
	return int(n)
}

func (h *harness) enqueueTier(tier string, o queues.EnqueueOptions) (queues.EnqueueResult, error) {
	o.Tier = tier
	return h.client.Enqueue(context.Background(), "report", []byte(`{}`), o)
}

// A job written by the door is the job asynq would have written: asynq's
// inspector reads back the same fields, and a worker runs it.
func TestDoorWritesAsynqJobs(t *testing.T) {
	t.Parallel()
	plain := queues.PoolConfig{Name: "plain", Size: 1, JobTypes: []string{"plain"}, JobTimeout: 90 * time.Second, MaxRetry: 4}
	door := queues.PoolConfig{Name: "door", Size: 1, JobTypes: []string{"door"}, JobTimeout: 90 * time.Second, MaxRetry: 4, MaxBacklog: 10, PollInterval: 20 * time.Millisecond}
	h := newHarness(t, plain, door)
	ctx := context.Background()
	opts := queues.EnqueueOptions{ID: "same-id", Retention: time.Hour}
	_, err := h.client.Enqueue(ctx, "plain", []byte("payload"), opts)
	require.NoError(t, err)
	res, err := h.client.Enqueue(ctx, "door", []byte("payload"), opts)
	require.NoError(t, err)
	require.Equal(t, queues.Enqueued, res.Outcome)

	want, err := h.insp.GetTaskInfo(queues.QueueName(h.cfg.Namespace, "plain", ""), "same-id")
	require.NoError(t, err)
	got, err := h.insp.GetTaskInfo(queues.QueueName(h.cfg.Namespace, "door", ""), "same-id")
	require.NoError(t, err)
	require.Equal(t, "door", got.Type)
	require.Equal(t, want.Payload, got.Payload)
	require.Equal(t, want.State, got.State)
	require.Equal(t, want.MaxRetry, got.MaxRetry)
	require.Equal(t, want.Timeout, got.Timeout)
	require.Equal(t, want.Retention, got.Retention)
	require.Equal(t, want.Deadline, got.Deadline)
	require.Equal(t, queues.QueueName(h.cfg.Namespace, "door", ""), got.Queue)
	require.NotEmpty(t, want.Headers, "the client stamps its jobs")
	require.Equal(t, slices.Sorted(maps.Keys(want.Headers)), slices.Sorted(maps.Keys(got.Headers)))

	// A scheduled one too, and a random ID when none is given.
	res, err = h.client.Enqueue(ctx, "door", []byte("later"), queues.EnqueueOptions{ProcessIn: time.Hour})
	require.NoError(t, err)
	require.NotEmpty(t, res.ID)
	later, err := h.insp.GetTaskInfo(res.Queue, res.ID)
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateScheduled, later.State)
	require.WithinDuration(t, time.Now().Add(time.Hour), later.NextProcessAt, 2*time.Second)

	var ran sync.Map
	handlers := queues.NewHandlers()
	handlers.Handle("plain", asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	handlers.Handle("door", asynq.HandlerFunc(func(_ context.Context, task *asynq.Task) error {
		ran.Store(string(task.Payload()), true)
		return nil
	}))
	h.run(handlers)
	testwait.For(t, 10*time.Second, "the door's job to run", func() bool {
		_, ok := ran.Load("payload")
		return ok
	})
	// Kept for its retention, as asked.
	testwait.For(t, 10*time.Second, "the job to be completed", func() bool {
		info, err := h.insp.GetTaskInfo(res.Queue, "same-id")
		return err == nil && info.State == asynq.TaskStateCompleted
	})
}

// A tier is admitted only while the pool's backlog is under the tier's
// limit: lower tiers are refused first, higher ones still get in, and the
// refusal is the error a caller matches and reads.
func TestBacklogLimitsByTier(t *testing.T) {
	t.Parallel()
	h := newHarness(t, batchPool(10, map[string]int{"adhoc": 6, "close": 8}))
	for range 6 {
		_, err := h.enqueueTier("adhoc", queues.EnqueueOptions{})
		require.NoError(t, err)
	}
	_, err := h.enqueueTier("adhoc", queues.EnqueueOptions{})
	require.ErrorIs(t, err, queues.ErrBacklogFull)
	require.ErrorIs(t, err, queues.ErrRefused)
	require.EqualError(t, err, `pool "batch" is full for tier "adhoc": backlog 6/6; nothing was enqueued`)
	var be *queues.BacklogError
	require.ErrorAs(t, err, &be)
	require.Equal(t, "batch", be.Pool)
	require.Equal(t, "adhoc", be.Tier)
	require.Equal(t, 6, be.Backlog)
	require.Equal(t, 6, be.Limit)

	for range 2 {
		_, err := h.enqueueTier("close", queues.EnqueueOptions{})
		require.NoError(t, err)
	}
	_, err = h.enqueueTier("close", queues.EnqueueOptions{})
	require.EqualError(t, err, `pool "batch" is full for tier "close": backlog 8/8; nothing was enqueued`)
	for range 2 {
		_, err := h.enqueueTier("regulatory", queues.EnqueueOptions{})
		require.NoError(t, err)
	}
	_, err = h.enqueueTier("regulatory", queues.EnqueueOptions{})
	require.EqualError(t, err, `pool "batch" is full for tier "regulatory": backlog 10/10; nothing was enqueued`)
	require.Equal(t, 10, h.backlog("batch"))

	// A duplicate adds nothing, so it is not refused.
	_, err = h.enqueueTier("regulatory", queues.EnqueueOptions{ID: "dup"})
	require.ErrorIs(t, err, queues.ErrBacklogFull)

	// Scheduled jobs and retries count; a scheduled one is refused alike.
	_, err = h.enqueueTier("regulatory", queues.EnqueueOptions{ProcessIn: time.Hour})
	require.ErrorIs(t, err, queues.ErrBacklogFull)
}

// With 64 producers enqueuing at once, the backlog, watched from outside
// all along, never passes the limit, and exactly the limit is admitted.
func TestBacklogLimitHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	const limit, producers = 100, 64
	h := newHarness(t, batchPool(limit, map[string]int{"adhoc": 60}))
	p, err := h.client.Pool("batch")
	require.NoError(t, err)

	var admitted, refused, other atomic.Int64
	var refusalsMu sync.Mutex
	var refusals []*queues.BacklogError
	peak := h.watchPending(p, nil)
	// Two clients, as two services would be: one client shares its Redis
	// calls among its producers, and the two race each other.
	second, err := queues.NewClient(h.redis.Client, h.cfg)
	require.NoError(t, err)
	clients := []*queues.Client{h.client, second}
	var wg sync.WaitGroup
	tiers := []string{"regulatory", "close", "adhoc"}
	for w := range producers {
		wg.Go(func() {
			for k := range 5 {
				_, err := clients[w%2].Enqueue(context.Background(), "report", []byte(`{}`), queues.EnqueueOptions{Tier: tiers[(w+k)%3]})
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.Is(err, queues.ErrBacklogFull):
					refused.Add(1)
					var be *queues.BacklogError
					if errors.As(err, &be) {
						refusalsMu.Lock()
						refusals = append(refusals, be)
						refusalsMu.Unlock()
					}
				default:
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, other.Load())
	// Every refusal names a backlog at its tier's limit: a request refused
	// with room left would say so here.
	require.Len(t, refusals, int(refused.Load()), "every refusal is a *BacklogError")
	for _, be := range refusals {
		require.GreaterOrEqual(t, be.Backlog, be.Limit, "refused with room: %v", be)
	}
	require.Equal(t, int64(limit), admitted.Load())
	require.Equal(t, int64(producers*5-limit), refused.Load())
	require.LessOrEqual(t, peak(), limit)
	require.Equal(t, limit, h.backlog("batch"))
	// The ad-hoc tier never passed its own limit either.
	adhoc, err := h.insp.GetQueueInfo(queues.QueueName(h.cfg.Namespace, "batch", "adhoc"))
	require.NoError(t, err)
	require.LessOrEqual(t, adhoc.Pending, 60)
}

// watchPending reads the pool's pending lists all along, from outside the
// door, calling tick (if not nil) after each read. The function it returns
// stops the reads and returns the most jobs they saw pending at once.
func (h *harness) watchPending(p *queues.Pool, tick func(i int)) (stop func() int) {
	h.t.Helper()
	var peak int64
	done, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		for i := 0; ; i++ {
			n := int64(0)
			for _, q := range p.Queues() {
				n += h.redis.Client.LLen(context.Background(), "asynq:{"+q+"}:pending").Val()
			}
			peak = max(peak, n)
			if tick != nil {
				tick(i)
			}
			select {
			case <-done:
				return
			default:
			}
		}
	}()
	return func() int {
		close(done)
		<-watched
		return int(peak)
	}
}

// keysSnapshot reads every key of the namespace's queues and every key of
// ours, but the refusal counts (a refusal counts itself).
func (h *harness) keysSnapshot() map[string]string {
	h.t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, pattern := range queues.NamespaceKeyPatterns(h.cfg.Namespace) {
		keys, err := h.redis.Client.Keys(ctx, pattern).Result()
		require.NoError(h.t, err)
		for _, k := range keys {
			if strings.HasSuffix(k, ":refused") {
				continue
			}
			var v any
			var err error
			switch h.redis.Client.Type(ctx, k).Val() {
			case "string":
				v, err = h.redis.Client.Get(ctx, k).Result()
			case "list":
				v, err = h.redis.Client.LRange(ctx, k, 0, -1).Result()
			case "set":
				v, err = h.redis.Client.SMembers(ctx, k).Result()
			case "zset":
				v, err = h.redis.Client.ZRangeWithScores(ctx, k, 0, -1).Result()
			case "hash":
				v, err = h.redis.Client.HGetAll(ctx, k).Result()
			}
			require.NoError(h.t, err)
			out[k] = fmt.Sprint(v)
		}
	}
	return out
}

// A plan that does not fit is refused whole: Redis is left as it was, even
// the finished job it would have replaced, and the refusal says the room
// and the need of each tier.
func TestRefusedPlanChangesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, batchPool(10, map[string]int{"adhoc": 6}))
	ctx := context.Background()
	for range 4 {
		_, err := h.enqueueTier("close", queues.EnqueueOptions{})
		require.NoError(t, err)
	}
	// A finished job the plan would replace.
	res, err := h.enqueueTier("adhoc", queues.EnqueueOptions{ID: "old"})
	require.NoError(t, err)
	require.NoError(t, h.insp.ArchiveTask(res.Queue, "old"))

	plan := []queues.Request{
		{JobType: "report", Payload: []byte(`{}`), Options: queues.EnqueueOptions{Tier: "regulatory", ID: "r1"}},
		{JobType: "report", Payload: []byte(`{}`), Options: queues.EnqueueOptions{Tier: "regulatory", ID: "r2"}},
		{JobType: "report", Payload: []byte(`{}`), Options: queues.EnqueueOptions{Tier: "adhoc", ID: "old"}},
		{JobType: "report", Payload: []byte(`{}`), Options: queues.EnqueueOptions{Tier: "adhoc", ID: "a2"}},
	}
	before := h.keysSnapshot()
	_, err = h.client.EnqueueMany(ctx, plan)
	require.ErrorIs(t, err, queues.ErrBacklogFull)
	require.EqualError(t, err, `pool "batch" is full for tier "adhoc": backlog 4/6; the request needs 4 (regulatory: room 6, needs 2; adhoc: room 0, needs 2); nothing was enqueued`)
	var be *queues.BacklogError
	require.ErrorAs(t, err, &be)
	require.Equal(t, []queues.TierRoom{
		{Tier: "regulatory", Limit: 10, Room: 6, Need: 2},
		{Tier: "adhoc", Limit: 6, Room: 0, Need: 2},
	}, be.Tiers)
	require.Equal(t, before, h.keysSnapshot())

	// Without the ad-hoc ones it fits, and is written whole.
	out, err := h.client.EnqueueMany(ctx, plan[:2])
	require.NoError(t, err)
	require.Len(t, out, 2)
	require.Equal(t, 6, h.backlog("batch"))

	// The archived job is replaced by the door in the same step.
	_, err = h.client.EnqueueMany(ctx, plan[:3])
	require.ErrorIs(t, err, queues.ErrBacklogFull) // adhoc: backlog 6/6
	_, err = h.enqueueTier("regulatory", queues.EnqueueOptions{ID: "old"})
	require.NoError(t, err)
	info, err := h.insp.GetTaskInfo(queues.QueueName(h.cfg.Namespace, "batch", "regulatory"), "old")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State)
	_, err = h.insp.GetTaskInfo(res.Queue, "old")
	require.ErrorIs(t, err, asynq.ErrTaskNotFound)
}

// With backlog_wait, a refused request waits for room, first come first
// served, and is refused when the wait is over.
func TestBacklogWaitFirstComeFirstServed(t *testing.T) {
	t.Parallel()
	pc := batchPool(3, nil)
	pc.BacklogWait = 20 * time.Second
	h := newHarness(t, pc)
	ctx := context.Background()
	var ids []string
	for range 3 {
		res, err := h.enqueueTier("close", queues.EnqueueOptions{})
		require.NoError(t, err)
		ids = append(ids, res.ID)
	}
	waiting := h.cfg.Namespace + ":door:batch:waiting"
	admitted := make(chan string, 2)
	errs := make(chan error, 2)
	for _, name := range []string{"first", "second"} {
		go func() {
			_, err := h.enqueueTier("adhoc", queues.EnqueueOptions{ID: name})
			if err != nil {
				errs <- err
				return
			}
			admitted <- name
		}()
		want := map[string]int64{"first": 1, "second": 2}[name]
		testwait.For(t, 10*time.Second, name+" to wait in line", func() bool {
			return h.redis.Client.ZCard(ctx, waiting).Val() == want
		})
	}
	q := queues.QueueName(h.cfg.Namespace, "batch", "close")
	require.NoError(t, h.insp.DeleteTask(q, ids[0])) // room for one
	select {
	case got := <-admitted:
		require.Equal(t, "first", got)
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter was admitted")
	}
	require.Equal(t, 3, h.backlog("batch"))
	require.NoError(t, h.insp.DeleteTask(q, ids[1]))
	select {
	case got := <-admitted:
		require.Equal(t, "second", got)
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("the second waiter was not admitted")
	}
	require.Zero(t, h.redis.Client.ZCard(ctx, waiting).Val())

	// A wait that ends without room is a refusal that says it waited.
	short := batchPool(1, nil)
	short.BacklogWait = 200 * time.Millisecond
	h2 := newHarness(t, short)
	_, err := h2.enqueueTier("close", queues.EnqueueOptions{})
	require.NoError(t, err)
	_, err = h2.enqueueTier("close", queues.EnqueueOptions{})
	var be *queues.BacklogError
	require.ErrorAs(t, err, &be)
	require.GreaterOrEqual(t, be.Waited, 200*time.Millisecond)
	require.Contains(t, err.Error(), "; waited ")
	require.Zero(t, h2.redis.Client.ZCard(ctx, h2.cfg.Namespace+":door:batch:waiting").Val())
}

// Enqueue rates: per pool, per job type and per caller key, shared by
// every client; a refusal says when to retry and consumes nothing.
func TestEnqueueRates(t *testing.T) {
	t.Parallel()
	pc := queues.PoolConfig{
		Name: "search", Size: 1, JobTypes: []string{"search", "suggest"},
		EnqueueRate:       &queues.Rate{Limit: 6, Per: time.Hour},
		JobTypeRates:      map[string]queues.Rate{"suggest": {Limit: 2, Per: time.Hour}},
		EnqueueRatePerKey: &queues.Rate{Limit: 3, Per: time.Hour, Burst: 3},
	}
	h := newHarness(t, pc)
	other, err := queues.NewClient(h.redis.Client, h.cfg) // a second producer
	require.NoError(t, err)
	ctx := context.Background()
	enq := func(c *queues.Client, jobType, key string) error {
		_, err := c.Enqueue(ctx, jobType, nil, queues.EnqueueOptions{RateKey: key})
		return err
	}
	require.NoError(t, enq(h.client, "suggest", ""))
	require.NoError(t, enq(other, "suggest", ""))
	err = enq(h.client, "suggest", "")
	var re *queues.RateLimitError
	require.ErrorAs(t, err, &re)
	require.ErrorIs(t, err, queues.ErrRateLimited)
	require.ErrorIs(t, err, queues.ErrRefused)
	require.Equal(t, "job_type_rates", re.Limit)
	require.Equal(t, "suggest", re.JobType)
	require.InDelta(t, 30*time.Minute, re.RetryAfter, float64(2*time.Second))
	require.Regexp(t, `^pool "search": job_type_rates of job type "suggest" 2 per 1h0m0s \(burst 2\) reached; retry after (29m5\d(\.\d+)?s|30m0s); nothing was enqueued$`, err.Error())

	// Per key: tenant-a has 3, tenant-b its own 3, but the pool only 6 in
	// all, of which 2 went to suggest (the refused one took nothing).
	for range 3 {
		require.NoError(t, enq(h.client, "search", "tenant-a"))
	}
	err = enq(other, "search", "tenant-a")
	require.ErrorAs(t, err, &re)
	require.Equal(t, "enqueue_rate_per_key", re.Limit)
	require.Equal(t, "tenant-a", re.Key)
	require.NoError(t, enq(h.client, "search", "tenant-b"))
	err = enq(h.client, "search", "tenant-b")
	require.ErrorAs(t, err, &re)
	require.Equal(t, "enqueue_rate", re.Limit)
	require.InDelta(t, 10*time.Minute, re.RetryAfter, float64(2*time.Second))

	// A batch larger than a burst can never pass, and says so.
	many := make([]queues.Request, 4)
	for i := range many {
		many[i] = queues.Request{JobType: "search", Options: queues.EnqueueOptions{RateKey: "tenant-c"}}
	}
	_, err = h.client.EnqueueMany(ctx, many)
	require.EqualError(t, err, `pool "search": enqueue_rate_per_key for key "tenant-c" 3 per 1h0m0s (burst 3): the request brings 4 jobs, more than the burst: it can never pass; split it; nothing was enqueued`)

	info, err := h.insp.GetQueueInfo(queues.QueueName(h.cfg.Namespace, "search", ""))
	require.NoError(t, err)
	require.Equal(t, 6, info.Pending)

	// A bad key is bad input.
	_, err = h.client.Enqueue(ctx, "search", nil, queues.EnqueueOptions{RateKey: "a\nb"})
	require.ErrorIs(t, err, queues.ErrInvalidRequest)
}

// Every bad door setting is named.
func TestDoorConfigProblems(t *testing.T) {
	t.Parallel()
	pc := batchPool(-1, map[string]int{"adhoc": 0, "nope": 3})
	pc.BacklogWait = time.Minute
	pc.Scope = queues.ScopeProcess
	pc.EnqueueRate = &queues.Rate{Limit: 0, Per: 0}
	pc.EnqueueRatePerKey = &queues.Rate{Limit: 1, Per: time.Second, Burst: -1}
	pc.JobTypeRates = map[string]queues.Rate{"other": {Limit: 1, Per: time.Second}}
	pc.StartRate = &queues.Rate{Limit: 1, Per: time.Second}
	big := batchPool(5, map[string]int{"close": 6})
	big.Name = "big"
	big.JobTypes = []string{"big"}
	err := queues.Config{Tiers: testPolicy(t), Pools: []queues.PoolConfig{pc, big}}.Validate()
	require.Error(t, err)
	var ce *queues.ConfigError
	require.ErrorAs(t, err, &ce)
	got := strings.Join(ce.Problems, "\n")
	for _, want := range []string{
		`pool "batch": max_backlog must be >= 0 (0: unbounded), got -1`,
		`pool "batch": tier_limits need max_backlog`,
		`pool "batch": tier_limits: tier "adhoc" must be >= 1, got 0`,
		`pool "batch": tier_limits: tier "nope" is not one of the pool's tiers`,
		`pool "batch": backlog_wait must be at most 30s, got 1m0s`,
		`pool "batch": enqueue_rate: limit must be >= 1, got 0`,
		`pool "batch": enqueue_rate: per must be at least 1ms, got 0s`,
		`pool "batch": enqueue_rate_per_key: burst must be >= 1, got -1`,
		`pool "batch": job_type_rates: job type "other" is not routed to this pool`,
		`pool "batch": start_rate needs scope: cluster`,
		`pool "big": tier_limits: tier "close" limit 6 is above the pool's max_backlog 5`,
	} {
		require.Contains(t, got, want)
	}
}

// The door admits by a running bound of the backlog and counts exactly
// only when a request would not fit under it. Jobs that were running at
// the count can come back as retries without passing the door: the bound
// counts them, so the door still refuses once the backlog, retries
// included, is at the limit.
func TestBacklogBoundCountsRunningJobs(t *testing.T) {
	t.Parallel()
	pc := batchPool(10, nil)
	pc.MaxRetry = 3
	// A per-process pool, so that exactly the two running jobs leave the
	// queue: a cluster-scoped one may also take a third ahead of a slot
	// (its look-ahead, docs/CLUSTER.md), which leaves the backlog just as
	// a running job does and is counted by the bound the same way.
	pc.Scope = queues.ScopeProcess
	h := newHarness(t, pc)
	queues.SetBacklogRecount(h.client, time.Hour) // no count but the one forced below
	ctx := context.Background()
	for range 6 {
		_, err := h.enqueueTier("close", queues.EnqueueOptions{})
		require.NoError(t, err)
	}
	// Two of them start and hold their slots (the pool's size is 2), then
	// fail: they come back as retries.
	var started atomic.Int32
	release := make(chan struct{})
	handlers := queues.NewHandlers()
	handlers.HandleFunc("report", func(ctx context.Context, _ *asynq.Task) error {
		started.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return errors.New("downstream failed")
	})
	h.run(handlers)
	testwait.For(t, 10*time.Second, "two jobs to start", func() bool { return started.Load() == 2 })
	require.Equal(t, 4, h.backlog("batch"))

	// Five more do not fit under the bound (6 + 5 > 10), so the door counts:
	// 4 waiting, 2 running. They fit (4 + 5 <= 10) and the bound becomes 11.
	plan := make([]queues.Request, 5)
	for i := range plan {
		plan[i] = queues.Request{JobType: "report", Payload: []byte(`{}`), Options: queues.EnqueueOptions{Tier: "close"}}
	}
	_, err := h.client.EnqueueMany(ctx, plan)
	require.NoError(t, err)
	require.Equal(t, 9, h.backlog("batch"))

	// Nothing else starts; the two running ones fail and wait for a retry.
	require.NoError(t, h.client.PausePool(ctx, "batch"))
	close(release)
	testwait.For(t, 10*time.Second, "the two failed jobs to wait for a retry", func() bool { return h.backlog("batch") == 11 })

	// Counted without its running jobs the bound would be 9, and one more
	// job would pass under it to a backlog of 12.
	_, err = h.enqueueTier("regulatory", queues.EnqueueOptions{})
	require.EqualError(t, err, `pool "batch" is full for tier "regulatory": backlog 11/10; nothing was enqueued`)
	require.Equal(t, 11, h.backlog("batch"))
}

// An exact count resets the bound: the room that jobs leaving the backlog
// made is used again, up to the limit exactly, and the bound counts every
// job admitted since.
func TestBacklogBoundResetByCount(t *testing.T) {
	t.Parallel()
	h := newHarness(t, batchPool(5, nil))
	queues.SetBacklogRecount(h.client, time.Hour)
	fill := func() {
		t.Helper()
		for range 5 {
			_, err := h.enqueueTier("close", queues.EnqueueOptions{})
			require.NoError(t, err)
		}
		_, err := h.enqueueTier("close", queues.EnqueueOptions{})
		require.EqualError(t, err, `pool "batch" is full for tier "close": backlog 5/5; nothing was enqueued`)
		require.Equal(t, 5, h.backlog("batch"))
	}
	fill()
	// The jobs leave the backlog; the bound still says 5.
	n, err := h.insp.DeleteAllPendingTasks(queues.QueueName(h.cfg.Namespace, "batch", "close"))
	require.NoError(t, err)
	require.Equal(t, 5, n)
	fill()
}

// Jobs that enter the backlog without passing the door (asynq's own
// client here) are seen at the next exact count: at once when the bound
// may not be reused, after the recount interval otherwise. Until then the
// door may admit past the limit by at most those jobs, single jobs (the
// script's lean path) and batches alike.
func TestBacklogBoundRecountInterval(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		interval time.Duration
		batch    int // jobs per request
	}{
		{"bound expired: counted at once", 0, 1},
		{"bound fresh: the bypass is not seen yet", time.Hour, 1},
		{"bound fresh, a batch: the bypass is not seen yet", time.Hour, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, batchPool(5, nil))
			queues.SetBacklogRecount(h.client, tc.interval)
			for range 3 {
				_, err := h.enqueueTier("close", queues.EnqueueOptions{})
				require.NoError(t, err)
			}
			raw := asynq.NewClientFromRedisClient(h.redis.Client)
			for range 2 {
				_, err := raw.Enqueue(asynq.NewTask("report", nil), asynq.Queue(queues.QueueName(h.cfg.Namespace, "batch", "close")))
				require.NoError(t, err)
			}
			require.Equal(t, 5, h.backlog("batch"))
			req := queues.Request{JobType: "report", Payload: []byte(`{}`), Options: queues.EnqueueOptions{Tier: "close"}}
			enqueue := func() error {
				_, err := h.client.EnqueueMany(context.Background(), slices.Repeat([]queues.Request{req}, tc.batch))
				return err
			}
			if tc.interval == 0 {
				require.EqualError(t, enqueue(), `pool "batch" is full for tier "close": backlog 5/5; nothing was enqueued`)
				require.Equal(t, 5, h.backlog("batch"))
				return
			}
			// The bound knows only the door's 3: two more pass, one job past
			// the limit for each that bypassed the door. Then the bound is at
			// the limit, the door counts and refuses.
			for range 2 / tc.batch {
				require.NoError(t, enqueue())
			}
			require.Equal(t, 7, h.backlog("batch"))
			_, err := h.enqueueTier("close", queues.EnqueueOptions{})
			require.EqualError(t, err, `pool "batch" is full for tier "close": backlog 7/5; nothing was enqueued`)
		})
	}
}
