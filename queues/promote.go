package queues

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"
)

//go:embed lua/promote.lua
var promoteLua string

var promoteScript = redis.NewScript(promoteLua)

// ErrJobNotFound is matched by Promote for a job ID that no queue of the
// pool holds: never enqueued, or finished and not kept. Nothing changed.
var ErrJobNotFound = errors.New("job not found")

// ErrInvalidPromote is matched by Promote for what was asked: a job type
// routed to no pool, a pool without tiers, a tier the pool does not serve,
// an empty job ID. Redis was not touched.
var ErrInvalidPromote = errors.New("invalid promote request")

// promoteAttempts bounds how often Promote reads a job again when its
// message changed between the read and the move (it failed and went to
// its retry set, say). Each attempt is two round trips.
const promoteAttempts = 20

// PromoteResult says what Promote did.
type PromoteResult struct {
	// ID and Pool name the job.
	ID   string `json:"id"`
	Pool string `json:"pool"`
	// From is the tier the job was found in, To the tier asked for.
	From string `json:"from"`
	To   string `json:"to"`
	// Queue is the queue the job is in now.
	Queue string `json:"queue"`
	// State is the job's state when Promote looked: pending, scheduled or
	// retry when it was moved (it keeps it); active, completed, archived
	// when it was not.
	State string `json:"state"`
	// Moved says whether the job changed queues. It is false for a job
	// that runs or finished (State says which), and for a job already in
	// the tier asked for.
	Moved bool `json:"moved"`
}

// Waiting reports whether the job was waiting (pending, scheduled or
// waiting for a retry) when Promote looked.
func (r PromoteResult) Waiting() bool {
	return r.State == "pending" || r.State == "scheduled" || r.State == "retry"
}

// Promote moves a waiting job of jobType's pool (pending, scheduled, or
// waiting for a retry) to the queue of another of the pool's tiers, in one
// Redis step: at every moment the job is in exactly one queue, so a worker
// dequeuing at the same time either takes it from the old tier (and
// Promote reports it running) or finds it in the new one.
//
// The job keeps its ID, payload, headers, retry count and options, and its
// state: a pending job goes to the tail of the new tier's queue (behind
// the jobs already waiting there, as if enqueued now into that tier); a
// scheduled job or one waiting for a retry keeps its due time and joins
// the new tier's queue when due. The failures counted against it and the
// circuit breaker's memory of it follow it. No pause flag is touched: see
// docs/STEERING.md for how soon a worker takes a job moved into a tier the
// cluster gate holds paused.
//
// A job that runs, or finished and is kept (completed within its
// retention, or archived), is not moved: the result says so (State,
// Moved false), and so it does for a job already in the tier. A job no
// queue of the pool holds fails with ErrJobNotFound; a bad request
// (see ErrInvalidPromote) fails before Redis is touched. On any error
// nothing changed.
func (c *Client) Promote(ctx context.Context, jobType, id, tier string) (PromoteResult, error) {
	p, err := c.pools().route(jobType)
	if err != nil {
		return PromoteResult{}, fmt.Errorf("%w: %w", ErrInvalidPromote, err)
	}
	if id == "" {
		return PromoteResult{}, fmt.Errorf("%w: the job ID is empty", ErrInvalidPromote)
	}
	if p.tiers == nil {
		return PromoteResult{}, fmt.Errorf("%w: pool %q has no tiers", ErrInvalidPromote, p.Name())
	}
	target, err := p.QueueFor(tier)
	if err != nil {
		return PromoteResult{}, fmt.Errorf("%w: %w", ErrInvalidPromote, err)
	}
	res := PromoteResult{ID: id, Pool: p.Name(), To: tier}
	for range promoteAttempts {
		from, state, msg, err := c.findJob(ctx, p, id)
		if err != nil {
			return PromoteResult{}, err
		}
		if from == "" {
			return PromoteResult{}, fmt.Errorf("%w: pool %q has no job %q (never enqueued, or finished and not kept)", ErrJobNotFound, p.Name(), id)
		}
		res.From, res.Queue, res.State = p.TierOf(from), from, state
		if from == target {
			return res, nil
		}
		if !res.Waiting() {
			return res, nil
		}
		var readyAt time.Time // a pending job's wait restarts in its new tier
		if state == "pending" {
			readyAt = c.cfg.Clock()
		}
		newMsg, lock, err := retarget(msg, from, target, readyAt)
		if err != nil {
			return PromoteResult{}, fmt.Errorf("promote job %q: %w", id, err)
		}
		// asynq's tools list queues from its set of queue names: the
		// target goes in first, in a call of its own (a global key, on
		// its own slot on a Redis Cluster).
		if err := c.publishQueue(ctx, target); err != nil {
			return PromoteResult{}, fmt.Errorf("promote job %q: %w", id, err)
		}
		keys, args := c.promoteCall(p, id, from, target, msg, newMsg, lock)
		reply, err := promoteScript.Run(ctx, c.rdb, keys, args...).StringSlice()
		if err != nil {
			return PromoteResult{}, fmt.Errorf("promote job %q: %w", id, err)
		}
		switch reply[0] {
		case "moved":
			res.Queue, res.State, res.Moved = target, reply[1], true
			return res, nil
		case "state":
			res.State = reply[1]
			return res, nil
		case "conflict":
			return PromoteResult{}, fmt.Errorf("promote job %q from tier %q to %q: %s; nothing was moved", id, res.From, tier, reply[1])
		}
		// "changed" or "gone": it moved on between the read and the
		// script (a failure, a retry forwarded, another promote); look
		// again.
	}
	return PromoteResult{}, fmt.Errorf("promote job %q: it changed under every one of %d attempts; nothing was moved, try again", id, promoteAttempts)
}

