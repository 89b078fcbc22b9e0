package queues

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
)

// TestAsynqKeyLayout pins the asynq keys the engine reads and writes inside
// its Lua scripts (keys.go): a queue's pause flag, its pending and active
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
	require.Equal(t, []string{info.ID}, r.Client.LRange(ctx, asynqPendingKey(q), 0, -1).Val())
	state, err := r.Client.HGet(ctx, asynqTaskKey(q, info.ID), "state").Result()
	require.NoError(t, err)
	require.Equal(t, "pending", state)

	insp := asynq.NewInspectorFromRedisClient(r.Client)
	require.NoError(t, insp.PauseQueue(q))
	require.EqualValues(t, 1, r.Client.Exists(ctx, asynqPausedKey(q)).Val())
	require.NoError(t, insp.UnpauseQueue(q))
	// A pause set by someone else is one asynq honours.
	require.NoError(t, r.Client.Set(ctx, asynqPausedKey(q), gatePauseValue, 0).Err())
	qi, err := insp.GetQueueInfo(q)
	require.NoError(t, err)
	require.True(t, qi.Paused)
	require.NoError(t, r.Client.Del(ctx, asynqPausedKey(q)).Err())

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
	require.Equal(t, []string{info.ID}, r.Client.LRange(ctx, asynqActiveKey(q), 0, -1).Val())
	score, err := r.Client.ZScore(ctx, asynqLeaseKey(q), info.ID).Result()
	require.NoError(t, err)
	now := float64(time.Now().Unix())
	require.InDelta(t, now+30, score, 3, "the lease expires 30 s from now, in Unix seconds")
	close(release)
	// asynq counts the job processed in the total the dashboard's jobs
	// per second are read from.
	testwait.For(t, 10*time.Second, "asynq to count the job processed", func() bool {
		return r.Client.Get(ctx, asynqProcessedKey(q)).Val() == "1"
	})
	qi, err = insp.GetQueueInfo(q)
	require.NoError(t, err)
	require.Equal(t, 1, qi.ProcessedTotal)
}

// TestScriptsUseThePauseMarker: the gate's Lua files spell the pause marker
// the Go side uses to tell its own pauses from an operator's.
func TestScriptsUseThePauseMarker(t *testing.T) {
	for _, f := range []string{"lua/gate_lib.lua", "lua/gate_clear.lua"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.True(t, strings.Contains(string(b), `"`+gatePauseValue+`"`), f)
	}
}

// TestKeyspaceLayouts: a single Redis keeps the names the engine always
// used; on a Redis Cluster every key of one pool carries the pool's hash
// tag, <ns>:<pool>, as the text between its first '{' and the next '}'.
func TestKeyspaceLayouts(t *testing.T) {
	single, cluster := keyspace{ns: "ns"}, keyspace{ns: "ns", cluster: true}
	leases, waiting := single.gateKeys("batch")
	require.Equal(t, []string{"ns:batch:close", "ns:batch", "ns:gate:batch:leases", "ns:gate:batch:waiting", "ns:failures:ns:batch:close:j1", "ns:enqueue-lock:batch:j1"},
		[]string{single.queue("batch", "close"), single.queue("batch", ""), leases, waiting, single.failureCountKey("ns:batch:close", "j1"), single.enqueueLockKey("batch", "j1")})

	tag := func(key string) string {
		i := strings.IndexByte(key, '{')
		require.GreaterOrEqual(t, i, 0, key)
		j := strings.IndexByte(key[i+1:], '}')
		require.GreaterOrEqual(t, j, 1, key)
		return key[i+1 : i+1+j]
	}
	q := cluster.queue("batch", "close")
	require.Equal(t, "ns:batch}:close", q)
	leases, waiting = cluster.gateKeys("batch")
	state, window, suspects, probes := cluster.breakerKeys("batch")
	dw, dd, dr := cluster.doorKeys("batch")
	for _, k := range []string{
		asynqPendingKey(q), asynqPausedKey(q), asynqTaskKey(q, "j1"), asynqPendingKey(cluster.queue("batch", "")),
		leases, waiting, cluster.startRateKey("batch"), cluster.poolSizeKey("batch"), cluster.gateAgedKey("batch"),
		cluster.failureCountKey(q, "j1"), cluster.failureCountKey(cluster.queue("batch", ""), "j1"), cluster.enqueueLockKey("batch", "j1"),
		dw, dd, dr, cluster.rateKey("batch", "enqueue"), state, window, suspects, probes,
		cluster.breakerCountedKey("batch"), cluster.breakerLateKey("batch"),
	} {
		require.Equal(t, "ns:batch", tag(k), k)
	}
}
