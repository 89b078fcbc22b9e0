package queues_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
)

// TestAsynqKeyLayout guards the asynq keys the cluster-wide gate reads and
// writes inside its Lua scripts: a queue's pause flag, its pending and
// active lists and its lease set (scores in Unix seconds). An asynq upgrade
// that moves them fails here, not in production.
func TestAsynqKeyLayout(t *testing.T) {
	r := testredis.New(t)
	ctx := context.Background()
	q := r.Namespace(t) + ":batch:close"
	prefix := "asynq:{" + q + "}:"
	c := asynq.NewClientFromRedisClient(r.Client)
	defer c.Close()
	info, err := c.Enqueue(asynq.NewTask("report:run", nil), asynq.Queue(q))
	require.NoError(t, err)
	require.Equal(t, []string{info.ID}, r.Client.LRange(ctx, prefix+"pending", 0, -1).Val())

	insp := asynq.NewInspectorFromRedisClient(r.Client)
	require.NoError(t, insp.PauseQueue(q))
	require.EqualValues(t, 1, r.Client.Exists(ctx, prefix+"paused").Val())
	require.NoError(t, insp.UnpauseQueue(q))
	// A pause set by someone else is one asynq honours.
	require.NoError(t, r.Client.Set(ctx, prefix+"paused", "compartment-gate", 0).Err())
	qi, err := insp.GetQueueInfo(q)
	require.NoError(t, err)
	require.True(t, qi.Paused)
	require.NoError(t, r.Client.Del(ctx, prefix+"paused").Err())

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
	require.Equal(t, []string{info.ID}, r.Client.LRange(ctx, prefix+"active", 0, -1).Val())
	score, err := r.Client.ZScore(ctx, prefix+"lease", info.ID).Result()
	require.NoError(t, err)
	now := float64(time.Now().Unix())
	require.InDelta(t, now+30, score, 3, "the lease expires 30 s from now, in Unix seconds")
	close(release)
}
