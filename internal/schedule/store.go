package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Run states, in a Record and in Redis.
const (
	StateRunning = "running" // claimed; the plan is being enqueued
	StateDone    = "done"    // the plan was enqueued
	StateFailed  = "failed"  // the enqueue failed; another attempt may follow
)

// Triggers: why a run happened.
const (
	TriggerSchedule = "schedule" // its fire time came while a worker ran
	TriggerCatchUp  = "catch-up" // its fire time passed while no worker ran it
	TriggerManual   = "manual"   // an operator asked for it
)

// Counts is what a run's enqueue did with the plan's reports.
type Counts struct {
	// Enqueued counts reports added to the queues by this run.
	Enqueued int `json:"enqueued"`
	// AlreadyPresent counts reports whose job for the period was already
	// queued, running or finished: nothing was added for them.
	AlreadyPresent int `json:"already_present"`
	// Refused counts reports the queues refused (the door's
	// admission control, or any outcome other than enqueued/already
	// there).
	Refused int `json:"refused"`
}

// Record is what a run leaves behind.
type Record struct {
	Schedule string `json:"schedule"`
	// ID identifies the run: its fire instant in UTC (RFC 3339) for a
	// scheduled run, "manual-…" for a run asked for by hand.
	ID      string `json:"id"`
	Trigger string `json:"trigger"`
	Period  string `json:"period"`
	// ScheduledFor is the fire instant; zero for a manual run.
	ScheduledFor time.Time `json:"scheduled_for,omitzero"`
	StartedAt    time.Time `json:"started_at"`
	FinishedAt   time.Time `json:"finished_at,omitzero"`
	// ClaimedBy names the process that ran it (host:pid:id).
	ClaimedBy string `json:"claimed_by"`
	State     string `json:"state"`
	// Attempt is 1 for the first claim; more when a failed or abandoned
	// run was taken up again.
	Attempt int `json:"attempt"`
	Counts
	// Error says why the enqueue failed.
	Error string `json:"error,omitempty"`
}

// Defaults of the store.
const (
	// DefaultHistory is how many records a schedule keeps.
	DefaultHistory = 50
	// DefaultLease is how long a claim keeps other processes off a run.
	DefaultLease = 5 * time.Minute
	// DefaultRetryAfter is how long after a failed attempt another may
	// start.
	DefaultRetryAfter = time.Minute
)

// Store keeps the claims and records of runs in Redis, under the queue
// namespace:
//
//	<ns>:schedule:{<name>}:runs        sorted set of run IDs, by fire (or start) time
//	<ns>:schedule:{<name>}:run:<id>    hash: state, attempts, record (JSON)
//	<ns>:schedule:{<name>}:lease:<id>  the claimant's token while it runs (expires)
//
// The braces keep a schedule's keys in one Redis Cluster slot.
type Store struct {
	rdb redis.UniversalClient
	ns  string
	// History is how many records a schedule keeps. Defaults to
	// DefaultHistory.
	History int
	// Lease bounds how long a claimant may take; after it, a run whose
	// claimant vanished can be claimed again. Defaults to DefaultLease.
	Lease time.Duration
	// RetryAfter is how long a failed attempt keeps others off the run.
	// Defaults to DefaultRetryAfter.
	RetryAfter time.Duration
}

// NewStore returns a store on rdb under namespace. It does not close rdb.
func NewStore(rdb redis.UniversalClient, namespace string) *Store {
	return &Store{rdb: rdb, ns: namespace, History: DefaultHistory, Lease: DefaultLease, RetryAfter: DefaultRetryAfter}
}

func (s *Store) prefix(name string) string { return s.ns + ":schedule:{" + name + "}:" }

// periodLockKey is the lock the runs for one period take turns on
// (LockPeriod), whatever schedule or command started them.
func (s *Store) periodLockKey(period string) string {
	return s.ns + ":schedule-period:" + period + ":lock"
}

