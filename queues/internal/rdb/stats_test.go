package rdb

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The status reads (pool_stats, and the batch they go in), an operator's
// pauses and sizes: each case writes a pool's state as asynq and the gate
// do, and checks what is read back, or what a write left.

// fillQueue writes queue q's state as asynq keeps it: pending jobs (the
// head, dequeued next, pending since since), active ones, and one job in
// each of its sets, and n jobs processed.
func fillQueue(t *testing.T, b backend, q string, pending, active []string, since time.Time, processed int) {
	t.Helper()
	ctx := context.Background()
	for i, id := range pending {
		require.NoError(t, b.RC.LPush(ctx, PendingKey(q), id).Err())
		stamp := since.Add(time.Duration(i) * time.Second) // later ones, later
		require.NoError(t, b.RC.HSet(ctx, TaskKey(q, id), "state", "pending", "pending_since", strconv.FormatInt(stamp.UnixNano(), 10)).Err())
	}
	for _, id := range active {
		require.NoError(t, b.RC.LPush(ctx, ActiveKey(q), id).Err())
	}
	for _, key := range []string{scheduledKey(q), retryKey(q), archivedKey(q), completedKey(q)} {
		require.NoError(t, b.RC.ZAdd(ctx, key, redis.Z{Score: 1, Member: "z"}).Err())
	}
	if processed > 0 {
		require.NoError(t, b.RC.Set(ctx, processedKey(q), processed, 0).Err())
	}
}

// fillSlots writes a cluster-scoped pool's gate: live leases held by
// processes, one lapsed lease, an operator's size, and two processes that
// said what they can run, one of which lapsed.
func fillSlots(t *testing.T, b backend, pool string, live map[string]string) {
	t.Helper()
	ctx := context.Background()
	g := b.KS.Gate(pool)
	soon, past := float64(time.Now().Add(time.Minute).UnixMilli()), float64(time.Now().Add(-time.Minute).UnixMilli())
	for m, h := range live {
		require.NoError(t, b.RC.ZAdd(ctx, g.Leases, redis.Z{Score: soon, Member: m}).Err())
		require.NoError(t, b.RC.HSet(ctx, g.Holders, m, h).Err())
	}
	lapsed := Member{ID: "lapsed", Queue: b.KS.Queue(pool, "high")}.String()
	require.NoError(t, b.RC.ZAdd(ctx, g.Leases, redis.Z{Score: past, Member: lapsed}).Err())
	require.NoError(t, b.RC.HSet(ctx, g.Holders, lapsed, "P0").Err())
	require.NoError(t, b.RC.Set(ctx, g.Size, 7, 0).Err())
	require.NoError(t, b.RC.HSet(ctx, g.Procs, "P1", 4, "P9", 5).Err())
	require.NoError(t, b.RC.ZAdd(ctx, g.ProcsSeen, redis.Z{Score: soon, Member: "P1"}, redis.Z{Score: past, Member: "P9"}).Err())
}

