package queues

import (
	"context"
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
	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// scriptArgs is a go-redis hook that records the arguments of every
// script call (FCALL, EVALSHA, EVAL): what Redis heard.
type scriptArgs struct {
	mu   sync.Mutex
	args []string
}

func (h *scriptArgs) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptArgs) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "fcall" || name == "evalsha" || name == "eval" {
			h.mu.Lock()
			for _, a := range cmd.Args() {
				h.args = append(h.args, fmt.Sprint(a))
			}
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (h *scriptArgs) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *scriptArgs) heard(s string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.args, s)
}

func (h *scriptArgs) heardPrefix(p string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.ContainsFunc(h.args, func(a string) bool { return strings.HasPrefix(a, p) })
}

// line returns the members waiting in Redis's line for g's pool.
func line(t *testing.T, g *gate, rc redis.UniversalClient) []string {
	t.Helper()
	m, err := rc.ZRange(context.Background(), g.keys().Waiting, 0, -1).Result()
	require.NoError(t, err)
	return m
}

// TestJobsWaitBehindOneStandIn: in a full pool, the jobs of one process
// that wait for a slot take one place in Redis's line between them (a
// stand-in), not one each; a slot freed in the process goes from job to
// job, and Redis hears of the chain as one hand-on (to the last job),
// never of the jobs in between.
func TestJobsWaitBehindOneStandIn(t *testing.T) {
	t.Parallel()
	g, r, cfg := plainGate(t, 1)
	ctx := context.Background()
	q := QueueName(cfg.Namespace, "p", "")
	heard := &scriptArgs{}
	r.Client.AddHook(heard)
	a, err := g.acquire(ctx, "a", q)
	require.NoError(t, err)
	// a's reply said the pool was full: jobs that must wait now wait
	// behind a stand-in.
	b := acquireAsync(t, g, "b", q)
	c := acquireAsync(t, g, "c", q)
	d := acquireAsync(t, g, "d", q)
	for _, m := range []string{"b@" + q, "c@" + q, "d@" + q} {
		waitsInLine(t, g, r.Client, m, true, 0)
	}
	inLine := line(t, g, r.Client)
	require.Len(t, inLine, 1, "three jobs waiting in one process take one place in line")
	require.True(t, strings.HasPrefix(inLine[0], "~"+g.processID+"."), "the place is the process's stand-in: %s", inLine[0])

	// No call goes while the slot passes from a through the three jobs, in
	// the order they began to wait.
	holdCalls(g, true)
	g.release(ctx, a)
	var order []string
	for range 3 {
		var m string
		select {
		case m = <-b:
		case m = <-c:
		case m = <-d:
		case <-time.After(10 * time.Second):
			t.Fatalf("no job got the slot after %q", order)
		}
		order = append(order, m)
		if len(order) < 3 {
			g.release(ctx, m)
		}
	}
	last := order[2]
	holdCalls(g, false)
	g.sendOps()

	require.Equal(t, []string{last}, r.Client.ZRange(ctx, g.keys().Leases, 0, -1).Val(), "the slot is the last job's")
	require.Equal(t, g.processID, holder(t, g, r.Client, last))
	for _, m := range order[:2] {
		require.False(t, heard.heard(m), "Redis heard of %s, which only passed the slot on", m)
	}
	testwait.For(t, 10*time.Second, "the stand-in to leave the line once nobody waits behind it", func() bool {
		return len(line(t, g, r.Client)) == 0
	})
	g.release(ctx, last)
	g.sendOps()
	require.Zero(t, r.Client.ZCard(ctx, g.keys().Leases).Val())
}

