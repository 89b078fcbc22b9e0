package rdb

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The door's scripts (admit, admit_fast, door_take_back), the unique-ID
// locks (enqueue_lock_find, enqueue_unlock), promote, and the commands of
// the enqueue side. Every case works in a pool "batch" of three tiers, on
// its own namespace.

var doorTiers = []string{"regulatory", "close", "adhoc"}

func init() {
	for _, c := range []scriptCase{
		{script: "admit", name: "admitted", run: testAdmitAdmitted},
		{script: "admit", name: "scheduled job", run: testAdmitScheduled},
		{script: "admit", name: "refused for the backlog with each tier's room", run: testAdmitRefusedBacklog},
		{script: "admit", name: "refused for a rate with the time to wait", run: testAdmitRefusedRate},
		{script: "admit", name: "a caller key's rate has a key of its own", run: testAdmitCallerKeyRate},
		{script: "admit", name: "waiting line", run: testAdmitWaitingLine},
		{script: "admit", name: "replaces a finished job", run: testAdmitReplaces},
		{script: "admit", name: "ID taken meanwhile", run: testAdmitIDTaken},
		// On a Redis Cluster no call spans pools: the engine splits them.
		{script: "admit", name: "two pools in one request, all or nothing", run: testAdmitTwoPools, singleOnly: true},
		{script: "admit", name: "bad arguments are errors and touch nothing", run: testAdmitBadArgs},
		{script: "admit_fast", name: "admits in order up to the first that does not fit", run: testFastAdmitsInOrder},
		{script: "admit_fast", name: "hands over a stale bound, a waiting line and a rate", run: testFastHandsOver},
		{script: "admit_fast", name: "ID taken meanwhile", run: testFastIDTaken},
		{script: "door_take_back", name: "takes back waiting jobs only", run: testTakeBack},
		{script: "enqueue_lock_find", name: "locked, new and found", run: testLockFind},
		{script: "enqueue_lock_find", name: "a new job's stale failure counts go", run: testLockFindClearsCounts},
		{script: "enqueue_lock_find", name: "a batch larger than one call", run: testLockFindChunks},
		{script: "enqueue_unlock", name: "releases only its own locks", run: testUnlock},
		{script: "promote", name: "moved, with what names its queue", run: testPromoteMoved},
		{script: "promote", name: "scheduled keeps its due time, unique lock moves", run: testPromoteScheduled},
		{script: "promote", name: "not waiting, changed, gone, conflict", run: testPromoteNotMoved},
		{script: "door_commands", name: "leave the line, count refusals, read them back", run: testDoorCommands},
		{script: "job_commands", name: "publish, exists, find", run: testJobCommands},
	} {
		scriptCases = append(scriptCases, c)
	}
}

// doorFixture is a pool "batch" of three tiers with a door.
type doorFixture struct {
	t      *testing.T
	b      backend
	ctx    context.Context
	jobs   *Jobs
	door   *Door
	queues []string
}

// newDoor returns a fixture whose door has cfg (its Pool and Queues
// filled in), with a recount interval of a minute: a bound stays fresh for
// the whole case.
func newDoor(t *testing.T, b backend, cfg DoorConfig) *doorFixture {
	t.Helper()
	f := &doorFixture{t: t, b: b, ctx: context.Background(), jobs: NewJobs(b.RC, b.KS, time.Minute)}
	for _, tier := range doorTiers {
		f.queues = append(f.queues, b.KS.Queue("batch", tier))
	}
	cfg.Pool, cfg.Queues = "batch", f.queues
	if cfg.Limits == nil {
		cfg.Limits = []int{0, 0, 0}
	}
	f.door = NewDoor(b.KS, cfg)
	return f
}

// msg is a job's task message.
func msg(queue, id string) []byte {
	return AppendTask(nil, Task{Type: "report", ID: id, Queue: queue, Timeout: time.Minute, ReadyAt: 1})
}

// job is a job of the fixture's door, to be published in the call on a
// single Redis, before it on a cluster (as the engine does).
func (f *doorFixture) job(tier int, id string) AdmitJob {
	f.t.Helper()
	j := AdmitJob{Door: f.door, Tier: tier, ID: id, Msg: msg(f.queues[tier], id)}
	if f.b.Cluster {
		require.NoError(f.t, f.jobs.PublishQueue(f.ctx, f.queues[tier]))
	} else {
		j.Publish = true
	}
	return j
}

// backlogNeeds is a request's need per tier of the fixture's door.
func (f *doorFixture) admit(a AdmitArgs) []AdmitReply {
	f.t.Helper()
	if a.Now.IsZero() {
		a.Now = time.Now()
	}
	out, err := f.jobs.Admit(f.ctx, a)
	require.NoError(f.t, err)
	return out
}

// state returns the door state hash.
func (f *doorFixture) state() map[string]string {
	f.t.Helper()
	v, err := f.b.RC.HGetAll(f.ctx, f.door.state).Result()
	require.NoError(f.t, err)
	return v
}

// pending returns the IDs in each tier's pending list, oldest first.
func (f *doorFixture) pending() [][]string {
	f.t.Helper()
	out := make([][]string, len(f.queues))
	for k, q := range f.queues {
		ids, err := f.b.RC.LRange(f.ctx, PendingKey(q), 0, -1).Result()
		require.NoError(f.t, err)
		for i := len(ids) - 1; i >= 0; i-- {
			out[k] = append(out[k], ids[i])
		}
	}
	return out
}

