package rdb

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The door: a pool's backlog limits and enqueue rates, checked in Redis in
// the same step that writes a job (docs/DOOR.md). Two scripts decide:
// lua/admit_fast.lua the common case (single jobs of one pool, enqueued
// now, that fit under the pool's running bound of its backlog), and
// lua/admit.lua everything, exactly.

//go:embed lua/admit.lua
var admitLua string

//go:embed lua/admit_fast.lua
var admitFastLua string

//go:embed lua/door_take_back.lua
var takeBackLua string

var (
	admitScript     = redis.NewScript(admitLua)
	admitFastScript = redis.NewScript(admitFastLua)
	takeBackScript  = redis.NewScript(takeBackLua)
)

// DoorScriptHashes returns the SHA1 by which Redis names (EVALSHA) the
// door's fast script and its general one, so that a test can tell which
// one a call ran.
func DoorScriptHashes() (fast, general string) { return admitFastScript.Hash(), admitScript.Hash() }

// The fields of a pool's door state (doorStateKey): the bound of its
// backlog, when it was last counted, and the theoretical arrival time of
// each of the pool's own enqueue rates.
const (
	doorEst     = "est"
	doorCounted = "counted"
	// enqueueRateField holds the pool's enqueue_rate; a job type's rate
	// is "tat:type:<job type>" (rateField).
	enqueueRateField = "tat:enqueue"
)

// rateField is the field of a door state that holds one of the pool's own
// enqueue rates: kind is "enqueue" or "type:<job type>". A caller key's
// rate has a key of its own (rateKey), which expires.
func rateField(kind string) string { return "tat:" + kind }

// Refusal reasons, as the refusal counts name them (RefusedField).
const (
	RefusedBacklog = "backlog"
	RefusedRate    = "rate"
)

// RefusedField is the field of a pool's refusal counts (the third key of
// doorKeys) that counts the jobs of tier ("" without tiers) refused for
// reason (RefusedBacklog or RefusedRate).
func RefusedField(tier, reason string) string { return tier + "|" + reason }

// Rate is an enqueue rate as the door's scripts take it (the generic cell
// rate algorithm): Interval between two jobs at the steady rate, and
// Burst, how many may come at once.
type Rate struct {
	Interval time.Duration
	Burst    int
}

// intervalArg is the rate's interval as the scripts take it: ms, with a
// fraction.
func (r Rate) intervalArg() string {
	return strconv.FormatFloat(float64(r.Interval)/float64(time.Millisecond), 'f', -1, 64)
}

// DoorConfig is what NewDoor needs to know of a pool.
type DoorConfig struct {
	Pool string
	// Queues are the pool's queues, highest tier first, and Limits each
	// one's backlog limit (0 without a backlog limit).
	Queues []string
	Limits []int
	// Backlog: the pool has a backlog limit (max_backlog). Waits: a
	// request it refuses for its backlog may wait in line (backlog_wait).
	Backlog, Waits bool
	// EnqueueRate is the pool's enqueue rate (nil: none), JobTypeRates
	// its job types' own.
	EnqueueRate  *Rate
	JobTypeRates map[string]Rate
}

// Door is a pool's door in Redis: its keys, its tiers' queues and limits,
// its rates' fields and the fast script's leading arguments, worked out
// once per pool configuration. It is read-only once built.
type Door struct {
	pool                        string
	state, waiting, waitingData string
	queues                      []string
	limits                      []int
	// counts are the keys an exact count of the backlog reads: per tier,
	// its pending, scheduled, retry and active keys, space-separated.
	counts         string
	backlog, waits bool
	typeFields     map[string]string
	// For the fast script: per tier its limit and pending list, and the
	// leading arguments by job type ("": job types without a rate of
	// their own).
	fastLimits []any
	pending    []string
	fast       map[string]*FastDoor
}

