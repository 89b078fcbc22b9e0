package app

import (
	"context"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
)

// TestTaskKeyLayout guards the one piece of asynq's internal key layout the
// enqueuer reads directly: a task's hash and its "state" field. An asynq
// upgrade that moves them fails here, not in production.
func TestTaskKeyLayout(t *testing.T) {
	r := testredis.New(t)
	q := r.Namespace(t) + ":batch:close"
	c := asynq.NewClientFromRedisClient(r.Client)
	defer c.Close()
	_, err := c.Enqueue(asynq.NewTask("report:run", nil), asynq.Queue(q), asynq.TaskID("report:x:2026-10"))
	require.NoError(t, err)
	state, err := r.Client.HGet(context.Background(), taskKey(q, "report:x:2026-10"), "state").Result()
	require.NoError(t, err)
	require.Equal(t, "pending", state)
}
