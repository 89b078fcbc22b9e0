package rdb

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Archived is one job asynq archived (failed for good).
type Archived struct {
	Queue, ID string
	// At is when it was archived (asynq's score, Unix seconds).
	At time.Time
}

// NewestArchived reads the n most recently archived jobs of each queue,
// newest first, in one pipelined round trip (one per node on a Redis
// Cluster). asynq's inspector lists them oldest first only.
func NewestArchived(ctx context.Context, rc redis.UniversalClient, queues []string, n int) ([][]Archived, error) {
	if n < 1 || len(queues) == 0 {
		return make([][]Archived, len(queues)), nil
	}
	pipe := rc.Pipeline()
	cmds := make([]*redis.ZSliceCmd, len(queues))
	for i, q := range queues {
		cmds[i] = pipe.ZRevRangeWithScores(ctx, archivedKey(q), 0, int64(n-1))
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, fmt.Errorf("read the archived jobs: %w", err)
	}
	out := make([][]Archived, len(queues))
	for i, cmd := range cmds {
		for _, z := range cmd.Val() {
			id, ok := z.Member.(string)
			if !ok {
				return nil, fmt.Errorf("read the archived jobs of %s: member %v is not a job ID", queues[i], z.Member)
			}
			out[i] = append(out[i], Archived{Queue: queues[i], ID: id, At: time.Unix(int64(z.Score), 0)})
		}
	}
	return out, nil
}