// NewDoor works out the door of a pool in layout ks. It panics when
// cfg.Limits does not give one limit per queue (a programming error).
func NewDoor(ks Keyspace, cfg DoorConfig) *Door {
	if len(cfg.Limits) != len(cfg.Queues) || len(cfg.Queues) == 0 {
		panic(fmt.Sprintf("rdb.NewDoor: pool %q: %d queues and %d limits", cfg.Pool, len(cfg.Queues), len(cfg.Limits)))
	}
	d := &Door{
		pool: cfg.Pool, state: ks.doorStateKey(cfg.Pool),
		queues: cfg.Queues, limits: cfg.Limits, backlog: cfg.Backlog, waits: cfg.Waits,
		typeFields: map[string]string{}, fast: map[string]*FastDoor{},
	}
	d.waiting, d.waitingData, _ = ks.doorKeys(cfg.Pool)
	var counts []string
	for k, q := range cfg.Queues {
		counts = append(counts, PendingKey(q), scheduledKey(q), retryKey(q), ActiveKey(q))
		d.fastLimits = append(d.fastLimits, strconv.Itoa(cfg.Limits[k]))
		d.pending = append(d.pending, PendingKey(q))
	}
	d.counts = strings.Join(counts, " ")
	for jt := range cfg.JobTypeRates {
		d.typeFields[jt] = rateField("type:" + jt)
	}
	var rates []Rate
	var fields []string
	if cfg.EnqueueRate != nil {
		rates, fields = append(rates, *cfg.EnqueueRate), append(fields, enqueueRateField)
	}
	d.fast[""] = d.newFastDoor(rates, fields)
	for jt, rt := range cfg.JobTypeRates {
		d.fast[jt] = d.newFastDoor(append(rates[:len(rates):len(rates)], rt), append(fields[:len(fields):len(fields)], d.typeFields[jt]))
	}
	return d
}

// Pool names the door's pool.
func (d *Door) Pool() string { return d.pool }

// FastDoor is the fast script's view of a door for the jobs of one set of
// rates (the pool's own and, for some job types, the job type's): the
// script's leading arguments, built once.
type FastDoor struct {
	door *Door
	// head are the arguments before the jobs; the first two, the
	// recount interval and pending_since, are filled in per call.
	head []any
}

