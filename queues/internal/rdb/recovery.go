package rdb

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fast recovery of the jobs of a worker process that stopped answering,
// and the fence that keeps such a process, should it wake up, from
// finishing them too. asynq renews the lease of each job a process runs
// (or holds ahead of a slot) every 5 s; a lease whose expiry nobody moved
// for recover_after belongs to a process that is dead, frozen or cut off
// from Redis. See docs/RELIABILITY.md.

//go:embed lua/recover_job.lua
var recoverJobLua string

//go:embed lua/fence_read.lua
var fenceReadLua string

//go:embed lua/leases_unrenewed.lua
var leasesUnrenewedLua string

var (
	recoverJobScript      = redis.NewScript(recoverJobLua)
	fenceReadScript       = redis.NewScript(fenceReadLua)
	leasesUnrenewedScript = redis.NewScript(leasesUnrenewedLua)
)

// Lease is the asynq lease of one running job: its ID and the Unix second
// it expires, as the process running it wrote it (its own clock: only
// whether it moves matters here).
type Lease struct {
	ID     string
	Expiry float64
}

// Leases returns the leases of the running jobs of each queue, one
// pipelined round trip (a read per queue).
func Leases(ctx context.Context, rc redis.UniversalClient, queues []string) (map[string][]Lease, error) {
	cmds := make([]*redis.ZSliceCmd, len(queues))
	_, err := rc.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range queues {
			cmds[i] = p.ZRangeWithScores(ctx, LeaseKey(q), 0, -1)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read the running jobs' leases: %w", err)
	}
	out := make(map[string][]Lease, len(queues))
	for i, q := range queues {
		for _, z := range cmds[i].Val() {
			id, _ := z.Member.(string)
			out[q] = append(out[q], Lease{ID: id, Expiry: z.Score})
		}
	}
	return out, nil
}

// RecoverOutcome says what RecoverJob did.
type RecoverOutcome int

const (
	// NotRecovered: the job is not running any more, or its lease moved
	// (renewed, or taken by asynq's recoverer or another process).
	NotRecovered RecoverOutcome = iota
	// Recovered: the job is back at the head of its queue.
	Recovered
	// SlotStillHeld: the job's cluster-wide slot lease is still live.
	SlotStillHeld
)

// Recovery is what RecoverJob returns.
type Recovery struct {
	Outcome RecoverOutcome
	// At is when, on the clock of the Redis holding the queue (Unix ms).
	At int64
	// Holder is the process its cluster-wide slot named ("" when
	// unknown, or for a process-scoped pool).
	Holder string
}

// RecoverJob puts job, a job of pool, back at the head of its queue if
// its lease still expires at seen (lua/recover_job.lua). The job is kept
// in its queue's fenced set for keep.
//
// In a cluster-scoped pool (place not nil) the job's slot lease must have
// lapsed; the slot is then kept for the job (the gate does not free it
// meanwhile, see lua/gate_lib.lua's dropExpired), and the job gets back
// its place at the head of its tier in the waiting line.
func (k Keyspace) RecoverJob(ctx context.Context, rc redis.UniversalClient, job Member, seen float64, pool string, place *RecoverPlace, keep time.Duration) (Recovery, error) {
	g := k.Gate(pool)
	keys := []string{ActiveKey(job.Queue), LeaseKey(job.Queue), PendingKey(job.Queue), TaskKey(job.Queue, job.ID), k.FencedKey(job.Queue), g.Leases, g.Holders, g.Waiting, g.Places, PausedKey(job.Queue), g.PlacesMark}
	flag, at, placeKeep := "0", int64(0), int64(0)
	if place != nil {
		// Ahead of every job of its tier that asked (their place is their
		// rank x 1e13 plus when they asked, in ms): the rank plus the
		// second its lease was last seen to expire.
		flag, at, placeKeep = "1", int64(place.Rank)*1e13+int64(seen), place.Keep.Milliseconds()
	}
	res, err := recoverJobScript.Run(ctx, rc, keys, job.ID, seen, job.String(), flag, keep.Milliseconds(), at, placeKeep, keptHolder, keptFor.Milliseconds()).Slice()
	if err != nil {
		return Recovery{}, fmt.Errorf("recover job %q: %w", job, err)
	}
	var r Recovery
	switch toInt(res[0]) {
	case 1:
		r.Outcome, r.At = Recovered, toInt(res[1])
		r.Holder, _ = res[2].(string)
	case -1:
		r.Outcome = SlotStillHeld
	}
	return r, nil
}

// keptHolder and keptFor are lua/gate_lib.lua's KEPT and KEEP_MS: the
// holder a slot kept for a job taken back shows, and how long it is kept
// for the job to be dequeued again and take it.
const (
	keptHolder = "(kept for a job taken back)"
	keptFor    = 10 * time.Second
)

// RecoverPlace is where a recovered job of a cluster-scoped pool waits for
// a slot (RecoverJob): its tier's rank in the waiting line (1 = highest; 1
// for every tier when the line is not ranked by tier), and how long the
// place is kept for it to ask.
type RecoverPlace struct {
	Rank int
	Keep time.Duration
}

func toInt(v any) int64 {
	n, _ := v.(int64)
	return n
}

