package queues

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Backoff limits of OutageBackoff.
const (
	outageBackoffMin = 50 * time.Millisecond
	outageBackoffMax = time.Second
)

// OutageBackoff is a go-redis hook that slows a client down while Redis is
// unreachable. asynq's dequeue loop retries at once after a failed dequeue,
// and go-redis fails fast while it cannot dial, so without this every pool
// would spin a CPU core for as long as Redis is down. With it, each failed
// call waits (50 ms, doubling to 1 s while failures continue) before it
// returns its error; the first call that succeeds resets the wait. Replies
// that Redis itself sends (errors such as WRONGTYPE, or nil) never wait.
//
// Add it to the client the runner and its pools share:
//
//	rdb.AddHook(queues.NewOutageBackoff())
type OutageBackoff struct {
	failures atomic.Int64
}

// NewOutageBackoff returns the hook.
func NewOutageBackoff() *OutageBackoff { return &OutageBackoff{} }

// DialHook passes dials through unchanged; their errors reach ProcessHook.
func (b *OutageBackoff) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook waits after a command failed for want of a connection.
func (b *OutageBackoff) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		b.after(ctx, err)
		return err
	}
}

// ProcessPipelineHook waits after a pipeline failed for want of a
// connection.
func (b *OutageBackoff) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		b.after(ctx, err)
		return err
	}
}

func (b *OutageBackoff) after(ctx context.Context, err error) {
	if !connectionError(err) {
		if err == nil || isRedisReply(err) {
			b.failures.Store(0)
		}
		return
	}
	n := b.failures.Add(1)
	wait := outageBackoffMin << min(n-1, 5)
	wait = min(wait, outageBackoffMax)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// connectionError reports whether err means Redis could not be reached (as
// opposed to an answer from Redis, a cancelled context or a closed client).
func connectionError(err error) bool {
	if err == nil || isRedisReply(err) || errors.Is(err, redis.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed) || err.Error() == "EOF" ||
		errors.Is(err, redis.ErrPoolTimeout)
}

func isRedisReply(err error) bool {
	if errors.Is(err, redis.Nil) {
		return true
	}
	var re redis.Error
	return errors.As(err, &re)
}
