package queues_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// scriptCalls counts the door's script calls a Redis client makes, by
// script: what Redis was asked to run, seen from outside the client.
type scriptCalls struct {
	fast, general atomic.Int64
}

func (s *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (s *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	fast, general := queues.DoorScripts()
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			return err // go-redis sends the script itself next
		}
		if args := cmd.Args(); len(args) > 1 && (strings.EqualFold(cmd.Name(), "evalsha") || strings.EqualFold(cmd.Name(), "eval")) {
			// EVALSHA names the script by its SHA1, EVAL sends its text.
			switch script := fmt.Sprint(args[1]); {
			case script == fast || strings.HasPrefix(script, "-- admit_fast:"):
				s.fast.Add(1)
			case script == general || strings.HasPrefix(script, "-- admit:"):
				s.general.Add(1)
			}
		}
		return err
	}
}

func (s *scriptCalls) counts() (fast, general int64) { return s.fast.Load(), s.general.Load() }

// countingClient returns a client of h's pools whose Redis calls are
// counted by script.
func (h *harness) countingClient() (*queues.Client, *scriptCalls) {
	h.t.Helper()
	rdb := redis.NewClient(h.redis.Options)
	h.t.Cleanup(func() { _ = rdb.Close() })
	calls := &scriptCalls{}
	rdb.AddHook(calls)
	c, err := queues.NewClient(rdb, h.cfg)
	require.NoError(h.t, err)
	return c, calls
}

// doorPool is a tiered pool with every check the fast path makes: tier
// limits, the pool's enqueue rate and a job type's.
func doorPool(max int, tierLimits map[string]int) queues.PoolConfig {
	pc := batchPool(max, tierLimits)
	pc.EnqueueRate = &queues.Rate{Limit: 100000, Per: time.Second}
	pc.JobTypeRates = map[string]queues.Rate{"report": {Limit: 100000, Per: time.Second}}
	return pc
}

// In the common case (single jobs that fit under the bound and pass their
// rates) each enqueue is one call of the fast script, and the jobs it
// writes are asynq's: the inspector lists them where they were asked for.
func TestDoorFastPathCommonCase(t *testing.T) {
	t.Parallel()
	h := newHarness(t, doorPool(1000, map[string]int{"adhoc": 600}))
	c, calls := h.countingClient()
	ctx := context.Background()
	tiers := []string{"regulatory", "close", "adhoc"}
	for _, tier := range tiers {
		// The first job of each queue adds it to asynq's set of queue
		// names, which is the general script's to do.
		_, err := c.Enqueue(ctx, "report", []byte(`{}`), queues.EnqueueOptions{Tier: tier})
		require.NoError(t, err)
	}
	fast0, general0 := calls.counts()
	var ids []string
	for i := range 30 {
		res, err := c.Enqueue(ctx, "report", []byte(`{}`), queues.EnqueueOptions{Tier: tiers[i%3]})
		require.NoError(t, err)
		require.Equal(t, queues.Enqueued, res.Outcome)
		ids = append(ids, res.ID)
	}
	fast, general := calls.counts()
	require.Equal(t, int64(30), fast-fast0, "one fast call per enqueue")
	require.Equal(t, general0, general, "no general call")
	require.Equal(t, 33, h.backlog("batch"))
	for i, id := range ids {
		info, err := h.insp.GetTaskInfo(queues.QueueName(h.cfg.Namespace, "batch", tiers[i%3]), id)
		require.NoError(t, err)
		require.Equal(t, "report", info.Type)
	}
}

// At a limit the fast path hands over and the refusal is an exact count's:
// the job that fills the pool passes the fast path, the next one is
// refused by the general script with the backlog counted; a stale bound is
// counted again, so a job that went around the door is seen.
func TestDoorFastPathHandsOverAtTheLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, doorPool(4, map[string]int{"adhoc": 2}))
	c, calls := h.countingClient()
	queues.SetBacklogRecount(c, time.Hour)
	ctx := context.Background()
	enqueue := func(tier string) error {
		_, err := c.Enqueue(ctx, "report", []byte(`{}`), queues.EnqueueOptions{Tier: tier})
		return err
	}
	require.NoError(t, enqueue("adhoc")) // counted: the general script
	fast0, general0 := calls.counts()
	require.NoError(t, enqueue("adhoc")) // the ad-hoc limit, exactly
	fast, general := calls.counts()
	require.Equal(t, [2]int64{fast0 + 1, general0}, [2]int64{fast, general})

	require.EqualError(t, enqueue("adhoc"), `pool "batch" is full for tier "adhoc": backlog 2/2; nothing was enqueued`)
	fast, general = calls.counts()
	require.Equal(t, [2]int64{fast0 + 2, general0 + 1}, [2]int64{fast, general}, "tried fast, decided by the general script")
	require.Equal(t, 2, h.backlog("batch"))

	// A higher tier still has room; at its limit the same.
	require.NoError(t, enqueue("close"))
	require.NoError(t, enqueue("regulatory"))
	require.EqualError(t, enqueue("regulatory"), `pool "batch" is full for tier "regulatory": backlog 4/4; nothing was enqueued`)
	require.Equal(t, 4, h.backlog("batch"))

	// A stale bound: the fast path hands over and the exact count decides.
	p, err := h.client.Pool("batch")
	require.NoError(t, err)
	_, err = h.insp.DeleteAllPendingTasks(p.Queues()[0]) // the regulatory job leaves
	require.NoError(t, err)
	queues.SetBacklogRecount(c, 0)
	_, general0 = calls.counts()
	require.NoError(t, enqueue("regulatory"))
	_, general = calls.counts()
	require.Equal(t, general0+1, general, "a stale bound is counted by the general script")
	require.Equal(t, 4, h.backlog("batch"))
}

