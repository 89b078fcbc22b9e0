package rdb

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// QueueAnswers checks that the Redis node holding queue answers (on a
// Redis Cluster, the master of the queue's slot; through Sentinel, the
// master): a one-key read of the queue's active list, the key asynq
// writes a job's outcome to next. With queue "" it pings.
func QueueAnswers(ctx context.Context, rc redis.UniversalClient, queue string) error {
	if queue == "" {
		return rc.Ping(ctx).Err()
	}
	return rc.Exists(ctx, ActiveKey(queue)).Err()
}