// task returns a job's task hash.
func (f *doorFixture) task(queue, id string) map[string]string {
	f.t.Helper()
	v, err := f.b.RC.HGetAll(f.ctx, TaskKey(queue, id)).Result()
	require.NoError(f.t, err)
	return v
}

// redisMs is Redis's clock, in ms.
func (f *doorFixture) redisMs() int64 {
	f.t.Helper()
	now, err := f.b.RC.Time(f.ctx).Result()
	require.NoError(f.t, err)
	return now.UnixMilli()
}

// freshBound sets the door's bound of the backlog to est, counted now.
func (f *doorFixture) freshBound(est int) {
	f.t.Helper()
	require.NoError(f.t, f.b.RC.HSet(f.ctx, f.door.state, "est", est, "counted", f.redisMs()).Err())
}

func (f *doorFixture) queued(tier int, ids ...string) {
	f.t.Helper()
	for _, id := range ids {
		require.NoError(f.t, f.b.RC.LPush(f.ctx, PendingKey(f.queues[tier]), id).Err())
	}
}

// A request that fits is written: each job's hash (its message, pending,
// pending_since) and pending list, its queue in asynq's set, and the bound
// and rate in the door state. The next job is decided on the bound alone:
// a job that went around the door is not seen until the next count.
func testAdmitAdmitted(t *testing.T, b backend) {
	rate := Rate{Interval: time.Second, Burst: 10}
	f := newDoor(t, b, DoorConfig{Limits: []int{5, 5, 3}, Backlog: true, EnqueueRate: &rate})
	now := time.Unix(1700000000, 123456789)
	f.queued(1, "old") // counted by the first call
	replies := f.admit(AdmitArgs{Checks: []*Door{f.door}, Rates: []RateCheck{{Door: f.door, Rate: rate}}, Now: now,
		Requests: []AdmitRequest{{Backlog: [][]int{{1, 0, 1}}, Rates: []int{2}, Jobs: []AdmitJob{f.job(0, "a"), f.job(2, "b")}}}})
	require.Equal(t, []AdmitReply{{Written: []bool{true, true}}}, replies)
	require.Equal(t, [][]string{{"a"}, {"old"}, {"b"}}, f.pending())
	for tier, id := range map[int]string{0: "a", 2: "b"} {
		require.Equal(t, map[string]string{"msg": string(msg(f.queues[tier], id)), "state": "pending", "pending_since": "1700000000123456789"}, f.task(f.queues[tier], id))
		require.True(t, b.RC.SIsMember(f.ctx, AllQueuesKey, f.queues[tier]).Val())
	}
	st := f.state()
	require.Equal(t, "3", st["est"], "the exact count, 1, and the 2 admitted")
	counted, err := strconv.ParseInt(st["counted"], 10, 64)
	require.NoError(t, err)
	require.InDelta(t, f.redisMs(), counted, 5000)
	tat, err := strconv.ParseFloat(st["tat:enqueue"], 64)
	require.NoError(t, err)
	require.InDelta(t, float64(counted)+2000, tat, 1000, "two jobs at one a second")

	// On the bound: "went-around" is not counted.
	f.queued(1, "went-around")
	replies = f.admit(AdmitArgs{Checks: []*Door{f.door}, Rates: []RateCheck{{Door: f.door, Rate: rate}},
		Requests: []AdmitRequest{{Backlog: [][]int{{0, 1, 0}}, Rates: []int{1}, Jobs: []AdmitJob{f.job(1, "c")}}}})
	require.Equal(t, []AdmitReply{{Written: []bool{true}}}, replies)
	require.Equal(t, "4", f.state()["est"])
	require.Equal(t, st["counted"], f.state()["counted"], "not counted again")
}

// A job with a due time goes to its queue's scheduled set, scored by the
// Unix second it is due.
func testAdmitScheduled(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{Limits: []int{5, 5, 5}, Backlog: true})
	j := f.job(1, "later")
	j.ProcessAt = time.Unix(1900000000, 600000000)
	require.Equal(t, []AdmitReply{{Written: []bool{true}}},
		f.admit(AdmitArgs{Checks: []*Door{f.door}, Requests: []AdmitRequest{{Backlog: [][]int{{0, 1, 0}}, Jobs: []AdmitJob{j}}}}))
	require.Equal(t, map[string]string{"msg": string(j.Msg), "state": "scheduled"}, f.task(f.queues[1], "later"))
	z, err := b.RC.ZRangeWithScores(f.ctx, scheduledKey(f.queues[1]), 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []redis.Z{{Score: 1900000000, Member: "later"}}, z)
	require.Equal(t, [][]string{nil, nil, nil}, f.pending())
}