// A request waiting in line for room is served before a newcomer, even
// when the newcomer fits under the bound: the fast path sees the line and
// hands over, and the general script keeps the room for the waiter.
func TestDoorFastPathHandsOverWithWaiters(t *testing.T) {
	t.Parallel()
	pc := doorPool(3, nil)
	pc.BacklogWait = 300 * time.Millisecond
	h := newHarness(t, pc)
	ctx := context.Background()
	queues.SetBacklogRecount(h.client, time.Hour)
	var ids []string
	for range 2 {
		res, err := h.enqueueTier("close", queues.EnqueueOptions{})
		require.NoError(t, err)
		ids = append(ids, res.ID)
	}
	// A plan of 3, the whole pool, waits in line. It is asked from a
	// client that is stopped before the room appears, so it stays in line
	// (for the waiter's lapse, 1 s) without taking the room itself.
	waiter, err := queues.NewClient(h.redis.Client, h.cfg)
	require.NoError(t, err)
	wctx, stopWaiter := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		plan := slices.Repeat([]queues.Request{{JobType: "report", Payload: []byte(`{}`), Options: queues.EnqueueOptions{Tier: "regulatory"}}}, 3)
		_, err := waiter.EnqueueMany(wctx, plan)
		waited <- err
	}()
	waiting := h.cfg.Namespace + ":door:batch:waiting"
	testwait.For(t, 10*time.Second, "the plan to wait in line", func() bool {
		return h.redis.Client.ZCard(ctx, waiting).Val() == 1
	})
	stopWaiter()
	require.ErrorIs(t, <-waited, context.Canceled)
	// leaveLine ran on cancel; put the plan back in line as it stood, as
	// a producer still asking would keep it.
	now := time.Now()
	require.NoError(t, h.redis.Client.ZAdd(ctx, waiting, redis.Z{Score: float64(now.Add(-time.Second).UnixMicro()), Member: "plan"}).Err())
	require.NoError(t, h.redis.Client.HSet(ctx, h.cfg.Namespace+":door:batch:waiting-data", "plan",
		fmt.Sprintf("%d|3,0,0", now.Add(time.Minute).UnixMilli())).Err())

	// The pool empties: room for the plan. The bound still says 2, so a
	// single job fits under it; it must not pass the plan.
	q := queues.QueueName(h.cfg.Namespace, "batch", "close")
	for _, id := range ids {
		require.NoError(t, h.insp.DeleteTask(q, id))
	}
	_, err = h.enqueueTier("close", queues.EnqueueOptions{})
	var be *queues.BacklogError
	require.ErrorAs(t, err, &be, "the room is the waiting plan's")
	require.Zero(t, h.backlog("batch"))
}

// The fast path and the general one race around a limit: single jobs (the
// fast path, with calls shared between producers) and plans of three (the
// general script) from 64 producers on two clients, while a worker drains
// the pool and the bound is counted again every few milliseconds. Watched
// from outside all along, the backlog never passes the limit.
func TestDoorFastAndGeneralRaceAtTheLimit(t *testing.T) {
	t.Parallel()
	const limit, producers, rounds = 30, 64, 8
	pc := doorPool(limit, map[string]int{"adhoc": 20})
	h := newHarness(t, pc)
	p, err := h.client.Pool("batch")
	require.NoError(t, err)
	ctx := context.Background()
	second, calls := h.countingClient()
	clients := []*queues.Client{h.client, second}
	for _, c := range clients {
		queues.SetBacklogRecount(c, 5*time.Millisecond)
	}
	// The counted client's first job of each queue goes through the
	// general script (it adds the queue to asynq's set); with these done,
	// each of its single enqueues tries the fast path first, however soon
	// the limit is reached.
	for _, tier := range []string{"regulatory", "close", "adhoc"} {
		_, err := second.Enqueue(ctx, "report", []byte(`{}`), queues.EnqueueOptions{Tier: tier})
		require.NoError(t, err)
	}

	peak := h.watchPending(p, func(i int) {
		if i%20 == 0 { // a worker takes a regulatory job
			h.redis.Client.RPop(ctx, "asynq:{"+p.Queues()[0]+"}:pending")
		}
	})
	var admitted, refused atomic.Int64
	var other sync.Map
	var wg sync.WaitGroup
	tiers := []string{"regulatory", "close", "adhoc"}
	for w := range producers {
		wg.Go(func() {
			for k := range rounds {
				tier := tiers[(w+k)%3]
				var err error
				if w%4 == 0 {
					plan := slices.Repeat([]queues.Request{{JobType: "report", Payload: []byte(`{}`), Options: queues.EnqueueOptions{Tier: tier}}}, 3)
					_, err = clients[w%2].EnqueueMany(ctx, plan)
				} else {
					_, err = clients[w%2].Enqueue(ctx, "report", []byte(`{}`), queues.EnqueueOptions{Tier: tier})
				}
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.Is(err, queues.ErrBacklogFull):
					refused.Add(1)
				default:
					other.Store(err.Error(), true)
				}
			}
		})
	}
	wg.Wait()
	other.Range(func(k, _ any) bool { t.Errorf("unexpected error: %v", k); return true })
	require.LessOrEqual(t, peak(), limit)
	require.LessOrEqual(t, h.backlog("batch"), limit)
	require.Positive(t, refused.Load(), "the limit was reached")
	fast, general := calls.counts()
	require.Positive(t, fast, "the fast path ran")
	require.Positive(t, general, "the general script ran")
}