// findJob returns the first queue of p (highest tier first) that holds a
// job with id, with its state and message; queue "" when none does.
func (c *Client) findJob(ctx context.Context, p *Pool, id string) (queue, state, msg string, err error) {
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(p.queues))
	for i, q := range p.queues {
		cmds[i] = pipe.HMGet(ctx, asynqTaskKey(q, id), "state", "msg")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return "", "", "", fmt.Errorf("look up job %q: %w", id, err)
	}
	for i, cmd := range cmds {
		v := cmd.Val()
		st, _ := v[0].(string)
		m, _ := v[1].(string)
		if st != "" {
			return p.queues[i], st, m, nil
		}
	}
	return "", "", "", nil
}

// promoteCall builds the keys and arguments of lua/promote.lua.
func (c *Client) promoteCall(p *Pool, id, from, to, msg, newMsg string, lock *uniqueLock) ([]string, []any) {
	ks := c.ks
	_, _, suspects, _ := ks.breakerKeys(p.Name())
	keys := []string{
		asynqTaskKey(from, id), asynqTaskKey(to, id),
		asynqPendingKey(from), asynqScheduledKey(from), asynqRetryKey(from),
		asynqPendingKey(to), asynqScheduledKey(to), asynqRetryKey(to),
		ks.failureCountKey(from, id), ks.failureCountKey(to, id),
		suspects, ks.breakerLateKey(p.Name()), ks.breakerCountedKey(p.Name()),
	}
	hasLock := "0"
	if lock != nil {
		hasLock = "1"
		keys = append(keys, lock.from, lock.to)
	}
	sum := sha1.Sum([]byte(msg))
	args := []any{id, hex.EncodeToString(sum[:]), newMsg, id + "@" + from, id + "@" + to, hasLock}
	return keys, args
}

// uniqueLock is the key of asynq's unique lock a job's message names, and
// that key in the target queue.
type uniqueLock struct{ from, to string }

// retarget rewrites asynq's task message (protobuf TaskMessage) of a job
// in queue from for queue to: its queue field (4) and, for a job enqueued
// with asynq's Unique option, its unique lock's key (10), which names the
// queue. With a non-zero readyAt (a pending job, whose wait restarts at the
// promotion) the job's ready-at header (in headers, 15) says readyAt, so
// that the starvation guard counts its wait in the new tier from then, as
// asynq's pending_since does. Every other field is copied byte for byte,
// in its place.
func retarget(msg, from, to string, readyAt time.Time) (string, *uniqueLock, error) {
	b := []byte(msg)
	out := make([]byte, 0, len(b)+len(to)-len(from))
	var lock *uniqueLock
	sawQueue := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", nil, fmt.Errorf("asynq task message: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return "", nil, fmt.Errorf("asynq task message: field %d: %w", num, protowire.ParseError(m))
		}
		field := b[:n+m]
		b = b[n+m:]
		if typ != protowire.BytesType || (num != 4 && num != 10 && num != 15) {
			out = append(out, field...)
			continue
		}
		v, _ := protowire.ConsumeBytes(field[n:])
		switch num {
		case 15:
			if readyAt.IsZero() || headerKey(v) != readyAtHeader {
				out = append(out, field...)
				continue
			}
			var e []byte
			e = protowire.AppendTag(e, 1, protowire.BytesType)
			e = protowire.AppendString(e, readyAtHeader)
			e = protowire.AppendTag(e, 2, protowire.BytesType)
			e = protowire.AppendString(e, strconv.FormatInt(readyAt.UnixNano(), 10))
			v = e
		case 4:
			if string(v) != from {
				return "", nil, fmt.Errorf("asynq task message names queue %q, but the job is in %q", v, from)
			}
			sawQueue = true
			v = []byte(to)
		case 10:
			prefix := asynqQueueKey(from, "")
			if len(v) == 0 || !strings.HasPrefix(string(v), prefix) {
				out = append(out, field...)
				continue
			}
			lock = &uniqueLock{from: string(v), to: asynqQueueKey(to, "") + string(v[len(prefix):])}
			v = []byte(lock.to)
		}
		out = protowire.AppendTag(out, num, protowire.BytesType)
		out = protowire.AppendBytes(out, v)
	}
	if !sawQueue {
		return "", nil, fmt.Errorf("asynq task message names no queue")
	}
	return string(out), lock, nil
}

// headerKey returns the key of one entry of a TaskMessage's headers map (a
// message of key (1) and value (2)), or "".
func headerKey(entry []byte) string {
	for len(entry) > 0 {
		num, typ, n := protowire.ConsumeTag(entry)
		if n < 0 {
			return ""
		}
		m := protowire.ConsumeFieldValue(num, typ, entry[n:])
		if m < 0 {
			return ""
		}
		if num == 1 && typ == protowire.BytesType {
			k, _ := protowire.ConsumeBytes(entry[n:])
			return string(k)
		}
		entry = entry[n+m:]
	}
	return ""
}