// A request that does not fit is refused on an exact count, with each
// tier's room (its limit, less the backlog and the request's higher
// tiers), and nothing is written, not even the count.
func testAdmitRefusedBacklog(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{Limits: []int{4, 4, 2}, Backlog: true})
	f.queued(2, "x1", "x2")
	replies := f.admit(AdmitArgs{Checks: []*Door{f.door},
		Requests: []AdmitRequest{{Backlog: [][]int{{1, 0, 2}}, Jobs: []AdmitJob{f.job(0, "a"), f.job(2, "b"), f.job(2, "c")}}}})
	require.Equal(t, []AdmitReply{{Backlog: &BacklogRefusal{Check: 0, Backlog: 2,
		Tiers: []TierRoom{{Room: 2, Need: 1}, {Room: 1, Need: 0}, {Room: 0, Need: 2}}}}}, replies)
	require.Equal(t, [][]string{nil, nil, {"x1", "x2"}}, f.pending())
	require.Empty(t, f.task(f.queues[0], "a"))
	require.Empty(t, f.state(), "a refusal writes nothing")
}

// A rate refuses the request that comes too soon and says when it would
// pass.
func testAdmitRefusedRate(t *testing.T, b backend) {
	rate := Rate{Interval: time.Hour, Burst: 1}
	f := newDoor(t, b, DoorConfig{JobTypeRates: map[string]Rate{"report": rate}})
	check := []RateCheck{{Door: f.door, JobType: "report", Rate: rate}}
	require.Equal(t, []AdmitReply{{Written: []bool{true}}},
		f.admit(AdmitArgs{Rates: check, Requests: []AdmitRequest{{Rates: []int{1}, Jobs: []AdmitJob{f.job(0, "a")}}}}))
	tat := f.state()["tat:type:report"]
	require.NotEmpty(t, tat)

	replies := f.admit(AdmitArgs{Rates: check, Requests: []AdmitRequest{{Rates: []int{1}, Jobs: []AdmitJob{f.job(0, "b")}}}})
	require.Len(t, replies, 1)
	require.Nil(t, replies[0].Backlog)
	require.NotNil(t, replies[0].Rate)
	require.Equal(t, 0, replies[0].Rate.Check)
	require.Greater(t, replies[0].Rate.RetryAfter, 59*time.Minute)
	require.LessOrEqual(t, replies[0].Rate.RetryAfter, time.Hour)
	require.Equal(t, [][]string{{"a"}, nil, nil}, f.pending())
	require.Equal(t, map[string]string{"tat:type:report": tat}, f.state(), "unchanged")
}

// A caller key's rate lives in a key of its own, which expires once the
// rate has recovered.
func testAdmitCallerKeyRate(t *testing.T, b backend) {
	rate := Rate{Interval: time.Minute, Burst: 2}
	f := newDoor(t, b, DoorConfig{})
	check := []RateCheck{{Door: f.door, Key: "tenant-a", Rate: rate}}
	require.Equal(t, []AdmitReply{{Written: []bool{true, true}}},
		f.admit(AdmitArgs{Rates: check, Requests: []AdmitRequest{{Rates: []int{2}, Jobs: []AdmitJob{f.job(0, "a"), f.job(1, "b")}}}}))
	key := b.KS.rateKey("batch", "key:tenant-a")
	ttl, err := b.RC.PTTL(f.ctx, key).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 100*time.Second, "two minutes of rate, less what has passed")
	require.LessOrEqual(t, ttl, 121*time.Second)
	require.Empty(t, f.state(), "not in the door state")

	replies := f.admit(AdmitArgs{Rates: check, Requests: []AdmitRequest{{Rates: []int{1}, Jobs: []AdmitJob{f.job(0, "c")}}}})
	require.NotNil(t, replies[0].Rate)
	require.Greater(t, replies[0].Rate.RetryAfter, 50*time.Second)
}

// A request refused for the backlog waits in line when it may: the room
// that appears is held for it against a newcomer that would fit, and when
// it asks again it is admitted and leaves the line.
func testAdmitWaitingLine(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{Limits: []int{2, 2, 2}, Backlog: true, Waits: true})
	waiting, data, _ := b.KS.doorKeys("batch")
	f.queued(1, "x")
	plan := AdmitArgs{Checks: []*Door{f.door}, Wait: true, Token: "w1", WaiterTTL: time.Minute,
		Requests: []AdmitRequest{{Backlog: [][]int{{2, 0, 0}}, Jobs: []AdmitJob{f.job(0, "p1"), f.job(0, "p2")}}}}
	replies := f.admit(plan)
	require.NotNil(t, replies[0].Backlog)
	require.Equal(t, 1, replies[0].Backlog.Backlog)
	require.Equal(t, []string{"w1"}, b.RC.ZRange(f.ctx, waiting, 0, -1).Val())
	exp, line, ok := strings.Cut(b.RC.HGet(f.ctx, data, "w1").Val(), "|")
	require.True(t, ok)
	require.Equal(t, "2,0,0", line, "its need per tier")
	expMs, err := strconv.ParseInt(exp, 10, 64)
	require.NoError(t, err)
	require.InDelta(t, f.redisMs()+60000, expMs, 5000)

	// Room for the plan: a newcomer that fits is refused, the room is the
	// waiter's.
	require.NoError(t, b.RC.Del(f.ctx, PendingKey(f.queues[1])).Err())
	replies = f.admit(AdmitArgs{Checks: []*Door{f.door}, Requests: []AdmitRequest{{Backlog: [][]int{{0, 0, 1}}, Jobs: []AdmitJob{f.job(2, "n")}}}})
	require.Equal(t, &BacklogRefusal{Backlog: 0, Tiers: []TierRoom{{Room: 0}, {Room: 0}, {Room: 0, Need: 1}}}, replies[0].Backlog)
	require.Empty(t, f.task(f.queues[2], "n"))

	replies = f.admit(plan)
	require.Equal(t, []AdmitReply{{Written: []bool{true, true}}}, replies)
	require.Equal(t, [][]string{{"p1", "p2"}, nil, nil}, f.pending())
	require.Zero(t, b.RC.Exists(f.ctx, waiting, data).Val(), "it left the line")
}