// FenceAges returns, for each of ids (jobs of queue) that a recovery took
// from a process, how long ago that was on the clock of the Redis holding
// the queue; jobs never taken are absent. One call.
func (k Keyspace) FenceAges(ctx context.Context, rc redis.UniversalClient, queue string, ids []string) (map[string]time.Duration, error) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	res, err := fenceReadScript.Run(ctx, rc, []string{k.FencedKey(queue)}, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("read the fence of queue %q: %w", queue, err)
	}
	out := map[string]time.Duration{}
	for i, id := range ids {
		if at := res[i+1]; at >= 0 {
			out[id] = time.Duration(res[0]-at) * time.Millisecond
		}
	}
	return out, nil
}

// asynq's registry of its servers' running jobs: a sorted set of the
// worker keys, each a hash of the task IDs one server runs (written with
// every heartbeat, lapsing 10 s after the last).
const allWorkersKey = "asynq:workers"

// RunningOn returns, for each of ids asynq's registry still lists, the
// server running it as asynq names it (host:pid:server id). A process that
// died leaves its entry for up to 10 s after its last heartbeat.
func RunningOn(ctx context.Context, rc redis.UniversalClient, ids []string) (map[string]string, error) {
	keys, err := rc.ZRange(ctx, allWorkersKey, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("read asynq's workers: %w", err)
	}
	cmds := make([]*redis.SliceCmd, len(keys))
	args := make([]string, len(ids))
	copy(args, ids)
	_, err = rc.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, key := range keys {
			cmds[i] = p.HMGet(ctx, key, args...)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read asynq's workers: %w", err)
	}
	out := map[string]string{}
	for i, key := range keys {
		server := strings.TrimSuffix(strings.TrimPrefix(key, allWorkersKey+":{"), "}")
		for j, v := range cmds[i].Val() {
			if v != nil {
				out[ids[j]] = server
			}
		}
	}
	return out, nil
}

// GuardedClient is rc for asynq's servers, with a say over asynq's writes
// for chosen jobs: before asynq runs a script (its outcome writes: done,
// completed, retry, archive, requeue) or an HSET (a job's result) that
// names the task keys of jobs, Guard is asked with those jobs, and an
// error it returns is the command's, which then never reaches Redis. A
// process uses it to write nothing for a job another process took over.
type GuardedClient struct {
	redis.UniversalClient
	Guard func(ctx context.Context, jobs []Member) error
}

func (c GuardedClient) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	if err := c.check(ctx, keys); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return c.UniversalClient.EvalSha(ctx, sha1, keys, args...)
}

func (c GuardedClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if err := c.check(ctx, keys); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return c.UniversalClient.Eval(ctx, script, keys, args...)
}

func (c GuardedClient) HSet(ctx context.Context, key string, values ...any) *redis.IntCmd {
	if err := c.check(ctx, []string{key}); err != nil {
		cmd := redis.NewIntCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return c.UniversalClient.HSet(ctx, key, values...)
}

func (c GuardedClient) check(ctx context.Context, keys []string) error {
	var jobs []Member
	for _, k := range keys {
		if m, ok := parseTaskKey(k); ok {
			jobs = append(jobs, m)
		}
	}
	if len(jobs) == 0 {
		return nil
	}
	return c.Guard(ctx, jobs)
}

// parseTaskKey reads a TaskKey. Queue names hold no "}:t:" (names and
// tiers hold no ':' or braces; a cluster queue's '}' is followed by its
// tier), so the first one ends the queue.
func parseTaskKey(key string) (Member, bool) {
	rest, ok := strings.CutPrefix(key, "asynq:{")
	if !ok {
		return Member{}, false
	}
	queue, id, ok := strings.Cut(rest, "}:t:")
	if !ok {
		return Member{}, false
	}
	return Member{ID: id, Queue: queue}, true
}

// Unrenewed is a running job whose lease went unrenewed (Batch.Unrenewed).
type Unrenewed struct {
	Queue, ID string
	// Silent is how long since its lease was last renewed, by Redis's
	// clock against the renewing worker's (whole seconds).
	Silent time.Duration
}

// UnrenewedRead is Batch.Unrenewed's read.
type UnrenewedRead struct {
	cmd    *redis.Cmd
	queues []string
}

// Unrenewed queues a read of the running jobs of a pool's queues whose
// lease went unrenewed for at least older (lua/leases_unrenewed.lua).
func (b *Batch) Unrenewed(queues []string, older time.Duration) *UnrenewedRead {
	r := &UnrenewedRead{queues: queues}
	keys := make([]string, len(queues))
	for i, q := range queues {
		keys[i] = LeaseKey(q)
	}
	b.reads = append(b.reads, func(ctx context.Context, pipe redis.Pipeliner) {
		r.cmd = leasesUnrenewedScript.EvalSha(ctx, pipe, keys, older.Milliseconds())
	})
	return r
}

// Result returns the jobs read.
func (r *UnrenewedRead) Result() ([]Unrenewed, error) {
	res, err := r.cmd.Slice()
	if err != nil {
		return nil, err
	}
	now := toInt(res[0])
	var out []Unrenewed
	for i := 1; i+2 < len(res); i += 3 {
		q := int(toInt(res[i])) - 1
		id, _ := res[i+1].(string)
		renewed := (toInt(res[i+2]) - 30) * 1000
		out = append(out, Unrenewed{Queue: r.queues[q], ID: id, Silent: time.Duration(now-renewed) * time.Millisecond})
	}
	return out, nil
}
