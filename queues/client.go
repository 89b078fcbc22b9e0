package queues

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// ErrDuplicate is matched when a job with the same ID is already queued or
// running (asynq's TaskID conflict).
var ErrDuplicate = errors.New("job with this ID is already queued or running")

// Client enqueues jobs into their pool's queues: it routes a job type to its
// pool, picks the tier's queue, and applies the pool's timeout and retry
// limit. It is safe for concurrent use.
type Client struct {
	pools *Registry
	c     *asynq.Client
}

// NewClient returns a client for the pools in reg over rdb. Close does not
// close rdb.
func NewClient(reg *Registry, rdb redis.UniversalClient) *Client {
	return &Client{pools: reg, c: asynq.NewClientFromRedisClient(rdb)}
}

// Close releases the client. It does not close the Redis client it was given.
func (c *Client) Close() error { return c.c.Close() }

// EnqueueOptions refine one enqueue.
type EnqueueOptions struct {
	// Tier is the priority tier, for a pool with tiers. Defaults to the
	// priorities file's default tier. Must be empty for a pool without tiers.
	Tier string
	// ID makes the job unique while it is queued or running: a second job
	// with the same ID is refused with ErrDuplicate. Defaults to a random ID.
	ID string
	// ProcessIn delays the job. Defaults to 0 (ready now).
	ProcessIn time.Duration
	// Retention keeps the finished job visible (as completed) for this long.
	// Defaults to 0 (deleted when done).
	Retention time.Duration
}

// Enqueue puts a job of jobType into its pool's queue for the tier.
func (c *Client) Enqueue(ctx context.Context, jobType string, payload []byte, o EnqueueOptions) (*asynq.TaskInfo, error) {
	task, opts, err := c.Task(jobType, payload, o)
	if err != nil {
		return nil, err
	}
	info, err := c.c.EnqueueContext(ctx, task, opts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil, fmt.Errorf("%w: %q", ErrDuplicate, o.ID)
	}
	if err != nil {
		return nil, fmt.Errorf("enqueue %s: %w", jobType, err)
	}
	return info, nil
}

// Task builds the asynq task and options Enqueue would use, for callers that
// enqueue through asynq directly.
func (c *Client) Task(jobType string, payload []byte, o EnqueueOptions) (*asynq.Task, []asynq.Option, error) {
	p, err := c.pools.Route(jobType)
	if err != nil {
		return nil, nil, err
	}
	tier := o.Tier
	if tier == "" && p.tiers != nil {
		tier = c.pools.policy.Default()
	}
	queue, err := p.QueueFor(tier)
	if err != nil {
		return nil, nil, err
	}
	pc := p.Config()
	// asynq counts a worker crash as a retry; the runner counts real
	// failures against max_retry itself, so asynq's limit leaves room for
	// CrashRetries crashes on top (see Runner).
	opts := []asynq.Option{asynq.Queue(queue), asynq.MaxRetry(*pc.MaxRetry + CrashRetries), asynq.Timeout(pc.JobTimeout)}
	if o.ID != "" {
		opts = append(opts, asynq.TaskID(o.ID))
	}
	if o.ProcessIn > 0 {
		opts = append(opts, asynq.ProcessIn(o.ProcessIn))
	}
	if o.Retention > 0 {
		opts = append(opts, asynq.Retention(o.Retention))
	}
	return asynq.NewTask(jobType, payload), opts, nil
}