// A job replacing a finished one with its ID deletes it (its hash and its
// place in the completed set) in the same step.
func testAdmitReplaces(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{Limits: []int{5, 5, 5}, Backlog: true})
	q := f.queues[1]
	require.NoError(t, b.RC.HSet(f.ctx, TaskKey(q, "r"), "msg", "old", "state", "completed").Err())
	require.NoError(t, b.RC.ZAdd(f.ctx, completedKey(q), redis.Z{Score: 1, Member: "r"}).Err())
	j := f.job(1, "r")
	j.Replaces = &FinishedJob{Queue: q, State: "completed"}
	require.Equal(t, []AdmitReply{{Written: []bool{true}}},
		f.admit(AdmitArgs{Checks: []*Door{f.door}, Requests: []AdmitRequest{{Backlog: [][]int{{0, 1, 0}}, Jobs: []AdmitJob{j}}}}))
	require.Equal(t, "pending", f.task(q, "r")["state"])
	require.Equal(t, string(j.Msg), f.task(q, "r")["msg"])
	require.Zero(t, b.RC.ZCard(f.ctx, completedKey(q)).Val())
}

// A job whose ID another writer took meanwhile is not written, and the
// request is still admitted: the bound counts it, an upper bound.
func testAdmitIDTaken(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{Limits: []int{5, 5, 5}, Backlog: true})
	require.NoError(t, b.RC.HSet(f.ctx, TaskKey(f.queues[0], "t"), "msg", "theirs", "state", "pending").Err())
	require.Equal(t, []AdmitReply{{Written: []bool{false, true}}},
		f.admit(AdmitArgs{Checks: []*Door{f.door}, Requests: []AdmitRequest{{Backlog: [][]int{{2, 0, 0}}, Jobs: []AdmitJob{f.job(0, "t"), f.job(0, "u")}}}}))
	require.Equal(t, "theirs", f.task(f.queues[0], "t")["msg"])
	require.Equal(t, [][]string{{"u"}, nil, nil}, f.pending())
	require.Equal(t, "2", f.state()["est"])
}

// One request over two pools: the second is full, so nothing of the
// request is written in the first either.
func testAdmitTwoPools(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{Limits: []int{5, 5, 5}, Backlog: true})
	other := b.KS.Queue("orders", "")
	orders := NewDoor(b.KS, DoorConfig{Pool: "orders", Queues: []string{other}, Limits: []int{1}, Backlog: true})
	require.NoError(t, b.RC.LPush(f.ctx, PendingKey(other), "x").Err())
	replies := f.admit(AdmitArgs{Checks: []*Door{f.door, orders}, Requests: []AdmitRequest{{
		Backlog: [][]int{{1, 0, 0}, {1}},
		Jobs:    []AdmitJob{f.job(0, "a"), {Door: orders, ID: "o", Msg: msg(other, "o")}},
	}}})
	require.Equal(t, []AdmitReply{{Backlog: &BacklogRefusal{Check: 1, Backlog: 1, Tiers: []TierRoom{{Room: 0, Need: 1}}}}}, replies)
	require.Equal(t, [][]string{nil, nil, nil}, f.pending())
	require.Empty(t, f.state())
}

// Arguments that do not fit the door are errors, and nothing is written.
func testAdmitBadArgs(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{Limits: []int{5, 5, 5}, Backlog: true})
	for name, a := range map[string]AdmitArgs{
		"no request":      {Checks: []*Door{f.door}},
		"needs per tier":  {Checks: []*Door{f.door}, Requests: []AdmitRequest{{Backlog: [][]int{{1}}, Jobs: []AdmitJob{f.job(0, "a")}}}},
		"no such tier":    {Checks: []*Door{f.door}, Requests: []AdmitRequest{{Backlog: [][]int{{1, 0, 0}}, Jobs: []AdmitJob{{Door: f.door, Tier: 3, ID: "a"}}}}},
		"waiting, twice":  {Checks: []*Door{f.door}, Wait: true, Requests: []AdmitRequest{{Jobs: []AdmitJob{f.job(0, "a")}}, {Jobs: []AdmitJob{f.job(0, "b")}}}},
		"needs, no check": {Requests: []AdmitRequest{{Backlog: [][]int{{1, 0, 0}}, Jobs: []AdmitJob{f.job(0, "a")}}}},
	} {
		_, err := f.jobs.Admit(f.ctx, a)
		require.Error(t, err, name)
		require.True(t, strings.HasPrefix(err.Error(), "enqueue: "), err.Error())
	}
	if b.Cluster {
		_, err := f.jobs.Admit(f.ctx, AdmitArgs{Requests: []AdmitRequest{{Jobs: []AdmitJob{{Door: f.door, ID: "p", Publish: true}}}}})
		require.EqualError(t, err, `enqueue: job "p": on a Redis Cluster a queue is published before the call, not in it`)
	}
	require.Equal(t, [][]string{nil, nil, nil}, f.pending())
	require.Empty(t, f.state())
}

