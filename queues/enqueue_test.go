package queues_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/queues"
)

// failNth fails the nth Redis command that match picks, before it is
// sent, with errFailed.
type failNth struct {
	n     int64
	match func(redis.Cmder) bool
	seen  atomic.Int64
}

var errFailed = errors.New("redis: connection lost (test)")

func (f *failNth) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failNth) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (f *failNth) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f.match(cmd) && f.seen.Add(1) == f.n {
			cmd.SetErr(errFailed)
			return errFailed
		}
		return next(ctx, cmd)
	}
}

// isAsynqEnqueue matches asynq's client enqueuing one job: its script
// with a job's hash and its queue's pending list as keys. (Only EVALSHA:
// an EVAL follows it when Redis does not have the script yet.)
func isAsynqEnqueue(cmd redis.Cmder) bool {
	args := cmd.Args()
	return strings.EqualFold(cmd.Name(), "evalsha") && len(args) > 4 && fmt.Sprint(args[2]) == "2" && strings.HasSuffix(fmt.Sprint(args[4]), ":pending")
}

// isDoorCall matches a call of either of the door's scripts.
func isDoorCall(cmd redis.Cmder) bool {
	fast, general := queues.DoorScripts()
	args := cmd.Args()
	if len(args) < 2 || !strings.EqualFold(cmd.Name(), "evalsha") {
		return false
	}
	return args[1] == fast || args[1] == general
}

// clientFailing returns a client of h's pools whose Redis fails the nth
// command match picks.
func (h *harness) clientFailing(n int64, match func(redis.Cmder) bool) *queues.Client {
	h.t.Helper()
	rdb := redis.NewClient(h.redis.Options)
	h.t.Cleanup(func() { _ = rdb.Close() })
	rdb.AddHook(&failNth{n: n, match: match})
	c, err := queues.NewClient(rdb, h.cfg)
	require.NoError(h.t, err)
	return c
}

// A Redis error in the middle of a batch stops it, and the results that
// come with the error say exactly what is in Redis: the jobs written
// before it (at the door and through asynq) Enqueued, the rest
// NotEnqueued, a repeated ID as its first. Enqueuing the NotEnqueued ones
// again finishes the batch.
func TestEnqueueManyStopsMidBatch(t *testing.T) {
	t.Parallel()
	mail := queues.PoolConfig{Name: "mail", Size: 1, JobTypes: []string{"mail"}, Tiers: []string{"regulatory", "close", "adhoc"}}
	h := newHarness(t, batchPool(10, nil), mail)
	ctx := context.Background()
	req := func(jobType, tier, id string) queues.Request {
		return queues.Request{JobType: jobType, Payload: []byte(`{}`), Options: queues.EnqueueOptions{Tier: tier, ID: id}}
	}
	batch := []queues.Request{
		req("report", "regulatory", "d1"), // the door's, written first
		req("mail", "close", "m1"),
		req("mail", "regulatory", "m2"),
		req("mail", "adhoc", "m3"),
		req("mail", "close", "m4"),
		req("mail", "close", "m1"), // a repeat of 1
		req("mail", "adhoc", "m3"), // a repeat of 3
		req("mail", "regulatory", ""),
	}
	// The mail pool is strict: one stream, highest tier first: m2, the
	// one without an ID, m1, then m4, whose call fails, and m3.
	c := h.clientFailing(4, isAsynqEnqueue)
	res, err := c.EnqueueMany(ctx, batch)
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), "enqueue mail: "), err.Error())
	require.ErrorContains(t, err, errFailed.Error(), "asynq passes on the text of Redis's error")
	require.Len(t, res, len(batch))
	var outcomes []queues.EnqueueOutcome
	for _, r := range res {
		outcomes = append(outcomes, r.Outcome)
	}
	require.Equal(t, []queues.EnqueueOutcome{queues.Enqueued, queues.Enqueued, queues.Enqueued, queues.NotEnqueued, queues.NotEnqueued,
		queues.Duplicate, queues.NotEnqueued, queues.Enqueued}, outcomes)
	require.Equal(t, res[1].Queue, res[5].Queue, "a repeat says where its first is")
	require.NotEmpty(t, res[7].ID)

	// Exactly the Enqueued jobs are in Redis.
	inRedis := map[string]bool{}
	for _, pool := range []string{"batch", "mail"} {
		p, err := h.client.Pool(pool)
		require.NoError(t, err)
		for _, q := range p.Queues() {
			ids, err := h.redis.Client.LRange(ctx, "asynq:{"+q+"}:pending", 0, -1).Result()
			require.NoError(t, err)
			for _, id := range ids {
				inRedis[q+"/"+id] = true
			}
		}
	}
	named := map[string]bool{}
	var again []queues.Request
	for i, r := range res {
		switch r.Outcome {
		case queues.Enqueued:
			named[r.Queue+"/"+r.ID] = true
		case queues.NotEnqueued:
			again = append(again, batch[i])
		}
	}
	require.Equal(t, inRedis, named)
	require.Equal(t, "not enqueued", queues.NotEnqueued.String())

	res, err = h.client.EnqueueMany(ctx, again)
	require.NoError(t, err)
	for _, r := range res {
		require.NotEqual(t, queues.NotEnqueued, r.Outcome)
	}
	require.Equal(t, 1, h.backlog("batch"))
	exists, err := h.client.Exists(ctx, "mail", []string{"m1", "m2", "m3", "m4"})
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, true, true}, exists)
}

// When the door's step fails, nothing of the batch was written, and every
// result says so; the locks are released, so the same IDs go in at once.
func TestEnqueueManyDoorFails(t *testing.T) {
	t.Parallel()
	mail := queues.PoolConfig{Name: "mail", Size: 1, JobTypes: []string{"mail"}}
	h := newHarness(t, batchPool(10, nil), mail)
	ctx := context.Background()
	batch := []queues.Request{
		{JobType: "mail", Options: queues.EnqueueOptions{ID: "m1"}},
		{JobType: "report", Options: queues.EnqueueOptions{Tier: "close", ID: "d1"}},
		{JobType: "report", Options: queues.EnqueueOptions{Tier: "adhoc"}},
	}
	c := h.clientFailing(1, isDoorCall)
	res, err := c.EnqueueMany(ctx, batch)
	require.ErrorIs(t, err, errFailed)
	require.Len(t, res, 3)
	for _, r := range res {
		require.Equal(t, queues.NotEnqueued, r.Outcome)
	}
	require.Zero(t, h.backlog("batch"))
	exists, err := h.client.Exists(ctx, "mail", []string{"m1"})
	require.NoError(t, err)
	require.Equal(t, []bool{false}, exists)

	// Were a lock left, this would wait for it to lapse (a minute).
	soon, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res, err = c.EnqueueMany(soon, batch)
	require.NoError(t, err)
	for _, r := range res {
		require.Equal(t, queues.Enqueued, r.Outcome)
	}
}