func (d *Door) newFastDoor(rates []Rate, fields []string) *FastDoor {
	h := []any{"", "", boolArg(d.waits), boolArg(d.backlog), strconv.Itoa(len(rates))}
	for _, f := range fields {
		h = append(h, f)
	}
	for _, rt := range rates {
		// The same numbers as the general script's: its interval argument
		// and burst times that interval.
		iv := float64(rt.Interval) / float64(time.Millisecond)
		h = append(h, rt.intervalArg(), strconv.FormatFloat(float64(rt.Burst)*iv, 'f', -1, 64))
	}
	return &FastDoor{door: d, head: h}
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Fast returns the fast script's view of the door for a job of jobType.
// Two jobs may share a call when Fast returns the same value for both.
func (d *Door) Fast(jobType string) *FastDoor {
	if f, ok := d.fast[jobType]; ok {
		return f
	}
	return d.fast[""]
}

// FastCall is one call of the fast script being built: FastDoor.Call, Add
// per job, then Jobs.AdmitFast. It holds the call's keys and arguments as
// they go to Redis, so that a call costs no allocation per job beyond
// them.
type FastCall struct {
	door       *Door
	keys       []string
	args       []any
	jobs, head int
	err        error
}

// Call starts a call of the fast script for up to jobs jobs, enqueued at
// now (their pending_since).
func (f *FastDoor) Call(jobs int, now time.Time) FastCall {
	d := f.door
	keys := make([]string, 1, 2+2*jobs)
	keys[0] = d.state
	if d.waits {
		keys = append(keys, d.waiting)
	}
	args := make([]any, len(f.head), len(f.head)+3*jobs)
	copy(args, f.head)
	args[1] = now.UnixNano()
	return FastCall{door: d, keys: keys, args: args, head: len(f.head)}
}

// Add adds a job to the call: its tier (the index of its queue in the
// pool's queues, highest first), its ID and its asynq task message.
func (c *FastCall) Add(tier int, id string, msg []byte) {
	d := c.door
	if tier < 0 || tier >= len(d.queues) {
		c.err = fmt.Errorf("job %q: pool %q has no tier %d", id, d.pool, tier)
		return
	}
	c.keys = append(c.keys, TaskKey(d.queues[tier], id), d.pending[tier])
	c.args = append(c.args, d.fastLimits[tier], id, msg)
	c.jobs++
}

// FastReply is the fast script's answer: it admitted the call's first
// Admitted() jobs, in order, and none after them, which it left untouched
// for the general script.
type FastReply struct{ written []any }

// Admitted returns how many of the call's jobs, from the first, the
// script admitted.
func (r FastReply) Admitted() int { return len(r.written) }

// Written reports whether admitted job n (from 0) was written: false when
// its ID was taken meanwhile (by something that does not take the enqueue
// lock). An admitted job counts in the door's bound either way.
func (r FastReply) Written(n int) bool { return r.written[n] == int64(1) }

// AdmitFast runs a call of the fast script (lua/admit_fast.lua): it admits
// the jobs in order while each fits under the pool's bound of its backlog
// (fresh, with nobody waiting in line) and passes its rates, and stops at
// the first that does not. It never refuses.
func (j *Jobs) AdmitFast(ctx context.Context, c *FastCall) (FastReply, error) {
	if c.err != nil {
		return FastReply{}, fmt.Errorf("enqueue: %w", c.err)
	}
	c.args[0] = j.recountArg
	res, err := admitFastScript.Run(ctx, j.rc, c.keys, c.args...).Slice()
	if err != nil {
		return FastReply{}, fmt.Errorf("enqueue: %w", err)
	}
	if len(res) > c.jobs {
		return FastReply{}, fmt.Errorf("enqueue: the door's fast script admitted %d jobs of %d", len(res), c.jobs)
	}
	for n, w := range res {
		if v, ok := w.(int64); !ok || (v != 0 && v != 1) {
			return FastReply{}, fmt.Errorf("enqueue: the door's fast script replied %v for job %d, want 0 or 1", w, n+1)
		}
	}
	return FastReply{written: res}, nil
}

// AdmitArgs is one call of the door's general script (lua/admit.lua): the
// checks it makes and the requests it decides. Requests are decided in
// order, each on its own (all of its jobs or none), each seeing the ones
// before it.
type AdmitArgs struct {
	// Checks are the doors whose backlog the call checks (pools with a
	// backlog limit).
	Checks []*Door
	// Rates are the enqueue rates the call checks.
	Rates    []RateCheck
	Requests []AdmitRequest
	// Wait: a request refused for its backlog by a door whose requests
	// may wait stays in its line, as waiter Token, until WaiterTTL after
	// it last asked; admitted, it leaves the line. Only with one request.
	Wait      bool
	Token     string
	WaiterTTL time.Duration
	// Now is when the jobs are enqueued: a pending job's pending_since.
	Now time.Time
}

// RateCheck is one enqueue rate a call checks: a door's own (its
// enqueue_rate, or JobType's job_type_rates), held in its door state, or
// a caller key's (Key), which has a key of its own.
type RateCheck struct {
	Door         *Door
	JobType, Key string
	Rate         Rate
}

// AdmitRequest is one request of a call: its jobs, and what they bring to
// each check.
type AdmitRequest struct {
	// Backlog is, per check (AdmitArgs.Checks), per tier of its door
	// (highest first), how many jobs the request brings; a missing or nil
	// entry: none.
	Backlog [][]int
	// Rates is, per rate check (AdmitArgs.Rates), how many jobs the
	// request brings under it; missing: none.
	Rates []int
	Jobs  []AdmitJob
}

// AdmitJob is one job of a request.
type AdmitJob struct {
	Door *Door
	// Tier is the index of the job's queue in its door's queues (highest
	// tier first).
	Tier int
	ID   string
	// Msg is its asynq task message (AppendTask).
	Msg []byte
	// ProcessAt is when a scheduled job is due (to the second); zero: the
	// job is pending now.
	ProcessAt time.Time
	// Publish: the script adds the job's queue to asynq's set of queue
	// names. Not on a Redis Cluster, where the set has a slot of its own:
	// there, call PublishQueue first.
	Publish bool
	// Replaces is the finished job with the same ID the job replaces, or
	// nil.
	Replaces *FinishedJob
}

// FinishedJob is a finished job: its queue, and its state, "completed" or
// "archived".
type FinishedJob struct{ Queue, State string }

// AdmitReply is the general script's decision on one request: admitted,
// with Written saying per job whether it was written (false: its ID was
// taken meanwhile, by something that does not take the enqueue lock); or
// refused, and Backlog or Rate says by what. Nothing of a refused request
// was written.
type AdmitReply struct {
	Written []bool
	Backlog *BacklogRefusal
	Rate    *RateRefusal
}

// BacklogRefusal is a request refused by backlog check Check (an index of
// AdmitArgs.Checks): the pool's Backlog, by an exact count, and per tier
// of its door (highest first) the room the request had and its need.
type BacklogRefusal struct {
	Check, Backlog int
	Tiers          []TierRoom
}

// TierRoom is the room a tier had for a refused request (its limit, less
// the backlog, less the request's jobs of higher tiers and earlier
// waiting requests' jobs) and what the request needed.
type TierRoom struct{ Room, Need int }

// RateRefusal is a request refused by rate check Check (an index of
// AdmitArgs.Rates); RetryAfter is how long until it would pass.
type RateRefusal struct {
	Check      int
	RetryAfter time.Duration
}

// Admit runs a call of the door's general script (lua/admit.lua) and
// returns its decision on each request. On a Redis Cluster every key of a
// call must be on one slot: its checks, rates and jobs must all be one
// pool's, and no job may ask to Publish.
func (j *Jobs) Admit(ctx context.Context, a AdmitArgs) ([]AdmitReply, error) {
	keys, args, err := j.admitCall(a)
	if err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	res, err := admitScript.Run(ctx, j.rc, keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	out, err := decodeAdmit(a, res)
	if err != nil {
		return nil, fmt.Errorf("enqueue: the door's script: %w", err)
	}
	return out, nil
}

// admitCall builds the keys and arguments of a call of lua/admit.lua (its
// header says what each is).
func (j *Jobs) admitCall(a AdmitArgs) (keys []string, args []any, err error) {
	if len(a.Requests) == 0 {
		return nil, nil, errors.New("a call of the door's script with no request")
	}
	if a.Wait && len(a.Requests) != 1 {
		return nil, nil, fmt.Errorf("a waiting call of the door's script with %d requests", len(a.Requests))
	}
	// The door states the call reads, in order of first use, and the
	// fields it reads of each: a backlog check's bound first, then its
	// rates'.
	var states []*Door
	state := func(d *Door) int {
		for k, s := range states {
			if s == d {
				return k
			}
		}
		states = append(states, d)
		return len(states) - 1
	}
	checkState := make([]int, len(a.Checks))
	for k, d := range a.Checks {
		checkState[k] = state(d)
	}
	rateState := make([]int, len(a.Rates)) // -1: a key of its own
	for k, rc := range a.Rates {
		rateState[k] = -1
		if rc.Key == "" {
			rateState[k] = state(rc.Door)
		}
	}
	fields := make([][]any, len(states))
	for _, s := range checkState {
		fields[s] = append(fields[s], doorEst, doorCounted)
	}
	ratePos := make([]int, len(a.Rates))
	for k, rc := range a.Rates {
		if s := rateState[k]; s >= 0 {
			field := enqueueRateField
			if rc.JobType != "" {
				if field = rc.Door.typeFields[rc.JobType]; field == "" {
					field = rateField("type:" + rc.JobType)
				}
			}
			fields[s] = append(fields[s], field)
			ratePos[k] = len(fields[s])
		}
	}

	jobs := 0
	for _, r := range a.Requests {
		jobs += len(r.Jobs)
	}
	keys = make([]string, 0, 1+len(states)+2*len(a.Checks)+len(a.Rates)+2*jobs)
	allQueues := AllQueuesKey
	if j.ks.cluster {
		// No job publishes (checked below), so the set is not written:
		// a key of the call's pool stands in its place.
		if len(a.Requests[0].Jobs) == 0 || a.Requests[0].Jobs[0].Door == nil {
			return nil, nil, errors.New("the first request has no job with a door")
		}
		allQueues = a.Requests[0].Jobs[0].Door.waiting
	}
	keys = append(keys, allQueues)
	args = make([]any, 0, 16+9*jobs)
	args = append(args, len(states), len(a.Checks), len(a.Rates), len(a.Requests), boolArg(a.Wait), a.Token,
		a.WaiterTTL.Milliseconds(), strconv.FormatInt(a.Now.UnixNano(), 10), j.recountArg)
	for s, d := range states {
		keys = append(keys, d.state)
		args = append(args, len(fields[s]))
		args = append(args, fields[s]...)
	}
	for k, d := range a.Checks {
		if d.waits {
			keys = append(keys, d.waiting, d.waitingData)
		}
		args = append(args, checkState[k]+1, boolArg(d.waits), len(d.limits))
		for _, l := range d.limits {
			args = append(args, l)
		}
		args = append(args, d.counts)
	}
	for k, rc := range a.Rates {
		if s := rateState[k]; s >= 0 {
			args = append(args, s+1, ratePos[k])
		} else {
			keys = append(keys, j.ks.rateKey(rc.Door.pool, "key:"+rc.Key))
			args = append(args, 0)
		}
		args = append(args, rc.Rate.intervalArg(), rc.Rate.Burst)
	}
	for n, r := range a.Requests {
		if len(r.Backlog) > len(a.Checks) || len(r.Rates) > len(a.Rates) {
			return nil, nil, fmt.Errorf("request %d brings needs to %d checks and %d rates of %d and %d", n+1, len(r.Backlog), len(r.Rates), len(a.Checks), len(a.Rates))
		}
		args = append(args, len(r.Jobs))
		// Needs as pairs: per check, of tier and need; then of rate check
		// and need.
		for k, d := range a.Checks {
			var need []int
			if k < len(r.Backlog) {
				need = r.Backlog[k]
			}
			if need != nil && len(need) != len(d.limits) {
				return nil, nil, fmt.Errorf("request %d brings needs to %d tiers of pool %q, which has %d", n+1, len(need), d.pool, len(d.limits))
			}
			at := len(args)
			args = append(args, 0)
			for t, v := range need {
				if v > 0 {
					args = append(args, t+1, v)
				}
			}
			args[at] = (len(args) - at - 1) / 2
		}
		at := len(args)
		args = append(args, 0)
		for k, v := range r.Rates {
			if v > 0 {
				args = append(args, k+1, v)
			}
		}
		args[at] = (len(args) - at - 1) / 2
		for _, job := range r.Jobs {
			d := job.Door
			if d == nil || job.Tier < 0 || job.Tier >= len(d.queues) {
				return nil, nil, fmt.Errorf("request %d: job %q has no door or no such tier (%d)", n+1, job.ID, job.Tier)
			}
			if job.Publish && j.ks.cluster {
				return nil, nil, fmt.Errorf("job %q: on a Redis Cluster a queue is published before the call, not in it", job.ID)
			}
			q := d.queues[job.Tier]
			at, list := "0", PendingKey(q)
			if !job.ProcessAt.IsZero() {
				at, list = strconv.FormatInt(job.ProcessAt.Unix(), 10), scheduledKey(q)
			}
			keys = append(keys, TaskKey(q, job.ID), list)
			publish := ""
			if job.Publish {
				publish = q
			}
			replace := "0"
			if f := job.Replaces; f != nil {
				replace = "1"
				set := archivedKey(f.Queue)
				if f.State == "completed" {
					set = completedKey(f.Queue)
				}
				keys = append(keys, TaskKey(f.Queue, job.ID), set)
			}
			args = append(args, job.ID, job.Msg, at, publish, replace)
		}
	}
	return keys, args, nil
}

// decodeAdmit reads the general script's replies, one per request.
func decodeAdmit(a AdmitArgs, res []any) ([]AdmitReply, error) {
	if len(res) != len(a.Requests) {
		return nil, fmt.Errorf("%d replies for %d requests", len(res), len(a.Requests))
	}
	out := make([]AdmitReply, len(res))
	for n, r := range res {
		reply, ok := r.([]any)
		if !ok || len(reply) == 0 {
			return nil, fmt.Errorf("request %d: reply %v", n+1, r)
		}
		ints := func(from int) ([]int, error) {
			v := make([]int, len(reply)-from)
			for i, x := range reply[from:] {
				y, ok := x.(int64)
				if !ok {
					return nil, fmt.Errorf("request %d: reply %v: %v is not a number", n+1, reply, x)
				}
				v[i] = int(y)
			}
			return v, nil
		}
		kind, _ := reply[0].(string)
		switch kind {
		case "ok":
			v, err := ints(1)
			if err != nil {
				return nil, err
			}
			if len(v) != len(a.Requests[n].Jobs) {
				return nil, fmt.Errorf("request %d: %d jobs written of %d", n+1, len(v), len(a.Requests[n].Jobs))
			}
			out[n].Written = make([]bool, len(v))
			for k, w := range v {
				out[n].Written[k] = w == 1
			}
		case "rate":
			v, err := ints(1)
			if err != nil {
				return nil, err
			}
			if len(v) != 2 || v[0] < 1 || v[0] > len(a.Rates) {
				return nil, fmt.Errorf("request %d: rate refusal %v for %d rates", n+1, reply, len(a.Rates))
			}
			out[n].Rate = &RateRefusal{Check: v[0] - 1, RetryAfter: time.Duration(v[1]) * time.Millisecond}
		case "backlog":
			v, err := ints(1)
			if err != nil {
				return nil, err
			}
			if len(v) < 2 || v[0] < 1 || v[0] > len(a.Checks) {
				return nil, fmt.Errorf("request %d: backlog refusal %v for %d checks", n+1, reply, len(a.Checks))
			}
			d := a.Checks[v[0]-1]
			if len(v) != 2+2*len(d.limits) {
				return nil, fmt.Errorf("request %d: backlog refusal %v for a pool of %d tiers", n+1, reply, len(d.limits))
			}
			br := &BacklogRefusal{Check: v[0] - 1, Backlog: v[1], Tiers: make([]TierRoom, len(d.limits))}
			for t := range br.Tiers {
				br.Tiers[t] = TierRoom{Room: v[2+2*t], Need: v[3+2*t]}
			}
			out[n].Backlog = br
		default:
			return nil, fmt.Errorf("request %d: reply %v", n+1, reply)
		}
	}
	return out, nil
}

// QueuedJob names a job by its queue and ID.
type QueuedJob struct{ Queue, ID string }

// TakeBack removes jobs a request wrote at the door that are still
// waiting (pending or scheduled), and reports per job whether it was taken
// back; a job that started, finished or is gone stays. On a Redis Cluster
// the jobs must be one pool's.
func (j *Jobs) TakeBack(ctx context.Context, jobs []QueuedJob) ([]bool, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, 3*len(jobs))
	args := make([]any, 0, len(jobs))
	for _, job := range jobs {
		keys = append(keys, TaskKey(job.Queue, job.ID), PendingKey(job.Queue), scheduledKey(job.Queue))
		args = append(args, job.ID)
	}
	res, err := takeBackScript.Run(ctx, j.rc, keys, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("take back %d jobs: %w", len(jobs), err)
	}
	if len(res) != len(jobs) {
		return nil, fmt.Errorf("take back %d jobs: %d replies", len(jobs), len(res))
	}
	out := make([]bool, len(jobs))
	for k, v := range res {
		out[k] = v == 1
	}
	return out, nil
}

// LeaveLine takes waiter token out of the waiting lines of doors (those
// whose requests may wait), in one pipelined round trip.
func (j *Jobs) LeaveLine(ctx context.Context, doors []*Door, token string) error {
	pipe := j.rc.Pipeline()
	for _, d := range doors {
		if d.waits {
			pipe.ZRem(ctx, d.waiting, token)
			pipe.HDel(ctx, d.waitingData, token)
		}
	}
	if pipe.Len() == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("leave the door's waiting line: %w", err)
	}
	return nil
}