// TestStandInKeepsTierOrder: a slot freed in another process goes to the
// stand-in of a process's higher-tier jobs ahead of a lower-tier job
// waiting in line itself, and the process gives it to its higher-tier job;
// the lower-tier job starts only after.
func TestStandInKeepsTierOrder(t *testing.T) {
	t.Parallel()
	g1, g2, r, high, low := tieredGates(t)
	ctx := context.Background()
	x, err := g2.acquire(ctx, "x", low)
	require.NoError(t, err)
	// g1 has no reply yet: its first waiting job asks itself.
	l := acquireAsync(t, g1, "l", low)
	waitsInLine(t, g1, r.Client, "l@"+low, true, 0)
	g1.mu.Lock()
	require.True(t, g1.waiters["l@"+low].asked)
	g1.mu.Unlock()
	h := acquireAsync(t, g1, "h", high)
	waitsInLine(t, g1, r.Client, "h@"+high, true, 0)
	g1.mu.Lock()
	require.NotNil(t, g1.waiters["h@"+high].behind, "h waits behind a stand-in")
	g1.mu.Unlock()

	g2.release(ctx, x)
	g2.sendOps()
	m := recvSlot(t, h, "the high tier's job to get the slot freed in the other process")
	require.Equal(t, "h@"+high, m)
	select {
	case <-l:
		t.Fatal("the low tier's job started ahead of the high tier's")
	default:
	}
	g1.release(ctx, m)
	m = recvSlot(t, l, "the low tier's job to start after the high tier's")
	g1.release(ctx, m)
	g1.sendOps()
	drained(t, g1, r.Client)
}

// TestStandInLeavesWhenItsJobGivesUp: a job that waited behind a stand-in
// and gives up (its deadline came near) leaves nothing behind: its error
// is the gate's wait error, the stand-in leaves the line, and the slot
// count is untouched.
func TestStandInLeavesWhenItsJobGivesUp(t *testing.T) {
	t.Parallel()
	g, r, cfg := plainGate(t, 1)
	ctx := context.Background()
	q := QueueName(cfg.Namespace, "p", "")
	a, err := g.acquire(ctx, "a", q)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_, err = g.acquire(short, "b", q)
	require.ErrorIs(t, err, errGateWait)
	require.ErrorContains(t, err, `pool "p": gave up waiting for a cluster-wide slot`)
	testwait.For(t, 10*time.Second, "the stand-in to leave the line", func() bool { return len(line(t, g, r.Client)) == 0 })
	require.Equal(t, []string{a}, r.Client.ZRange(ctx, g.keys().Leases, 0, -1).Val())
	g.mu.Lock()
	require.Empty(t, g.standIns)
	g.mu.Unlock()
	g.release(ctx, a)
	g.sendOps()
	require.Zero(t, r.Client.ZCard(ctx, g.keys().Leases).Val())
}

// TestCapHoldsWithStandIns: three processes share a pool of 3, each with
// more jobs than slots, so that jobs wait behind stand-ins and slots pass
// from job to job within a process and between processes. No more than 3
// jobs ever run at once (counted between acquire and release, where the
// handler runs), every job runs, and nothing is left in Redis after.
func TestCapHoldsWithStandIns(t *testing.T) {
	t.Parallel()
	const size, procs, workers, jobs = 3, 3, 4, 40
	g, r, cfg := plainGate(t, size)
	gates := []*gate{g}
	for range procs - 1 {
		gates = append(gates, newGate(r.Client, rdb.NewKeyspace(cfg.Namespace, false), g.conf.Load().pool, newProcessID(), time.Now))
	}
	q := QueueName(cfg.Namespace, "p", "")
	ctx := context.Background()
	heard := &scriptArgs{}
	r.Client.AddHook(heard)
	var running, most, ran atomic.Int64
	var wg sync.WaitGroup
	for p, pg := range gates {
		for w := range workers {
			wg.Go(func() {
				for i := range jobs {
					m, err := pg.acquire(ctx, fmt.Sprintf("j-%d-%d-%d", p, w, i), q)
					if !assertNoErr(t, err) {
						return
					}
					n := running.Add(1)
					for {
						was := most.Load()
						if n <= was || most.CompareAndSwap(was, n) {
							break
						}
					}
					time.Sleep(time.Duration(i%3) * time.Millisecond)
					running.Add(-1)
					ran.Add(1)
					pg.release(ctx, m)
				}
			})
		}
	}
	wg.Wait()
	for _, pg := range gates {
		pg.sendOps()
	}
	require.LessOrEqual(t, most.Load(), int64(size), "more jobs ran at once than the pool's size")
	require.Equal(t, int64(procs*workers*jobs), ran.Load(), "every job ran")
	require.True(t, heard.heardPrefix("~"), "no job waited behind a stand-in")
	drained(t, g, r.Client)
}

// drained waits up to 10 s until g's pool holds no lease and nobody waits
// in its line.
func drained(t *testing.T, g *gate, rc redis.UniversalClient) {
	t.Helper()
	testwait.For(t, 10*time.Second, "no lease and nobody in line", func() bool {
		return rc.ZCard(context.Background(), g.keys().Leases).Val() == 0 && len(line(t, g, rc)) == 0
	})
}

