package rdb

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
)

// TestAsynqKeyLayout pins the asynq keys the engine reads and writes inside
// its Lua scripts (keyspace.go): a queue's pause flag, its pending and active
// lists, its lease set (scores in Unix seconds) and a task's hash with its
// state. An asynq upgrade that moves them fails here, not in production.
func TestAsynqKeyLayout(t *testing.T) {
	r := testredis.New(t)
	ctx := context.Background()
	q := r.Namespace(t) + ":batch:close"
	c := asynq.NewClientFromRedisClient(r.Client)
	defer c.Close()
	info, err := c.Enqueue(asynq.NewTask("report:run", nil), asynq.Queue(q), asynq.TaskID("report:x:2026-10"))
	require.NoError(t, err)
	require.Equal(t, []string{info.ID}, r.Client.LRange(ctx, PendingKey(q), 0, -1).Val())
	state, err := r.Client.HGet(ctx, TaskKey(q, info.ID), "state").Result()
	require.NoError(t, err)
	require.Equal(t, "pending", state)

	insp := asynq.NewInspectorFromRedisClient(r.Client)
	require.NoError(t, insp.PauseQueue(q))
	require.EqualValues(t, 1, r.Client.Exists(ctx, PausedKey(q)).Val())
	require.NoError(t, insp.UnpauseQueue(q))
	// A pause set by someone else is one asynq honours.
	require.NoError(t, r.Client.Set(ctx, PausedKey(q), GatePause, 0).Err())
	qi, err := insp.GetQueueInfo(q)
	require.NoError(t, err)
	require.True(t, qi.Paused)
	require.NoError(t, r.Client.Del(ctx, PausedKey(q)).Err())

	started := make(chan struct{})
	release := make(chan struct{})
	srv := asynq.NewServerFromRedisClient(r.Client, asynq.Config{Concurrency: 1, Queues: map[string]int{q: 1}, TaskCheckInterval: 10 * time.Millisecond})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		close(started)
		<-release
		return nil
	})))
	defer srv.Shutdown()
	<-started
	require.Equal(t, []string{info.ID}, r.Client.LRange(ctx, ActiveKey(q), 0, -1).Val())
	score, err := r.Client.ZScore(ctx, LeaseKey(q), info.ID).Result()
	require.NoError(t, err)
	now := float64(time.Now().Unix())
	require.InDelta(t, now+30, score, 3, "the lease expires 30 s from now, in Unix seconds")
	close(release)
	// asynq counts the job processed in the total the dashboard's jobs
	// per second are read from.
	testwait.For(t, 10*time.Second, "asynq to count the job processed", func() bool {
		return r.Client.Get(ctx, processedKey(q)).Val() == "1"
	})
	qi, err = insp.GetQueueInfo(q)
	require.NoError(t, err)
	require.Equal(t, 1, qi.ProcessedTotal)
}

// TestKeyspaceLayouts: a single Redis keeps the names the engine always
// used; on a Redis Cluster every key of one pool carries the pool's hash
// tag, <ns>:<pool>, as the text between its first '{' and the next '}'.
func TestKeyspaceLayouts(t *testing.T) {
	single, cluster := NewKeyspace("ns", false), NewKeyspace("ns", true)
	leases, waiting := single.GateKeys("batch")
	require.Equal(t, []string{"ns:batch:close", "ns:batch", "ns:gate:batch:leases", "ns:gate:batch:waiting", "ns:failures:ns:batch:close:j1", "ns:enqueue-lock:batch:j1"},
		[]string{single.Queue("batch", "close"), single.Queue("batch", ""), leases, waiting, single.FailureCountKey("ns:batch:close", "j1"), single.enqueueLockKey("batch", "j1")})

	tag := func(key string) string {
		i := strings.IndexByte(key, '{')
		require.GreaterOrEqual(t, i, 0, key)
		j := strings.IndexByte(key[i+1:], '}')
		require.GreaterOrEqual(t, j, 1, key)
		return key[i+1 : i+1+j]
	}
	q := cluster.Queue("batch", "close")
	require.Equal(t, "ns:batch}:close", q)
	leases, waiting = cluster.GateKeys("batch")
	state, window, suspects, probes := cluster.BreakerKeys("batch")
	dw, dd, dr := cluster.doorKeys("batch")
	for _, k := range []string{
		PendingKey(q), PausedKey(q), TaskKey(q, "j1"), PendingKey(cluster.Queue("batch", "")),
		leases, waiting, cluster.startRateKey("batch"), cluster.PoolSizeKey("batch"), cluster.gateAgedKey("batch"),
		cluster.FailureCountKey(q, "j1"), cluster.FailureCountKey(cluster.Queue("batch", ""), "j1"), cluster.enqueueLockKey("batch", "j1"),
		dw, dd, dr, cluster.rateKey("batch", "enqueue"), state, window, suspects, probes,
		cluster.breakerCountedKey("batch"), cluster.BreakerLateKey("batch"),
	} {
		require.Equal(t, "ns:batch", tag(k), k)
	}
}
