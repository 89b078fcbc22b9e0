package queues_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/queues"
)

// TestOutageBackoffSlowsFailingCalls: while Redis cannot be reached, each
// failed call waits longer before it returns (so a retry loop cannot spin);
// answers from Redis, errors included, never wait.
func TestOutageBackoffSlowsFailingCalls(t *testing.T) {
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer down.Close()
	down.AddHook(queues.NewOutageBackoff())
	ctx := context.Background()
	start := time.Now()
	for range 4 {
		require.Error(t, down.Ping(ctx).Err())
	}
	require.GreaterOrEqual(t, time.Since(start), (50+100+200+400)*time.Millisecond, "4 failures wait 50+100+200+400ms")

	// A cancelled context ends the wait at once.
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	start = time.Now()
	require.Error(t, down.Ping(cctx).Err())
	require.Less(t, time.Since(start), 900*time.Millisecond)

	r := testredis.New(t)
	up := redis.NewClient(r.Options)
	defer up.Close()
	up.AddHook(queues.NewOutageBackoff())
	ns := r.Namespace(t)
	require.NoError(t, up.Set(ctx, ns+":k", "v", time.Minute).Err())
	defer up.Del(ctx, ns+":k")
	start = time.Now()
	for range 20 {
		require.Error(t, up.LPush(ctx, ns+":k", "x").Err(), "WRONGTYPE: an answer from Redis")
		require.ErrorIs(t, up.Get(ctx, ns+":missing").Err(), redis.Nil)
	}
	require.Less(t, time.Since(start), 2*time.Second, "replies from Redis never wait")
}