// The fast script admits jobs in order while each fits under the fresh
// bound, and stops at the first that does not: nothing of it or after it
// is written, even a job that would fit.
func testFastAdmitsInOrder(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{Limits: []int{3, 3, 2}, Backlog: true})
	f.freshBound(1)
	now := time.Unix(1700000000, 5)
	call := f.door.Fast("report").Call(3, now)
	for _, j := range []struct {
		tier int
		id   string
	}{{2, "a"}, {2, "b"}, {0, "c"}} {
		call.Add(j.tier, j.id, msg(f.queues[j.tier], j.id))
	}
	reply, err := f.jobs.AdmitFast(f.ctx, &call)
	require.NoError(t, err)
	require.Equal(t, 1, reply.Admitted())
	require.True(t, reply.Written(0))
	require.Equal(t, [][]string{nil, nil, {"a"}}, f.pending())
	require.Equal(t, map[string]string{"msg": string(msg(f.queues[2], "a")), "state": "pending", "pending_since": "1700000000000000005"}, f.task(f.queues[2], "a"))
	require.Equal(t, "2", f.state()["est"])

	bad := f.door.Fast("").Call(1, now)
	bad.Add(3, "x", nil)
	_, err = f.jobs.AdmitFast(f.ctx, &bad)
	require.EqualError(t, err, `enqueue: job "x": pool "batch" has no tier 3`)
}

// The fast script never decides a case it does not own: with a stale
// bound, with requests waiting in line, or at a rate's limit, it admits
// nothing (or stops), writes nothing more, and leaves it to the general
// script.
func testFastHandsOver(t *testing.T, b backend) {
	rate := Rate{Interval: time.Hour, Burst: 1}
	f := newDoor(t, b, DoorConfig{Limits: []int{3, 3, 3}, Backlog: true, Waits: true, EnqueueRate: &rate})
	try := func(ids ...string) FastReply {
		t.Helper()
		call := f.door.Fast("report").Call(len(ids), time.Now())
		for _, id := range ids {
			call.Add(1, id, msg(f.queues[1], id))
		}
		reply, err := f.jobs.AdmitFast(f.ctx, &call)
		require.NoError(t, err)
		return reply
	}
	// No bound yet, then a stale one.
	require.Zero(t, try("a").Admitted())
	require.NoError(t, b.RC.HSet(f.ctx, f.door.state, "est", 0, "counted", f.redisMs()-61000).Err())
	require.Zero(t, try("a").Admitted())
	// Someone waits in line.
	f.freshBound(0)
	waiting, _, _ := b.KS.doorKeys("batch")
	require.NoError(t, b.RC.ZAdd(f.ctx, waiting, redis.Z{Score: 1, Member: "w"}).Err())
	require.Zero(t, try("a").Admitted())
	require.NoError(t, b.RC.Del(f.ctx, waiting).Err())
	// The rate lets one through: the second is left.
	reply := try("a", "b")
	require.Equal(t, 1, reply.Admitted())
	require.Equal(t, [][]string{nil, {"a"}, nil}, f.pending())
	st := f.state()
	tat, err := strconv.ParseFloat(st["tat:enqueue"], 64)
	require.NoError(t, err)
	require.InDelta(t, float64(f.redisMs()+3600000), tat, 5000)
	require.Equal(t, "1", st["est"])
}

// A job whose ID is taken is admitted but not written.
func testFastIDTaken(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{Limits: []int{3, 3, 3}, Backlog: true})
	f.freshBound(0)
	require.NoError(t, b.RC.HSet(f.ctx, TaskKey(f.queues[0], "t"), "state", "active").Err())
	call := f.door.Fast("").Call(2, time.Now())
	call.Add(0, "t", msg(f.queues[0], "t"))
	call.Add(0, "u", msg(f.queues[0], "u"))
	reply, err := f.jobs.AdmitFast(f.ctx, &call)
	require.NoError(t, err)
	require.Equal(t, 2, reply.Admitted())
	require.Equal(t, []bool{false, true}, []bool{reply.Written(0), reply.Written(1)})
	require.Equal(t, [][]string{{"u"}, nil, nil}, f.pending())
	require.Equal(t, map[string]string{"state": "active"}, f.task(f.queues[0], "t"))
	require.Equal(t, "2", f.state()["est"])
}

