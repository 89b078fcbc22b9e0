package queues_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// slotErrors records every log line of the engine and of asynq that
// reports a Redis Cluster slot error: CROSSSLOT, a script touching a key
// of another node, or keys of one command on several slots.
type slotErrors struct {
	mu    sync.Mutex
	lines []string
}

func (h *slotErrors) Enabled(context.Context, slog.Level) bool { return true }
func (h *slotErrors) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *slotErrors) WithGroup(string) slog.Handler            { return h }
func (h *slotErrors) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	if isSlotError(b.String()) {
		h.mu.Lock()
		h.lines = append(h.lines, b.String())
		h.mu.Unlock()
	}
	return nil
}

func isSlotError(s string) bool {
	return strings.Contains(s, "CROSSSLOT") || strings.Contains(s, "non local key") ||
		strings.Contains(s, "hash to the same slot") || strings.Contains(s, "same slot")
}

func (h *slotErrors) check(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Empty(t, h.lines, "slot errors on the Redis Cluster")
}

// TestOnRedisCluster runs the engine on a Redis Cluster of 3 masters on
// loopback (redis-server; skipped without it): the cluster-wide cap,
// utilisation and tier order across three runners of a tiered pool, the
// door, unique IDs across pools, promote, resize and the breaker, with no
// slot error in any log line or returned error.
func TestOnRedisCluster(t *testing.T) {
	rc := testredis.StartCluster(t, 3)
	r := rc.Redis()
	logs := &slotErrors{}
	tiers := []string{"regulatory", "close", "adhoc"}
	newPool := func(t *testing.T, pc queues.PoolConfig) *cluster {
		c := newClusterPoolOn(t, r, pc)
		c.cfg.Logger = slog.New(logs)
		var err error
		c.client, err = queues.NewClient(r.Client, c.cfg)
		require.NoError(t, err)
		return c
	}
	defer logs.check(t)

	t.Run("the layout puts a pool's tiers on one slot", func(t *testing.T) {
		c := newPool(t, queues.PoolConfig{Size: 1, Tiers: tiers})
		p, err := c.client.Pool("batch")
		require.NoError(t, err)
		ns := c.cfg.Namespace
		require.Equal(t, []string{ns + ":batch}:regulatory", ns + ":batch}:close", ns + ":batch}:adhoc"}, p.Queues())
		var slots []int64
		for _, q := range p.Queues() {
			s, err := r.Client.ClusterKeySlot(context.Background(), "asynq:{"+q+"}:pending").Result()
			require.NoError(t, err)
			slots = append(slots, s)
		}
		own, err := r.Client.ClusterKeySlot(context.Background(), ns+":gate:{"+ns+":batch}:leases").Result()
		require.NoError(t, err)
		require.Equal(t, []int64{own, own, own}, slots)
	})

	t.Run("cap", func(t *testing.T) {
		c := newPool(t, queues.PoolConfig{Size: 4, Tiers: tiers, PollInterval: 10 * time.Millisecond})
		total := 2000
		if testing.Short() {
			total = 600
		}
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range total {
			c.enqueue(clusterJob{Seq: i, Tier: tiers[rng.IntN(3)], Work: 10 * time.Millisecond})
		}
		c.start(3)
		c.waitDone(total, 3*time.Minute)
		c.obs.mu.Lock()
		peak, violations := c.obs.peak, c.obs.violations
		c.obs.mu.Unlock()
		t.Logf("%d jobs of 3 tiers on 3 runners, pool of 4 on a 3-master cluster: peak %d, %d violations", total, peak, violations)
		require.Zero(t, violations, "more than 4 jobs ran at once across the runners")
		require.Equal(t, 4, peak, "the pool filled up")
		// asynq's Inspector reads every tier's queue on the cluster.
		insp := asynq.NewInspectorFromRedisClient(r.Client)
		testwait.For(t, 30*time.Second, "asynq to mark every job completed", func() bool {
			n := 0
			for _, tier := range tiers {
				p, _ := c.client.Pool("batch")
				q, _ := p.QueueFor(tier)
				info, err := insp.GetQueueInfo(q)
				require.NoError(t, err)
				n += info.Completed
			}
			return n == total
		})
	})

	t.Run("utilisation", func(t *testing.T) {
		c := newPool(t, queues.PoolConfig{Size: 4, Tiers: tiers, PollInterval: 10 * time.Millisecond})
		const jobs = 60
		for i := range jobs {
			c.enqueue(clusterJob{Seq: i, Tier: tiers[i%3], Work: 300 * time.Millisecond})
		}
		c.start(3)
		c.waitDone(jobs, 2*time.Minute)
		util, window := c.obs.utilization()
		t.Logf("utilisation while a backlog existed (%s): %.1f%%", window.Round(time.Millisecond), util*100)
		require.GreaterOrEqual(t, util, minUtilization)
	})

	t.Run("tier order", func(t *testing.T) {
		c := newPool(t, queues.PoolConfig{Size: 1, Tiers: tiers, PollInterval: 10 * time.Millisecond})
		rng := rand.New(rand.NewPCG(3, 4))
		const jobs = 150
		for i := range jobs {
			c.enqueue(clusterJob{Seq: i, Tier: tiers[rng.IntN(3)], Work: 2 * time.Millisecond})
		}
		c.start(3)
		c.waitDone(jobs, 2*time.Minute)
		c.obs.mu.Lock()
		var startTiers []string
		for _, s := range c.obs.starts {
			startTiers = append(startTiers, s.Tier)
		}
		c.obs.mu.Unlock()
		require.Len(t, startTiers, jobs)
		require.Zero(t, c.cfg.Tiers.Inversions(startTiers), "a lower tier overtook a higher one: %v", startTiers)
	})

	t.Run("resize", func(t *testing.T) {
		c := newPool(t, queues.PoolConfig{Size: 4, MaxSize: 4, Tiers: tiers, PollInterval: 10 * time.Millisecond})
		require.NoError(t, c.client.Resize(context.Background(), "batch", 2))
		c.obs.size = 2
		const jobs = 200
		for i := range jobs {
			c.enqueue(clusterJob{Seq: i, Tier: tiers[i%3], Work: 5 * time.Millisecond})
		}
		c.start(3)
		c.waitDone(jobs, 2*time.Minute)
		c.obs.mu.Lock()
		peak, violations := c.obs.peak, c.obs.violations
		c.obs.mu.Unlock()
		require.Zero(t, violations, "more than the resized 2 ran at once")
		require.Equal(t, 2, peak)
		ps, err := c.client.PoolSize(context.Background(), "batch")
		require.NoError(t, err)
		require.Equal(t, 2, ps.Effective)
	})

	t.Run("promote and status", func(t *testing.T) {
		c := newPool(t, queues.PoolConfig{Size: 1, Tiers: tiers})
		ctx := context.Background()
		payload, _ := json.Marshal(clusterJob{Seq: 1, Tier: "adhoc"})
		_, err := c.client.Enqueue(ctx, "report:run", payload, queues.EnqueueOptions{Tier: "adhoc", ID: "p1"})
		require.NoError(t, err)
		res, err := c.client.Promote(ctx, "report:run", "p1", "regulatory")
		require.NoError(t, err)
		require.True(t, res.Moved)
		require.Equal(t, "pending", res.State)
		st, err := c.client.Stats(ctx)
		require.NoError(t, err)
		pending := map[string]int64{}
		for _, q := range st.Queues {
			pending[q.Tier] = q.Pending
		}
		require.Equal(t, map[string]int64{"regulatory": 1, "close": 0, "adhoc": 0}, pending)
		// asynq's tools find the target queue in asynq's set of queues.
		qs, err := asynq.NewInspectorFromRedisClient(r.Client).Queues()
		require.NoError(t, err)
		p, _ := c.client.Pool("batch")
		require.Contains(t, qs, p.Queues()[0])
		// It runs from its new tier.
		c.start(1)
		c.waitDone(1, 30*time.Second)
		c.obs.mu.Lock()
		require.Equal(t, "adhoc", c.obs.starts[0].Tier, "the payload is the job's own")
		c.obs.mu.Unlock()
	})

	t.Run("replace a finished job, pause and resume", func(t *testing.T) {
		ctx := context.Background()
		c := newPool(t, queues.PoolConfig{Size: 2, Tiers: tiers, PollInterval: 10 * time.Millisecond})
		door := c.cfg
		door.Pools = []queues.PoolConfig{door.Pools[0]}
		door.Pools[0].MaxBacklog = 10
		doorClient, err := queues.NewClient(r.Client, door)
		require.NoError(t, err)
		for _, cl := range []*queues.Client{c.client, doorClient} { // asynq's DeleteTask, then the door's script
			payload, _ := json.Marshal(clusterJob{Seq: 1, Tier: "close"})
			res, err := cl.Enqueue(ctx, "report:run", payload, queues.EnqueueOptions{Tier: "close", ID: "f1", Retention: time.Hour})
			require.NoError(t, err)
			if cl == c.client {
				require.Equal(t, queues.Enqueued, res.Outcome)
				c.start(1)
				c.waitDone(1, 30*time.Second)
			} else {
				c.waitDone(2, 30*time.Second)
			}
			testwait.For(t, 10*time.Second, "the job marked completed", func() bool {
				st, err := c.client.Stats(ctx)
				require.NoError(t, err)
				for _, q := range st.Queues {
					if q.Tier == "close" {
						return q.Completed == 1
					}
				}
				return false
			})
			res, err = cl.Enqueue(ctx, "report:run", payload, queues.EnqueueOptions{Tier: "close", ID: "f1", Retention: time.Hour})
			require.NoError(t, err)
			require.Equal(t, queues.Replaced, res.Outcome)
		}
		c.waitDone(3, 30*time.Second)
		require.NoError(t, c.client.PausePool(ctx, "batch"))
		st, err := c.client.Stats(ctx)
		require.NoError(t, err)
		for _, q := range st.Queues {
			require.True(t, q.PausedByOperator, q.Queue)
		}
		require.NoError(t, c.client.ResumePool(ctx, "batch"))
		c.enqueue(clusterJob{Seq: 2, Tier: "regulatory", Work: time.Millisecond})
		c.waitDone(4, 30*time.Second)
	})

	t.Run("a trace crosses the door's split by pool", func(t *testing.T) {
		ns := r.Namespace(t)
		cfg := queues.Config{Namespace: ns, Logger: slog.New(logs), Pools: []queues.PoolConfig{
			{Name: "batch", JobTypes: []string{"report:run"}, Size: 1, MaxBacklog: 5},
			{Name: "order", JobTypes: []string{"order:place"}, Size: 1, MaxBacklog: 5},
		}}
		c, err := queues.NewClient(r.Client, cfg)
		require.NoError(t, err)
		parent := trace.SpanContext{}.WithTraceID(trace.TraceID{7}).WithSpanID(trace.SpanID{8}).WithTraceFlags(trace.FlagsSampled)
		ctx := trace.ContextWithSpanContext(context.Background(), parent)
		res, err := c.EnqueueMany(ctx, []queues.Request{{JobType: "report:run"}, {JobType: "order:place"}})
		require.NoError(t, err)
		insp := asynq.NewInspectorFromRedisClient(r.Client)
		for _, x := range res {
			info, err := insp.GetTaskInfo(x.Queue, x.ID)
			require.NoError(t, err)
			require.Equal(t, "00-07000000000000000000000000000000-0800000000000000-01", info.Headers["traceparent"], x.Queue)
		}
	})

	t.Run("unique IDs and the door across pools", func(t *testing.T) {
		ctx := context.Background()
		ns := r.Namespace(t)
		cfg := queues.Config{Namespace: ns, Tiers: testPolicy(t), Logger: slog.New(logs), Pools: []queues.PoolConfig{
			{Name: "batch", JobTypes: []string{"report:run"}, Size: 1, Tiers: tiers, MaxBacklog: 5},
			{Name: "order", JobTypes: []string{"order:place"}, Size: 1, MaxBacklog: 100},
			{Name: "plain", JobTypes: []string{"mail:send"}, Size: 1, Tiers: tiers},
		}}
		c, err := queues.NewClient(r.Client, cfg)
		require.NoError(t, err)
		reqs := func(n int, jobType, prefix string) []queues.Request {
			var out []queues.Request
			for i := range n {
				out = append(out, queues.Request{JobType: jobType, Options: queues.EnqueueOptions{ID: fmt.Sprintf("%s%d", prefix, i)}})
			}
			return out
		}
		backlog := func(pool string) int64 {
			st, err := c.Stats(ctx)
			require.NoError(t, err)
			var n int64
			for _, q := range st.Queues {
				if q.Pool == pool {
					n += q.Pending
				}
			}
			return n
		}
		// Unique IDs in three pools, one batch: locked and looked up per
		// pool; enqueued again, all duplicates.
		batch := append(append(reqs(3, "report:run", "r"), reqs(3, "order:place", "o")...), reqs(3, "mail:send", "m")...)
		res, err := c.EnqueueMany(ctx, batch)
		require.NoError(t, err)
		for _, x := range res {
			require.Equal(t, queues.Enqueued, x.Outcome)
		}
		res, err = c.EnqueueMany(ctx, batch)
		require.NoError(t, err)
		for _, x := range res {
			require.Equal(t, queues.Duplicate, x.Outcome, x.ID)
		}
		// A batch over two pools with a door, refused by the second: the
		// first's jobs are taken back, nothing of it stays.
		res, err = c.EnqueueMany(ctx, append(reqs(10, "order:place", "o2-"), reqs(3, "report:run", "r2-")...))
		var be *queues.BacklogError
		require.ErrorAs(t, err, &be)
		for _, x := range res {
			require.Equal(t, queues.NotEnqueued, x.Outcome, x.ID)
		}
		require.Equal(t, "batch", be.Pool)
		require.False(t, isSlotError(err.Error()), err.Error())
		require.EqualValues(t, 3, backlog("order"), "the order pool's jobs of the refused batch were taken back")
		require.EqualValues(t, 3, backlog("batch"))
		// Single enqueues from many goroutines and two clients share calls
		// per pool: the limit holds exactly.
		rdb2 := r.Connect()
		defer rdb2.Close()
		c2, err := queues.NewClient(rdb2, cfg)
		require.NoError(t, err)
		var wg sync.WaitGroup
		var admitted, refused atomic.Int64
		for i := range 40 {
			wg.Go(func() {
				cl, jt := c, "report:run"
				if i%2 == 1 {
					cl = c2
				}
				if i%4 >= 2 {
					jt = "order:place"
				}
				_, err := cl.Enqueue(ctx, jt, nil, queues.EnqueueOptions{})
				switch {
				case err == nil && jt == "report:run":
					admitted.Add(1)
				case errors.Is(err, queues.ErrBacklogFull):
					refused.Add(1)
				case err != nil:
					t.Errorf("enqueue: %v", err)
				}
			})
		}
		wg.Wait()
		require.EqualValues(t, 2, admitted.Load(), "the batch pool had room for 2 more")
		require.EqualValues(t, 18, refused.Load())
		require.EqualValues(t, 5, backlog("batch"))
		require.EqualValues(t, 23, backlog("order"))
	})

	t.Run("breaker", func(t *testing.T) {
		ctx := context.Background()
		ns := r.Namespace(t)
		var down atomic.Bool
		down.Store(true)
		var calls, done atomic.Int64
		h := queues.NewHandlers()
		queues.AddHandler(h, dbQuery, func(ctx context.Context, j dbJob) error {
			calls.Add(1)
			if down.Load() {
				return errors.New("database unreachable")
			}
			done.Add(1)
			return nil
		})
		cfg := queues.Config{Namespace: ns, Tiers: testPolicy(t), Logger: slog.New(logs), ShutdownTimeout: 5 * time.Second,
			RetryDelay: func(int, error) time.Duration { return 10 * time.Millisecond }, DelayedCheckInterval: 50 * time.Millisecond,
			Pools: []queues.PoolConfig{{Name: "db", JobTypes: []string{"db:query"}, Size: 2, Tiers: tiers, MaxRetry: 3, PollInterval: 10 * time.Millisecond,
				Breaker: &queues.BreakerConfig{MinCalls: 4, FailureRatio: 0.5, Window: 10 * time.Second, CoolDown: time.Hour}}}}
		c, err := queues.NewClient(r.Client, cfg)
		require.NoError(t, err)
		const jobs = 12
		for i := range jobs {
			payload, _ := json.Marshal(dbJob{Seq: i, Work: 5 * time.Millisecond})
			_, err := c.Enqueue(ctx, "db:query", payload, queues.EnqueueOptions{Tier: tiers[i%3], ID: fmt.Sprint("j", i), Retention: time.Hour})
			require.NoError(t, err)
		}
		for range 2 {
			run := cfg
			run.Handlers = h
			rdb := r.Connect()
			rn, err := queues.NewClient(rdb, run)
			require.NoError(t, err)
			require.NoError(t, rn.Start(ctx))
			t.Cleanup(func() {
				require.NoError(t, rn.Stop(context.Background()))
				_ = rdb.Close()
			})
		}
		testwait.For(t, 30*time.Second, "the breaker to open", func() bool {
			st, err := c.Breaker(ctx, "db")
			require.NoError(t, err)
			return st.State == queues.BreakerOpen
		})
		testwait.For(t, 30*time.Second, "every job back in its queue, paused by the breaker", func() bool {
			st, err := c.Stats(ctx)
			require.NoError(t, err)
			var pending int64
			for _, q := range st.Queues {
				if !q.Paused {
					return false
				}
				pending += q.Pending
			}
			return pending == jobs
		})
		before := calls.Load()
		down.Store(false)
		_, err = c.ForceBreaker(ctx, "db", queues.BreakerReset)
		require.NoError(t, err)
		testwait.For(t, 30*time.Second, "every job done", func() bool { return done.Load() == jobs })
		t.Logf("breaker: %d calls before it opened; all %d jobs done after the reset", before, jobs)
		st, err := c.Stats(ctx)
		require.NoError(t, err)
		for _, q := range st.Queues {
			require.Zero(t, q.Archived, q.Queue)
		}
	})
}