func (s *Store) runsKey(name string) string      { return s.prefix(name) + "runs" }
func (s *Store) runKey(name, id string) string   { return s.prefix(name) + "run:" + id }
func (s *Store) leaseKey(name, id string) string { return s.prefix(name) + "lease:" + id }

// unlockPeriodScript releases a period's lock if token still holds it.
var unlockPeriodScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// LockPeriod takes the lock of period for token for at most ttl (a holder
// that crashed frees it then) and says whether it got it; another holder's
// lock is left alone.
func (s *Store) LockPeriod(ctx context.Context, period, token string, ttl time.Duration) (bool, error) {
	return s.rdb.SetNX(ctx, s.periodLockKey(period), token, ttl).Result()
}

// UnlockPeriod releases period's lock if token holds it; a lock another
// token took meanwhile (after token's lapsed) stays.
func (s *Store) UnlockPeriod(ctx context.Context, period, token string) error {
	return unlockPeriodScript.Run(ctx, s.rdb, []string{s.periodLockKey(period)}, token).Err()
}

// PeriodLockHolder returns the token holding period's lock, "" when none.
func (s *Store) PeriodLockHolder(ctx context.Context, period string) (string, error) {
	v, err := s.rdb.Get(ctx, s.periodLockKey(period)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

// Claim results.
const (
	Claimed = "claimed" // first claim of the run: the caller runs it
	Retry   = "retry"   // a failed or abandoned run claimed again: the caller runs it
	Done    = "done"    // already done by someone: nothing to do
	Busy    = "busy"    // another process holds the run's lease
)

// claimScript claims a run unless it is done or leased: it sets the lease
// and records the run as running, in one step, so of several processes
// claiming the same run at once exactly one gets it. It trims the history
// to its bound, never removing the run it claims.
//
// KEYS: runs, run hash, lease. ARGV: token, lease ms, record JSON, score,
// run ID, history bound, run hash prefix.
var claimScript = redis.NewScript(`
local state = redis.call('HGET', KEYS[2], 'state')
if state == 'done' then
  return {'done', redis.call('HGET', KEYS[2], 'attempts') or '0', redis.call('GET', KEYS[3]) or ''}
end
if not redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {'busy', redis.call('HGET', KEYS[2], 'attempts') or '0', redis.call('GET', KEYS[3]) or ''}
end
local attempt = tonumber(redis.call('HGET', KEYS[2], 'attempts') or '0') + 1
redis.call('HSET', KEYS[2], 'state', 'running', 'attempts', attempt, 'record', ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[5])
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[6])
if excess > 0 then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, excess)) do
    if excess > 0 and id ~= ARGV[5] then
      redis.call('DEL', ARGV[7] .. id)
      redis.call('ZREM', KEYS[1], id)
      excess = excess - 1
    end
  end
end
if state then
  return {'retry', tostring(attempt), state}
end
return {'claimed', tostring(attempt), ''}
`)

// finishScript writes a run's final record, unless another process has
// claimed the run since (its lease lapsed and was taken): then it returns
// 0 and changes nothing. A done run releases its lease; a failed one keeps
// others off for the retry delay.
//
// KEYS: run hash, lease. ARGV: token, state, record JSON, retry ms.
var finishScript = redis.NewScript(`
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'record', ARGV[3])
if ARGV[2] == 'done' then
  redis.call('DEL', KEYS[2])
else
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[4])
end
return 1
`)

// ClaimResult is what Claim found.
type ClaimResult struct {
	// Result is Claimed, Retry, Done or Busy.
	Result string
	// Attempt is the run's attempt number: this claim's for Claimed and
	// Retry, the latest one's otherwise.
	Attempt int
	// Holder is the token of the process holding the lease, for Busy.
	Holder string
	// Previous is the state of the run before a Retry claim.
	Previous string
}

// Claim tries to claim rec's run for the process token. rec is stored as
// the run's record (state running, its attempt filled in) when the claim
// succeeds; score orders the history.
func (s *Store) Claim(ctx context.Context, rec *Record, token string, score time.Time) (ClaimResult, error) {
	rec.State = StateRunning
	data, err := json.Marshal(rec)
	if err != nil {
		return ClaimResult{}, err
	}
	name := rec.Schedule
	res, err := claimScript.Run(ctx, s.rdb,
		[]string{s.runsKey(name), s.runKey(name, rec.ID), s.leaseKey(name, rec.ID)},
		token, s.Lease.Milliseconds(), data, score.Unix(), rec.ID, s.History, s.prefix(name)+"run:",
	).StringSlice()
	if err != nil {
		return ClaimResult{}, fmt.Errorf("schedule %q: claim run %s: %w", name, rec.ID, err)
	}
	if len(res) != 3 {
		return ClaimResult{}, fmt.Errorf("schedule %q: claim run %s: unexpected reply %q", name, rec.ID, res)
	}
	cr := ClaimResult{Result: res[0]}
	fmt.Sscan(res[1], &cr.Attempt)
	switch cr.Result {
	case Busy, Done:
		cr.Holder = res[2]
	default:
		cr.Previous = res[2]
		if cr.Attempt > 0 {
			rec.Attempt = cr.Attempt
		}
	}
	return cr, nil
}

// ErrLeaseLost means a run took longer than its lease and another process
// claimed it: the late claimant's record was not written.
var ErrLeaseLost = errors.New("schedule: the run's lease lapsed and another process claimed it")

// Finish writes rec (state done or failed) as the run's final record, if
// token still holds the run (or nobody took it since its lease lapsed).
func (s *Store) Finish(ctx context.Context, rec Record, token string) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	n, err := finishScript.Run(ctx, s.rdb, []string{s.runKey(rec.Schedule, rec.ID), s.leaseKey(rec.Schedule, rec.ID)},
		token, rec.State, data, s.RetryAfter.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("schedule %q: record run %s: %w", rec.Schedule, rec.ID, err)
	}
	if n == 0 {
		return ErrLeaseLost
	}
	return nil
}

// Runs returns up to n of a schedule's records, newest first (n <= 0: all
// it keeps).
func (s *Store) Runs(ctx context.Context, name string, n int) ([]Record, error) {
	stop := int64(-1)
	if n > 0 {
		stop = int64(n - 1)
	}
	ids, err := s.rdb.ZRevRange(ctx, s.runsKey(name), 0, stop).Result()
	if err != nil {
		return nil, fmt.Errorf("schedule %q: read runs: %w", name, err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HMGet(ctx, s.runKey(name, id), "record", "attempts")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("schedule %q: read runs: %w", name, err)
	}
	out := make([]Record, 0, len(ids))
	for _, c := range cmds {
		r, ok, err := decodeRun(c.Val())
		if err != nil {
			return nil, fmt.Errorf("schedule %q: %w", name, err)
		}
		if ok { // else trimmed meanwhile
			out = append(out, r)
		}
	}
	return out, nil
}

// decodeRun reads a run hash's record and attempts fields. The record
// written at the claim does not know its attempt number (the claim script
// counts it): it is taken from the hash.
func decodeRun(vals []any) (Record, bool, error) {
	var r Record
	if len(vals) != 2 {
		return r, false, nil
	}
	data, ok := vals[0].(string)
	if !ok {
		return r, false, nil
	}
	if err := json.Unmarshal([]byte(data), &r); err != nil {
		return r, false, fmt.Errorf("a run record is not readable: %w", err)
	}
	if a, ok := vals[1].(string); ok && r.Attempt == 0 {
		fmt.Sscan(a, &r.Attempt)
	}
	return r, true, nil
}

// Get returns the record of one run, or nil if there is none.
func (s *Store) Get(ctx context.Context, name, id string) (*Record, error) {
	vals, err := s.rdb.HMGet(ctx, s.runKey(name, id), "record", "attempts").Result()
	if err != nil {
		return nil, fmt.Errorf("schedule %q: read run %s: %w", name, id, err)
	}
	r, ok, err := decodeRun(vals)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: run %s: %w", name, id, err)
	}
	if !ok {
		return nil, nil
	}
	return &r, nil
}