// CountRefused adds jobs refused for reason (RefusedBacklog or
// RefusedRate) to pool's refusal counts: byTier maps a tier ("" without
// tiers) to how many. One pipelined round trip.
func (j *Jobs) CountRefused(ctx context.Context, pool, reason string, byTier map[string]int64) error {
	if len(byTier) == 0 {
		return nil
	}
	_, _, refused := j.ks.doorKeys(pool)
	pipe := j.rc.Pipeline()
	for tier, n := range byTier {
		pipe.HIncrBy(ctx, refused, RefusedField(tier, reason), n)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("count the jobs pool %q refused: %w", pool, err)
	}
	return nil
}

// DoorCounts is what a pool's door has done: Refused counts the jobs it
// refused, by tier ("" without tiers), then by reason; Waiting is how
// many requests wait in its line now.
type DoorCounts struct {
	Refused map[string]map[string]int64
	Waiting int64
}

// DoorStats reads pool's refusal counts and the length of its waiting
// line, in one pipelined round trip. Fields of the counts that are not
// the door's are skipped.
func (j *Jobs) DoorStats(ctx context.Context, pool string) (DoorCounts, error) {
	waiting, _, refused := j.ks.doorKeys(pool)
	pipe := j.rc.Pipeline()
	counts := pipe.HGetAll(ctx, refused)
	n := pipe.ZCard(ctx, waiting)
	if _, err := pipe.Exec(ctx); err != nil {
		return DoorCounts{}, fmt.Errorf("read the door of pool %q: %w", pool, err)
	}
	st := DoorCounts{Refused: map[string]map[string]int64{}, Waiting: n.Val()}
	for field, v := range counts.Val() {
		tier, reason, ok := strings.Cut(field, "|")
		count, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil {
			continue // not ours
		}
		if st.Refused[tier] == nil {
			st.Refused[tier] = map[string]int64{}
		}
		st.Refused[tier][reason] += count
	}
	return st, nil
}