func init() {
	scriptCases = append(scriptCases,
		scriptCase{script: "pool_stats", name: "a pool's queues: counts, the oldest pending job, pauses", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			high, low := b.KS.Queue("p", "high"), b.KS.Queue("p", "low")
			since := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
			fillQueue(t, b, high, []string{"h1", "h2"}, []string{"a1"}, since, 12)
			require.NoError(t, b.RC.Set(ctx, PausedKey(low), "1700000000", 0).Err()) // an operator's
			batch := NewPools(b.RC, b.KS).Batch()
			read := batch.PoolStats(PoolStatsArgs{Pool: "p", Queues: []string{high, low}})
			require.NoError(t, batch.Exec(ctx))
			st, err := read.Result()
			require.NoError(t, err)
			require.Equal(t, []QueueCounts{
				{Pending: 2, Active: 1, Scheduled: 1, Retry: 1, Archived: 1, Completed: 1, Running: 1, Processed: 12, PendingSince: time.Unix(0, since.UnixNano())},
				{Paused: true, PausedByOperator: true},
			}, st.Queues, "a process-scoped pool runs what asynq holds active")
			require.Equal(t, PoolSlots{Holders: map[string]int64{}}, st.Slots)
		}},
		scriptCase{script: "pool_stats", name: "a cluster-scoped pool: running jobs are those holding a slot", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			high, low := b.KS.Queue("p", "high"), b.KS.Queue("p", "low")
			fillQueue(t, b, high, nil, []string{"h1", "h2", "h3"}, time.Time{}, 0)
			fillQueue(t, b, low, nil, []string{"l1"}, time.Time{}, 0)
			fillSlots(t, b, "p", map[string]string{
				Member{ID: "h1", Queue: high}.String(): "P1", Member{ID: "h2", Queue: high}.String(): "P2",
				Member{ID: "l1", Queue: low}.String(): "P1",
			})
			require.NoError(t, b.RC.Set(ctx, PausedKey(high), GatePause, 0).Err())
			require.NoError(t, b.RC.Set(ctx, PausedKey(low), BreakerPause, 0).Err())
			batch := NewPools(b.RC, b.KS).Batch()
			read := batch.PoolStats(PoolStatsArgs{Pool: "p", Queues: []string{high, low}, Cluster: true})
			require.NoError(t, batch.Exec(ctx))
			st, err := read.Result()
			require.NoError(t, err)
			require.Equal(t, []QueueCounts{
				{Active: 3, Scheduled: 1, Retry: 1, Archived: 1, Completed: 1, Running: 2, Paused: true},
				{Active: 1, Scheduled: 1, Retry: 1, Archived: 1, Completed: 1, Running: 1, Paused: true},
			}, st.Queues, "h3 waits for a slot; the gate's and the breaker's pauses are not an operator's")
			want := PoolSlots{InUse: 3, Holders: map[string]int64{"P1": 2, "P2": 1}, OperatorSize: 7, Processes: 1, Capacity: 4}
			require.Equal(t, want, st.Slots, "the lapsed lease and the lapsed process do not count")

			slots, err := NewPools(b.RC, b.KS).Slots(ctx, "p")
			require.NoError(t, err)
			require.Equal(t, want, slots)
		}},
		scriptCase{script: "pool_stats", name: "a batch reads many pools, breakers and doors in one round trip", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			// Pools in different hash slots on a cluster: the batch's
			// calls each stay in one.
			var reads []*PoolStatsRead
			batch := NewPools(b.RC, b.KS).Batch()
			for i, pool := range []string{"a", "b", "c", "d"} {
				q := b.KS.Queue(pool, "")
				fillQueue(t, b, q, []string{"j"}, nil, time.Now(), i)
				reads = append(reads, batch.PoolStats(PoolStatsArgs{Pool: pool, Queues: []string{q}, Cluster: i%2 == 0}))
			}
			state, _, _, _ := b.KS.BreakerKeys("a")
			require.NoError(t, b.RC.HSet(ctx, state, "state", "open", "trips", "3").Err())
			waiting, _, refused := b.KS.doorKeys("b")
			require.NoError(t, b.RC.HSet(ctx, refused, "close|backlog", "5", "adhoc|rate", "2").Err())
			require.NoError(t, b.RC.ZAdd(ctx, waiting, redis.Z{Score: 1, Member: "r1"}, redis.Z{Score: 2, Member: "r2"}).Err())
			open, closed := batch.BreakerSummary("a"), batch.BreakerSummary("c")
			refusals, none := batch.DoorRefusals("b"), batch.DoorRefusals("d")
			line := batch.DoorWaiting("b")
			require.NoError(t, batch.Exec(ctx))

			for i, r := range reads {
				st, err := r.Result()
				require.NoError(t, err)
				require.EqualValues(t, 1, st.Queues[0].Pending)
				require.EqualValues(t, i, st.Queues[0].Processed)
			}
			s, err := open.Result()
			require.NoError(t, err)
			require.Equal(t, BreakerSummary{State: "open", Trips: 3}, s)
			s, err = closed.Result()
			require.NoError(t, err)
			require.Equal(t, BreakerSummary{}, s, "a breaker that recorded nothing")
			r, err := refusals.Result()
			require.NoError(t, err)
			require.Equal(t, []int64{5, 0, 2, 0}, []int64{r.Count("close", "backlog"), r.Count("close", "rate"), r.Count("adhoc", "rate"), r.Count("regulatory", "backlog")})
			r, err = none.Result()
			require.NoError(t, err)
			require.Zero(t, r.Count("close", "backlog"))
			n, err := line.Result()
			require.NoError(t, err)
			require.EqualValues(t, 2, n)
		}},
		scriptCase{script: "pool_stats", name: "a batch loads the script when Redis lost it, and reads again", run: func(t *testing.T, b backend) {
			if b.Redis.Mini == nil && !b.Cluster {
				// Flushing the scripts of a Redis other tests share would
				// cost them a reload each.
				t.Skip("flushes Redis's scripts: only on a Redis of the test's own")
			}
			ctx := context.Background()
			q := b.KS.Queue("p", "")
			fillQueue(t, b, q, []string{"j"}, nil, time.Now(), 0)
			require.NoError(t, b.RC.ScriptFlush(ctx).Err())
			batch := NewPools(b.RC, b.KS).Batch()
			read := batch.PoolStats(PoolStatsArgs{Pool: "p", Queues: []string{q}})
			line := batch.DoorWaiting("p")
			require.NoError(t, batch.Exec(ctx))
			st, err := read.Result()
			require.NoError(t, err)
			require.EqualValues(t, 1, st.Queues[0].Pending)
			_, err = line.Result()
			require.NoError(t, err)
		}},

		scriptCase{script: "queue_pause", name: "an operator's pause replaces the gate's and a breaker's, and keeps its own", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			qs := []string{b.KS.Queue("p", "a"), b.KS.Queue("p", "b"), b.KS.Queue("p", "c"), b.KS.Queue("p", "d")}
			require.NoError(t, b.RC.Set(ctx, PausedKey(qs[1]), GatePause, 0).Err())
			require.NoError(t, b.RC.Set(ctx, PausedKey(qs[2]), BreakerPause, 0).Err())
			require.NoError(t, b.RC.Set(ctx, PausedKey(qs[3]), "1600000000", 0).Err())
			at := time.Unix(1700000000, 0)
			require.NoError(t, PauseQueues(ctx, b.RC, qs, at))
			var got []string
			for _, q := range qs {
				got = append(got, b.RC.Get(ctx, PausedKey(q)).Val())
			}
			require.Equal(t, []string{"1700000000", "1700000000", "1700000000", "1600000000"}, got)
		}},
		scriptCase{script: "queue_resume", name: "a resume lifts only an operator's pauses", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			qs := []string{b.KS.Queue("p", "a"), b.KS.Queue("p", "b"), b.KS.Queue("p", "c"), b.KS.Queue("p", "d")}
			for i, v := range []string{"1700000000", GatePause, BreakerPause} {
				require.NoError(t, b.RC.Set(ctx, PausedKey(qs[i]), v, 0).Err())
			}
			require.NoError(t, ResumeQueues(ctx, b.RC, qs))
			var got []string
			for _, q := range qs {
				got = append(got, b.RC.Get(ctx, PausedKey(q)).Val())
			}
			require.Equal(t, []string{"", GatePause, BreakerPause, ""}, got)
		}},

		// Not a script: the size an operator sets (Client.Resize).
		scriptCase{script: "pool_size", name: "set, read and reset; what is not a size reads as none", run: func(t *testing.T, b backend) {
			ctx := context.Background()
			p := NewPools(b.RC, b.KS)
			_, set, err := p.Size(ctx, "p")
			require.NoError(t, err)
			require.False(t, set)
			require.NoError(t, p.SetSize(ctx, "p", 6))
			n, set, err := p.Size(ctx, "p")
			require.NoError(t, err)
			require.True(t, set)
			require.Equal(t, 6, n)
			require.Equal(t, "6", b.RC.Get(ctx, b.KS.Gate("p").Size).Val(), "where the gate's scripts read it")
			for _, v := range []string{"0", "-2", "two", "2.5"} {
				require.NoError(t, b.RC.Set(ctx, b.KS.Gate("p").Size, v, 0).Err())
				_, set, err = p.Size(ctx, "p")
				require.NoError(t, err)
				require.False(t, set, v)
			}
			require.NoError(t, p.ResetSize(ctx, "p"))
			require.Zero(t, b.RC.Exists(ctx, b.KS.Gate("p").Size).Val())
		}},
	)
}

