package queues_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
	"github.com/lci-labs/compartment/queues/queuestest"
)

// outage is a go-redis hook that refuses every command of its client while
// down is set, as a stopped Redis or a dead master would, and counts the
// commands refused after ended is set.
type outage struct {
	down, ended atomic.Bool
	refused     atomic.Int64 // refused after ended
}

var errRefused = errors.New("dial tcp 127.0.0.1:1: connect: connection refused")

func (o *outage) DialHook(next redis.DialHook) redis.DialHook { return next }

func (o *outage) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if o.down.Load() {
			if o.ended.Load() {
				o.refused.Add(1)
			}
			cmd.SetErr(errRefused)
			return errRefused
		}
		return next(ctx, cmd)
	}
}

func (o *outage) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if o.down.Load() {
			if o.ended.Load() {
				o.refused.Add(1)
			}
			for _, c := range cmds {
				c.SetErr(errRefused)
			}
			return errRefused
		}
		return next(ctx, cmds)
	}
}

// runTimes records the run time of each job that finished.
type runTimes struct{ got chan time.Duration }

func (o runTimes) JobStarted(queues.JobStart) {}

func (o runTimes) JobFinished(e queues.JobEnd) {
	if e.Started {
		o.got <- e.Run
	}
}

// TestOutcomeWaitsForRedis: a job that ends while Redis does not answer is
// marked done as soon as Redis answers again, and runs once. asynq v0.26
// writes a job's outcome once and retries a failed write with a context it
// has already cancelled, so without the hold the job would stay active
// until its lease lapsed and asynq's recoverer ran it a second time, a
// minute or two later. With a cluster-wide cap, the job's slot is freed
// then too, not when its lease in the gate lapses. With a circuit breaker,
// the wait does not count as the job's run time: a job that ran under the
// breaker's slow_call is not a slow call however long it waited, and the
// run time observed (compartment_job_run_seconds) is the handler's.
func TestOutcomeWaitsForRedis(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		scope   queues.Scope
		breaker *queues.BreakerConfig
	}{
		{"process", queues.ScopeProcess, nil},
		{"cluster", queues.ScopeCluster, nil},
		// One slow call of one would open the breaker.
		{"breaker", queues.ScopeProcess, &queues.BreakerConfig{MinCalls: 1, FailureRatio: 1, SlowCall: 1500 * time.Millisecond}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := testredis.New(t)
			cfg := queues.Config{
				Namespace:       r.Namespace(t),
				ShutdownTimeout: 5 * time.Second,
				Pools: []queues.PoolConfig{{Name: "batch", Size: 1, Scope: c.scope, JobTypes: []string{"report"},
					PollInterval: 20 * time.Millisecond, Breaker: c.breaker}},
				Logger: slog.New(slog.DiscardHandler),
			}
			enq, err := queues.NewClient(r.Client, cfg)
			require.NoError(t, err)

			// The runner has a client of its own, whose commands the
			// outage refuses; the test reads Redis through r.Client.
			rdb := r.Connect()
			t.Cleanup(func() { _ = rdb.Close() })
			o := &outage{}
			rdb.AddHook(o)

			var runs atomic.Int32
			var endedAt atomic.Int64
			started := make(chan struct{}, 1)
			finish := make(chan struct{})
			handlers := queues.NewHandlers()
			handlers.HandleFunc("report", func(ctx context.Context, _ *asynq.Task) error {
				runs.Add(1)
				began := time.Now()
				select {
				case started <- struct{}{}:
				default:
				}
				select {
				case <-finish:
				case <-ctx.Done():
					return ctx.Err()
				}
				// A report: it ran for more than a second (and under
				// the breaker's slow_call).
				select {
				case <-time.After(time.Until(began.Add(1200 * time.Millisecond))):
				case <-ctx.Done():
					return ctx.Err()
				}
				endedAt.Store(time.Now().UnixNano())
				o.ended.Store(true)
				return nil
			})
			cfg.Handlers = handlers
			observed := runTimes{got: make(chan time.Duration, 1)}
			cfg.Observer = observed
			runner, err := queues.NewClient(rdb, cfg)
			require.NoError(t, err)
			require.NoError(t, runner.Start(context.Background()))
			t.Cleanup(func() { require.NoError(t, runner.Stop(context.Background())) })

			res, err := enq.Enqueue(context.Background(), "report", []byte(`{}`), queues.EnqueueOptions{})
			require.NoError(t, err)
			select {
			case <-started:
			case <-time.After(30 * time.Second):
				t.Fatal("the job did not start")
			}
			o.down.Store(true)
			close(finish)
			// Down for at least 800 ms after the job ended: with the
			// wait counted as run time, the job would pass slow_call.
			testwait.For(t, 10*time.Second, "Redis to refuse commands for a while after the job ended", func() bool {
				at := endedAt.Load()
				return o.refused.Load() >= 3 && at != 0 && time.Since(time.Unix(0, at)) >= 800*time.Millisecond
			})
			o.down.Store(false)

			insp := asynq.NewInspectorFromRedisClient(r.Client)
			defer insp.Close()
			leases, _ := queuestest.GateKeys(r.Client, cfg.Namespace, "batch")
			// Without the hold the job stays active for 30 s and more,
			// and its cluster-wide slot for 15 s.
			testwait.For(t, 5*time.Second, "the job to be marked done and its slot freed", func() bool {
				_, err := insp.GetTaskInfo(res.Queue, res.ID)
				return errors.Is(err, asynq.ErrTaskNotFound) && r.Client.ZCard(context.Background(), leases).Val() == 0
			})
			require.Equal(t, int32(1), runs.Load(), "the job ran once")
			select {
			case run := <-observed.got:
				require.Less(t, run, 1800*time.Millisecond, "the run time observed counts the wait for Redis")
			case <-time.After(5 * time.Second):
				t.Fatal("the observer heard of no finished job")
			}
			if c.breaker != nil {
				st, err := enq.Breaker(context.Background(), "batch")
				require.NoError(t, err)
				require.Equal(t, queues.BreakerClosed, st.State, "a job of 1.2 s counted as slower than 1.5 s: %s", st.Why)
			}
		})
	}
}