// recvSlot waits up to 10 s for the member a job's acquire returns.
func recvSlot(t *testing.T, got <-chan string, what string) string {
	t.Helper()
	select {
	case m := <-got:
		return m
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return ""
	}
}

// assertNoErr reports err (from a goroutine other than the test's) and
// says whether there was none.
func assertNoErr(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("acquire: %v", err)
		return false
	}
	return true
}

// TestJobBehindAStandInFreesItsOwnLapsedLease: a job whose own old lease
// lapsed (its earlier process stopped before freeing it, and asynq gave
// the job to this one) holds the slot Redis keeps for it while asynq
// still leases the job; behind a stand-in it would wait for that slot
// forever. It asks Redis itself after gateStandInPatience, which frees
// the lapsed lease, and starts.
func TestJobBehindAStandInFreesItsOwnLapsedLease(t *testing.T) {
	t.Parallel()
	g1, r, cfg := plainGate(t, 1)
	g2 := newGate(r.Client, rdb.NewKeyspace(cfg.Namespace, false), g1.conf.Load().pool, newProcessID(), time.Now)
	ctx := context.Background()
	q := QueueName(cfg.Namespace, "p", "")
	j, err := g2.acquire(ctx, "j", q)
	require.NoError(t, err)
	// g2 stops without freeing j's slot: its lease lapses while asynq
	// still leases j (which it now hands to g1).
	require.NoError(t, r.Client.ZAdd(ctx, g1.keys().Leases, redis.Z{Score: float64(time.Now().Add(-time.Minute).UnixMilli()), Member: j}).Err())
	require.NoError(t, r.Client.ZAdd(ctx, rdb.LeaseKey(q), redis.Z{Score: float64(time.Now().Add(time.Minute).Unix()), Member: "j"}).Err())
	// g1's last reply says the pool is full: a job that gives up at once.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = g1.acquire(short, "x", q)
	cancel()
	require.ErrorIs(t, err, errGateWait)
	g1.mu.Lock()
	require.True(t, g1.handOff.ok, "g1 saw the pool full")
	g1.mu.Unlock()

	again, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	started := time.Now()
	m, err := g1.acquire(again, "j", q)
	require.NoError(t, err, "the job waited for its own lapsed slot")
	require.Equal(t, j, m)
	require.GreaterOrEqual(t, time.Since(started), gateStandInPatience, "it waited behind the stand-in first")
	// The freed slot may have gone to the stand-in, still first in line,
	// which hands it to j here: Redis then hears that j holds it with the
	// next call, which j does not wait for.
	g1.sendOps()
	require.Equal(t, g1.processID, holder(t, g1, r.Client, j))
	g1.release(ctx, m)
	g1.sendOps()
	drained(t, g1, r.Client)
}

// TestStandInSlotNeverGoesToALowerTier: a slot granted to the stand-in of
// a process's high-tier jobs, once none of them waits any more, does not
// go to a low-tier job of the process: it is freed, and Redis hands it to
// the best waiter anywhere (here a low-tier job of another process that
// asked before).
func TestStandInSlotNeverGoesToALowerTier(t *testing.T) {
	t.Parallel()
	g1, g2, r, high, low := tieredGates(t)
	ctx := context.Background()
	s, err := g1.acquireMember(ctx, rdb.Member{ID: "~" + g1.processID + ".1", Queue: high}.String(), high, 0, true)
	require.NoError(t, err)
	w := acquireAsync(t, g2, "w", low)
	waitsInLine(t, g2, r.Client, "w@"+low, true, 0)
	l := &localWaiter{member: "l@" + low, queue: low, ch: make(chan struct{}, 1), rank: 2, since: time.Now()}
	g1.mu.Lock()
	g1.waiters[l.member] = l
	g1.mu.Unlock()

	g1.handStandIn(ctx, s, high)
	m := recvSlot(t, w, "the other process's job to get the slot")
	require.Equal(t, "w@"+low, m)
	require.Empty(t, l.ch, "a low tier's job got a slot granted for the high tier")
	g1.mu.Lock()
	delete(g1.waiters, l.member)
	g1.mu.Unlock()
	g2.release(ctx, m)
	g2.sendOps()
	require.Zero(t, r.Client.ZCard(ctx, g1.keys().Leases).Val())
}