// Taking back removes a pending or scheduled job the door wrote, and
// leaves one that started or is gone.
func testTakeBack(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{Limits: []int{5, 5, 5}, Backlog: true})
	q := f.queues[0]
	later := f.job(0, "s")
	later.ProcessAt = time.Now().Add(time.Hour)
	require.Equal(t, []AdmitReply{{Written: []bool{true, true, true}}},
		f.admit(AdmitArgs{Checks: []*Door{f.door}, Requests: []AdmitRequest{{Backlog: [][]int{{3, 0, 0}}, Jobs: []AdmitJob{f.job(0, "p"), later, f.job(0, "r")}}}}))
	// "r" starts: asynq moves it to the active list.
	require.NoError(t, b.RC.LRem(f.ctx, PendingKey(q), 0, "r").Err())
	require.NoError(t, b.RC.LPush(f.ctx, ActiveKey(q), "r").Err())
	require.NoError(t, b.RC.HSet(f.ctx, TaskKey(q, "r"), "state", "active").Err())

	taken, err := f.jobs.TakeBack(f.ctx, []QueuedJob{{q, "p"}, {q, "s"}, {q, "r"}, {q, "gone"}})
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, false, false}, taken)
	require.Zero(t, b.RC.Exists(f.ctx, TaskKey(q, "p"), TaskKey(q, "s")).Val())
	require.Zero(t, b.RC.LLen(f.ctx, PendingKey(q)).Val())
	require.Zero(t, b.RC.ZCard(f.ctx, scheduledKey(q)).Val())
	require.Equal(t, "active", f.task(q, "r")["state"])
}

// lockJob is a job of the fixture's pool, for the locks.
func (f *doorFixture) lockJob(id string, breaker bool) LockJob {
	return LockJob{Pool: "batch", ID: id, Queues: f.queues, Breaker: breaker}
}

// Each lock is taken unless another client holds it; a taken one's job
// is looked up in the pool's queues, highest tier first.
func testLockFind(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{})
	require.NoError(t, b.RC.HSet(f.ctx, TaskKey(f.queues[1], "found"), "state", "retry").Err())
	require.NoError(t, b.RC.HSet(f.ctx, TaskKey(f.queues[2], "found"), "state", "pending").Err())
	require.NoError(t, b.RC.Set(f.ctx, b.KS.enqueueLockKey("batch", "held"), "theirs", time.Minute).Err())
	found, err := f.jobs.LockAndFind(f.ctx, "mine", 30*time.Second, []LockJob{f.lockJob("new", false), f.lockJob("found", false), f.lockJob("held", false)})
	require.NoError(t, err)
	require.Equal(t, []Lookup{{}, {Queue: f.queues[1], State: "retry"}, {Locked: true}}, found)
	for id, holder := range map[string]string{"new": "mine", "found": "mine", "held": "theirs"} {
		require.Equal(t, holder, b.RC.Get(f.ctx, b.KS.enqueueLockKey("batch", id)).Val(), id)
	}
	ttl := b.RC.PTTL(f.ctx, b.KS.enqueueLockKey("batch", "new")).Val()
	require.Greater(t, ttl, 20*time.Second)
	require.LessOrEqual(t, ttl, 30*time.Second)

	// On a Redis Cluster a call takes one pool's jobs.
	_, err = f.jobs.LockAndFind(f.ctx, "mine", time.Minute, []LockJob{f.lockJob("x", false), {Pool: "orders", ID: "y", Queues: []string{b.KS.Queue("orders", "")}}})
	if b.Cluster {
		require.EqualError(t, err, `enqueue locks: on a Redis Cluster one call takes one pool's jobs, got pools "batch" and "orders"`)
		require.Zero(t, b.RC.Exists(f.ctx, b.KS.enqueueLockKey("batch", "x")).Val())
	} else {
		require.NoError(t, err)
	}
}

// A new job in a pool with a breaker starts with no failures: counts left
// under its ID are deleted; a job found keeps its own.
func testLockFindClearsCounts(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{})
	counted := b.KS.breakerCountedKey("batch")
	for _, id := range []string{"new", "found"} {
		for _, q := range f.queues {
			require.NoError(t, b.RC.Set(f.ctx, b.KS.FailureCountKey(q, id), 2, time.Hour).Err())
			require.NoError(t, b.RC.ZAdd(f.ctx, counted, redis.Z{Score: 1, Member: Member{ID: id, Queue: q}.String()}).Err())
		}
	}
	require.NoError(t, b.RC.HSet(f.ctx, TaskKey(f.queues[0], "found"), "state", "retry").Err())
	found, err := f.jobs.LockAndFind(f.ctx, "mine", time.Minute, []LockJob{f.lockJob("new", true), f.lockJob("found", true)})
	require.NoError(t, err)
	require.Equal(t, []Lookup{{}, {Queue: f.queues[0], State: "retry"}}, found)
	for _, q := range f.queues {
		require.Zero(t, b.RC.Exists(f.ctx, b.KS.FailureCountKey(q, "new")).Val())
		require.Equal(t, "2", b.RC.Get(f.ctx, b.KS.FailureCountKey(q, "found")).Val())
	}
	var left []string
	for _, q := range f.queues {
		left = append(left, Member{ID: "found", Queue: q}.String())
	}
	require.ElementsMatch(t, left, b.RC.ZRange(f.ctx, counted, 0, -1).Val())
}

// A batch whose keys pass one call's bound takes as many calls as it
// needs, and every job gets its answer.
func testLockFindChunks(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{})
	var jobs []LockJob
	for i := range 700 { // 4 keys and 2 arguments each: three calls
		jobs = append(jobs, f.lockJob(fmt.Sprint("j", i), false))
	}
	require.NoError(t, b.RC.HSet(f.ctx, TaskKey(f.queues[2], "j699"), "state", "archived").Err())
	found, err := f.jobs.LockAndFind(f.ctx, "mine", time.Minute, jobs)
	require.NoError(t, err)
	require.Len(t, found, 700)
	require.Equal(t, Lookup{Queue: f.queues[2], State: "archived"}, found[699])
	require.Equal(t, Lookup{}, found[0])
	n, err := f.jobs.Unlock(f.ctx, "mine", jobs)
	require.NoError(t, err)
	require.Equal(t, 700, n)
}

