package queues

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/priority"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

func promoteClient(t *testing.T, pc PoolConfig) (*Client, *testredis.Redis) {
	t.Helper()
	r := testredis.New(t)
	tiers, err := priority.New(priority.Config{Tiers: []string{"regulatory", "close", "adhoc"}, Default: "adhoc"})
	require.NoError(t, err)
	c, err := NewClient(r.Client, Config{Namespace: r.Namespace(t), Tiers: tiers, Pools: []PoolConfig{pc}})
	require.NoError(t, err)
	return c, r
}

// messageFields returns the string fields of an asynq task message by
// field number.
func messageFields(t *testing.T, msg string) map[protowire.Number]string {
	t.Helper()
	out := map[protowire.Number]string{}
	b := []byte(msg)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		require.Positive(t, n)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		require.Positive(t, m)
		if typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[n:])
			out[num] = string(v)
		}
		b = b[n+m:]
	}
	return out
}

// What refers to a job by queue and ID moves with it: its failure count,
// the circuit breaker's suspects and late entries, and asynq's unique lock
// of a job enqueued with asynq.Unique (the lock keeps its TTL).
func TestPromoteMovesWhatNamesTheQueue(t *testing.T) {
	t.Parallel()
	c, r := promoteClient(t, PoolConfig{Name: "batch", Size: 1, JobTypes: []string{"report:run"}, Tiers: []string{"regulatory", "close", "adhoc"}})
	ctx := context.Background()
	ns := c.Namespace()
	adhoc, regulatory := QueueName(ns, "batch", "adhoc"), QueueName(ns, "batch", "regulatory")

	aq := asynq.NewClientFromRedisClient(r.Client)
	_, err := aq.EnqueueContext(ctx, asynq.NewTask("report:run", []byte("u")), asynq.Queue(adhoc), asynq.TaskID("u"), asynq.Unique(time.Hour))
	require.NoError(t, err)
	oldLock := messageFields(t, r.Client.HGet(ctx, rdb.TaskKey(adhoc, "u"), "msg").Val())[10]
	require.Equal(t, rdb.QueueKey(adhoc, "unique:report:run:"), oldLock[:len(rdb.QueueKey(adhoc, "unique:report:run:"))])
	newLock := rdb.QueueKey(regulatory, oldLock[len(rdb.QueueKey(adhoc, "")):])

	_, _, suspects, _ := rdb.NewKeyspace(ns, false).BreakerKeys("batch")
	late := rdb.NewKeyspace(ns, false).BreakerLateKey("batch")
	require.NoError(t, r.Client.Set(ctx, rdb.NewKeyspace(ns, false).FailureCountKey(adhoc, "u"), 2, time.Hour).Err())
	require.NoError(t, r.Client.Set(ctx, rdb.NewKeyspace(ns, false).FailureCountKey(regulatory, "u"), 9, time.Hour).Err(), "a stale count of an earlier job")
	require.NoError(t, r.Client.ZAdd(ctx, suspects, redis.Z{Score: 123, Member: "u@" + adhoc}).Err())
	require.NoError(t, r.Client.ZAdd(ctx, late, redis.Z{Score: 456, Member: "u@" + adhoc}).Err())

	res, err := c.Promote(ctx, "report:run", "u", "regulatory")
	require.NoError(t, err)
	require.True(t, res.Moved)

	fields := messageFields(t, r.Client.HGet(ctx, rdb.TaskKey(regulatory, "u"), "msg").Val())
	require.Equal(t, regulatory, fields[4])
	require.Equal(t, newLock, fields[10])
	require.Equal(t, "u", fields[3])
	require.Equal(t, "u", fields[2])
	require.Equal(t, newLock, r.Client.HGet(ctx, rdb.TaskKey(regulatory, "u"), "unique_key").Val())
	require.Zero(t, r.Client.Exists(ctx, oldLock, rdb.TaskKey(adhoc, "u"), rdb.NewKeyspace(ns, false).FailureCountKey(adhoc, "u")).Val())
	require.Equal(t, "u", r.Client.Get(ctx, newLock).Val())
	require.Greater(t, r.Client.TTL(ctx, newLock).Val(), 50*time.Minute, "the lock keeps its TTL")
	require.Equal(t, "2", r.Client.Get(ctx, rdb.NewKeyspace(ns, false).FailureCountKey(regulatory, "u")).Val())
	require.Equal(t, []string{"u@" + regulatory}, r.Client.ZRange(ctx, suspects, 0, -1).Val())
	require.Equal(t, float64(123), r.Client.ZScore(ctx, suspects, "u@"+regulatory).Val())
	require.Equal(t, float64(456), r.Client.ZScore(ctx, late, "u@"+regulatory).Val())
	require.True(t, r.Client.SIsMember(ctx, rdb.AllQueuesKey, regulatory).Val())

	// asynq's own enqueue sees the lock in its new queue.
	_, err = aq.EnqueueContext(ctx, asynq.NewTask("report:run", []byte("u")), asynq.Queue(regulatory), asynq.Unique(time.Hour))
	require.ErrorIs(t, err, asynq.ErrDuplicateTask)
}