// TestPoolStatsRepliesOfTheWrongShape: a reply that is not what the
// script returns is an error, never a panic.
func TestPoolStatsRepliesOfTheWrongShape(t *testing.T) {
	q := []any{int64(1), int64(0), int64(0), int64(0), int64(0), int64(0), "", "", int64(1), int64(0)}
	slots := []any{int64(0), int64(0), int64(0), int64(0)}
	for _, tc := range []struct {
		name string
		res  any
		n    int
	}{
		{"not a list", "x", 0},
		{"one part", []any{[]any{}}, 0},
		{"another number of queues", []any{[]any{q}, slots}, 2},
		{"slots too short", []any{[]any{}, []any{int64(0)}}, 0},
		{"a holder without a count", []any{[]any{}, append(slots[:4:4], "P1")}, 0},
		{"a count that is no number", []any{[]any{}, append(slots[:4:4], "P1", "2")}, 0},
		{"a queue too short", []any{[]any{q[:9]}, slots}, 1},
		{"a pause that is no string", []any{[]any{append(q[:7:7], int64(0), int64(1), int64(0))}, slots}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parsePoolStats(tc.res, tc.n)
			require.ErrorContains(t, err, "pool stats: unexpected reply")
		})
	}
	st, err := parsePoolStats([]any{[]any{q}, append(slots[:4:4], "P1", int64(2))}, 1)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"P1": 2}, st.Slots.Holders)
}