// Unlock deletes the locks holding its token and leaves another client's.
func testUnlock(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{})
	_, err := f.jobs.LockAndFind(f.ctx, "mine", time.Minute, []LockJob{f.lockJob("a", false), f.lockJob("b", false)})
	require.NoError(t, err)
	require.NoError(t, b.RC.Set(f.ctx, b.KS.enqueueLockKey("batch", "c"), "theirs", time.Minute).Err())
	n, err := f.jobs.Unlock(f.ctx, "mine", []LockJob{f.lockJob("a", false), f.lockJob("b", false), f.lockJob("c", false)})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Zero(t, b.RC.Exists(f.ctx, b.KS.enqueueLockKey("batch", "a"), b.KS.enqueueLockKey("batch", "b")).Val())
	require.Equal(t, "theirs", b.RC.Get(f.ctx, b.KS.enqueueLockKey("batch", "c")).Val())
}

// promoteJob writes a job into a queue as asynq would: its hash and its
// place in the list or set of its state.
func (f *doorFixture) promoteJob(queue, id, state string, score float64) string {
	f.t.Helper()
	m := string(msg(queue, id))
	require.NoError(f.t, f.b.RC.HSet(f.ctx, TaskKey(queue, id), "msg", m, "state", state).Err())
	switch state {
	case "pending":
		require.NoError(f.t, f.b.RC.LPush(f.ctx, PendingKey(queue), id).Err())
	case "scheduled":
		require.NoError(f.t, f.b.RC.ZAdd(f.ctx, scheduledKey(queue), redis.Z{Score: score, Member: id}).Err())
	case "active":
		require.NoError(f.t, f.b.RC.LPush(f.ctx, ActiveKey(queue), id).Err())
	}
	return m
}

func (f *doorFixture) promote(id, from, to, read string, lock *UniqueLock) PromoteReply {
	f.t.Helper()
	newMsg, _, err := Retarget(read, from, to, time.Time{})
	require.NoError(f.t, err)
	reply, err := f.jobs.Promote(f.ctx, PromoteArgs{Pool: "batch", ID: id, From: from, To: to, Msg: read, NewMsg: newMsg, Lock: lock})
	require.NoError(f.t, err)
	return reply
}

// A pending job moves to the tail of the target tier, its message
// rewritten, its wait restarted, and its failure count and the breaker's
// memory of it renamed with it.
func testPromoteMoved(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{})
	from, to := f.queues[2], f.queues[0]
	m := f.promoteJob(from, "j", "pending", 0)
	f.promoteJob(to, "ahead", "pending", 0)
	require.NoError(t, b.RC.Set(f.ctx, b.KS.FailureCountKey(from, "j"), 3, time.Hour).Err())
	_, _, suspects, _ := b.KS.BreakerKeys("batch")
	require.NoError(t, b.RC.ZAdd(f.ctx, suspects, redis.Z{Score: 7, Member: Member{ID: "j", Queue: from}.String()}).Err())
	before := f.redisMs()

	require.Equal(t, PromoteReply{Outcome: Moved, State: "pending"}, f.promote("j", from, to, m, nil))
	require.Equal(t, [][]string{{"ahead", "j"}, nil, nil}, f.pending())
	task := f.task(to, "j")
	want, _, err := Retarget(m, from, to, time.Time{})
	require.NoError(t, err)
	require.Equal(t, want, task["msg"])
	require.Equal(t, "pending", task["state"])
	since, err := strconv.ParseInt(task["pending_since"], 10, 64)
	require.NoError(t, err)
	require.GreaterOrEqual(t, since/1e6, before-1000)
	require.Empty(t, f.task(from, "j"))
	require.Equal(t, "3", b.RC.Get(f.ctx, b.KS.FailureCountKey(to, "j")).Val())
	require.Zero(t, b.RC.Exists(f.ctx, b.KS.FailureCountKey(from, "j")).Val())
	require.Equal(t, []redis.Z{{Score: 7, Member: Member{ID: "j", Queue: to}.String()}}, b.RC.ZRangeWithScores(f.ctx, suspects, 0, -1).Val())
}

// A scheduled job keeps its due time; asynq's unique lock the job holds
// moves to the target queue's name.
func testPromoteScheduled(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{})
	from, to := f.queues[1], f.queues[0]
	m := f.promoteJob(from, "s", "scheduled", 1900000000)
	lock := &UniqueLock{From: QueueKey(from, "unique:report:x"), To: QueueKey(to, "unique:report:x")}
	require.NoError(t, b.RC.Set(f.ctx, lock.From, "s", time.Hour).Err())
	require.NoError(t, b.RC.HSet(f.ctx, TaskKey(from, "s"), "unique_key", lock.From).Err())

	require.Equal(t, PromoteReply{Outcome: Moved, State: "scheduled"}, f.promote("s", from, to, m, lock))
	require.Equal(t, []redis.Z{{Score: 1900000000, Member: "s"}}, b.RC.ZRangeWithScores(f.ctx, scheduledKey(to), 0, -1).Val())
	require.Zero(t, b.RC.ZCard(f.ctx, scheduledKey(from)).Val())
	require.Equal(t, "s", b.RC.Get(f.ctx, lock.To).Val())
	require.Zero(t, b.RC.Exists(f.ctx, lock.From).Val())
	require.Equal(t, lock.To, f.task(to, "s")["unique_key"])
}