// A job written by the pool's door (the engine's own encoding of asynq's
// message) moves the same way, and the door's backlog is unchanged.
func TestPromoteDoorJob(t *testing.T) {
	t.Parallel()
	c, r := promoteClient(t, PoolConfig{Name: "batch", Size: 1, JobTypes: []string{"report:run"}, Tiers: []string{"regulatory", "close", "adhoc"}, MaxBacklog: 10})
	ctx := context.Background()
	res, err := c.Enqueue(ctx, "report:run", []byte("d"), EnqueueOptions{ID: "d", Tier: "close"})
	require.NoError(t, err)
	p, err := c.Promote(ctx, "report:run", "d", "regulatory")
	require.NoError(t, err)
	require.True(t, p.Moved)
	info, err := c.insp.GetTaskInfo(p.Queue, "d")
	require.NoError(t, err)
	require.Equal(t, "d", string(info.Payload))
	require.Equal(t, p.Queue, info.Queue)
	require.NotEqual(t, res.Queue, p.Queue)
	n := int64(0)
	for _, q := range c.pools().pools[0].queues {
		n += r.Client.LLen(ctx, rdb.PendingKey(q)).Val()
	}
	require.Equal(t, int64(1), n, "one job in the backlog")
}

// A job whose ID is also in the target queue (written there by something
// that does not take the enqueue lock) is not moved: nothing changes.
func TestPromoteConflict(t *testing.T) {
	t.Parallel()
	c, r := promoteClient(t, PoolConfig{Name: "batch", Size: 1, JobTypes: []string{"report:run"}, Tiers: []string{"regulatory", "close", "adhoc"}})
	ctx := context.Background()
	ns := c.Namespace()
	adhoc, closeQ := QueueName(ns, "batch", "adhoc"), QueueName(ns, "batch", "close")
	aq := asynq.NewClientFromRedisClient(r.Client)
	for _, q := range []string{adhoc, closeQ} {
		_, err := aq.EnqueueContext(ctx, asynq.NewTask("report:run", []byte(q)), asynq.Queue(q), asynq.TaskID("x"))
		require.NoError(t, err)
	}
	// The highest tier's copy is the one found: close's, moved to adhoc.
	_, err := c.Promote(ctx, "report:run", "x", "adhoc")
	require.ErrorContains(t, err, "a job with the same ID is already in the target queue; nothing was moved")
	for _, q := range []string{adhoc, closeQ} {
		require.Equal(t, []string{"x"}, r.Client.LRange(ctx, rdb.PendingKey(q), 0, -1).Val())
		require.Equal(t, q, messageFields(t, r.Client.HGet(ctx, rdb.TaskKey(q, "x"), "msg").Val())[4])
	}
}

// retarget copies every field but the queue (and a unique lock's key) byte
// for byte, and refuses a message that does not name the job's queue.
func TestRetarget(t *testing.T) {
	t.Parallel()
	p := &Pool{cfg: PoolConfig{JobTimeout: time.Minute}}
	msg := taskMessage(p, "ns:batch:adhoc", "id1", Request{JobType: "report:run", Payload: []byte{0, 1, 2}}, time.Unix(1, 0))
	out, lock, err := rdb.Retarget(msg, "ns:batch:adhoc", "ns:batch:regulatory", time.Time{})
	require.NoError(t, err)
	require.Nil(t, lock)
	require.Equal(t, taskMessage(p, "ns:batch:regulatory", "id1", Request{JobType: "report:run", Payload: []byte{0, 1, 2}}, time.Unix(1, 0)), out)

	// A pending job's wait restarts: its ready-at header says when it was
	// promoted, as if it had been enqueued into the new tier then.
	out, _, err = rdb.Retarget(msg, "ns:batch:adhoc", "ns:batch:regulatory", time.Unix(5, 0))
	require.NoError(t, err)
	require.Equal(t, taskMessage(p, "ns:batch:regulatory", "id1", Request{JobType: "report:run", Payload: []byte{0, 1, 2}}, time.Unix(5, 0)), out)

	// A job's trace headers (a long one among them: its entry's length
	// takes two bytes) move with it, byte for byte.
	trace := []string{"traceparent", "00-0102-0405-01", "tracestate", "v=" + strings.Repeat("x", 300)}
	req := Request{JobType: "report:run", Payload: []byte{0, 1, 2}}
	traced := string(appendTaskMessage(nil, p, "ns:batch:adhoc", "id1", req, time.Unix(1, 0), trace))
	out, _, err = rdb.Retarget(traced, "ns:batch:adhoc", "ns:batch:regulatory", time.Unix(5, 0))
	require.NoError(t, err)
	require.Equal(t, string(appendTaskMessage(nil, p, "ns:batch:regulatory", "id1", req, time.Unix(5, 0), trace)), out)

	_, _, err = rdb.Retarget(msg, "ns:batch:close", "ns:batch:regulatory", time.Time{})
	require.ErrorContains(t, err, `names queue "ns:batch:adhoc", but the job is in "ns:batch:close"`)
	_, _, err = rdb.Retarget(msg[:len(msg)-1], "ns:batch:adhoc", "ns:batch:regulatory", time.Time{})
	require.Error(t, err)
}