// A job that runs is not moved; one whose message changed since it was
// read, or that is gone, is reported for the caller to look again; one
// whose ID the target queue holds is a conflict. None of them changes
// anything.
func testPromoteNotMoved(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{})
	from, to := f.queues[2], f.queues[0]
	active := f.promoteJob(from, "a", "active", 0)
	require.Equal(t, PromoteReply{Outcome: NotWaiting, State: "active"}, f.promote("a", from, to, active, nil))
	require.Equal(t, "active", f.task(from, "a")["state"])

	m := f.promoteJob(from, "c", "pending", 0)
	stale := string(AppendTask(nil, Task{Type: "report", ID: "c", Queue: from, Timeout: time.Minute, ReadyAt: 2}))
	require.Equal(t, PromoteReply{Outcome: Changed}, f.promote("c", from, to, stale, nil))
	require.Equal(t, m, f.task(from, "c")["msg"])

	require.Equal(t, PromoteReply{Outcome: Gone}, f.promote("g", from, to, string(msg(from, "g")), nil))

	f.promoteJob(to, "c", "pending", 0)
	require.Equal(t, PromoteReply{Outcome: Conflict, Why: "a job with the same ID is already in the target queue"}, f.promote("c", from, to, m, nil))
	require.Equal(t, [][]string{{"c"}, nil, {"c"}}, f.pending())
	require.Equal(t, m, f.task(from, "c")["msg"])
}

// The door's commands: a waiter leaves its line, refusals are counted by
// tier and reason, and DoorStats reads both back.
func testDoorCommands(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{Limits: []int{1, 1, 1}, Backlog: true, Waits: true})
	waiting, data, refused := b.KS.doorKeys("batch")
	require.NoError(t, b.RC.ZAdd(f.ctx, waiting, redis.Z{Score: 1, Member: "w1"}, redis.Z{Score: 2, Member: "w2"}).Err())
	require.NoError(t, b.RC.HSet(f.ctx, data, "w1", "1|1,0,0", "w2", "1|1,0,0").Err())
	require.NoError(t, f.jobs.LeaveLine(f.ctx, []*Door{f.door}, "w1"))
	require.Equal(t, []string{"w2"}, b.RC.ZRange(f.ctx, waiting, 0, -1).Val())
	require.Equal(t, map[string]string{"w2": "1|1,0,0"}, b.RC.HGetAll(f.ctx, data).Val())

	require.NoError(t, f.jobs.CountRefused(f.ctx, "batch", RefusedBacklog, map[string]int64{"close": 2, "adhoc": 1}))
	require.NoError(t, f.jobs.CountRefused(f.ctx, "batch", RefusedBacklog, map[string]int64{"close": 1}))
	require.NoError(t, f.jobs.CountRefused(f.ctx, "batch", RefusedRate, map[string]int64{"": 4}))
	require.NoError(t, b.RC.HSet(f.ctx, refused, "not-ours", "x").Err())
	require.Equal(t, "3", b.RC.HGet(f.ctx, refused, "close|backlog").Val())
	st, err := f.jobs.DoorStats(f.ctx, "batch")
	require.NoError(t, err)
	require.Equal(t, DoorCounts{Waiting: 1, Refused: map[string]map[string]int64{
		"close": {"backlog": 3}, "adhoc": {"backlog": 1}, "": {"rate": 4},
	}}, st)
}

// The enqueue side's reads and its one global write.
func testJobCommands(t *testing.T, b backend) {
	f := newDoor(t, b, DoorConfig{})
	require.NoError(t, f.jobs.PublishQueue(f.ctx, f.queues[1]))
	require.True(t, b.RC.SIsMember(f.ctx, AllQueuesKey, f.queues[1]).Val())

	f.promoteJob(f.queues[1], "p", "pending", 0)
	f.promoteJob(f.queues[2], "p", "scheduled", 1)
	require.NoError(t, b.RC.HSet(f.ctx, TaskKey(f.queues[2], "done"), "msg", "m", "state", "completed").Err())
	got, err := f.jobs.Exists(f.ctx, f.queues, []string{"p", "done", "never"})
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, false}, got)
	got, err = f.jobs.Exists(f.ctx, f.queues, nil)
	require.NoError(t, err)
	require.Empty(t, got)

	job, err := f.jobs.FindJob(f.ctx, f.queues, "p")
	require.NoError(t, err)
	require.Equal(t, FoundJob{Queue: f.queues[1], State: "pending", Msg: string(msg(f.queues[1], "p"))}, job, "the highest tier's")
	job, err = f.jobs.FindJob(f.ctx, f.queues, "never")
	require.NoError(t, err)
	require.Equal(t, FoundJob{}, job)
}
