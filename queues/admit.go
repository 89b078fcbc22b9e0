package queues

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

//go:embed lua/admit.lua
var admitLua string

var admitScript = redis.NewScript(admitLua)

// Waiting for room in a backlog: a waiting request asks again every
// admitPoll (jittered by half), and its place in line lapses admitWaiterTTL
// after it last asked, so a producer that died holds no room.
const (
	admitPoll      = 50 * time.Millisecond
	admitWaiterTTL = time.Second
	// admitMaxPerCall bounds the jobs of one script call (and of one batch
	// to pools with a door).
	admitMaxPerCall = 10000
	// admitMaxGroup bounds how many single enqueues share a call.
	admitMaxGroup = 64
)

// doorJob is one job of a batch that goes through its pool's door.
type doorJob struct {
	i        int          // index in the batch
	replaces *existingJob // the finished job it replaces, or nil
}

// doorRequest is one enqueue request (a batch, or one job) at the door:
// all of its jobs are admitted, or none.
type doorRequest struct {
	reqs    []Request
	pools   []*Pool
	results []EnqueueResult
	jobs    []doorJob
	// wait is the longest backlog_wait of its pools: a request that may
	// wait goes through the door on its own.
	wait time.Duration

	err   error
	done  chan struct{} // closed when err and results are final
	lead  chan struct{} // closed to make a waiting caller run calls
	leads bool          // lead was closed (under doorGroup.mu)
}

// backlogRecount is how old the door's bound of a pool's backlog may be
// before a request is decided on an exact count again (see
// lua/admit.lua): it bounds how long jobs that enter the backlog without
// passing the door (asynq's own client, a job retried from the archive)
// go unseen.
const backlogRecount = time.Second

func (c *Client) setBacklogRecount(d time.Duration) {
	c.backlogRecount, c.recountArg = d, strconv.FormatInt(d.Milliseconds(), 10)
}

// poolDoor is what a pool's door needs from Redis, worked out once per
// pool: its keys, its tiers' limits and its rates' fields.
type poolDoor struct {
	state                string // the door state hash (lua/admit.lua)
	waiting, waitingData string // the line of requests waiting for room
	queues               string // its tiers' queues, highest first, space-separated
	limits               []int  // per tier, highest first
	typeFields           map[string]string
	fast                 fastDoor
}

func newPoolDoor(ks rdb.Keyspace, p *Pool) *poolDoor {
	d := &poolDoor{state: ks.DoorStateKey(p.Name()), typeFields: map[string]string{}}
	d.waiting, d.waitingData, _ = ks.DoorKeys(p.Name())
	for _, q := range p.queues {
		d.limits = append(d.limits, p.cfg.tierLimit(p.TierOf(q)))
	}
	d.queues = strings.Join(p.queues, " ")
	for jt := range p.cfg.JobTypeRates {
		d.typeFields[jt] = rateField("type:" + jt)
	}
	d.fast = newFastDoor(p, d)
	return d
}

// rateField is the field of a pool's door state that holds one of the
// pool's own enqueue rates: kind is "enqueue" or "type:<job type>". A
// caller key's rate has a key of its own (rateKey), which expires.
func rateField(kind string) string { return "tat:" + kind }

var enqueueRateField = rateField("enqueue")

// poolCheck is the backlog check of one pool in a call.
type poolCheck struct {
	pool  *Pool
	state int // 1-based index of the pool's door state in the call
}

// rateCheck is the check of one enqueue rate limit in a call.
type rateCheck struct {
	pool         *Pool
	limit        string // the config key
	jobType, key string
	rate         Rate
	// state is the 1-based index of the door state holding it, in field;
	// 0 for a caller key's rate, in its own redisKey.
	state           int
	field, redisKey string
}

// rateID names a rate check in a call: per pool, its limit and the job
// type or caller key it is for.
type rateID struct {
	pool        *Pool
	limit, name string
}

// admitCall is one run of the admit script: the checks its requests need,
// and what each request brings to each check.
type admitCall struct {
	c        *Client
	states   []*Pool // the pools whose door state the call reads
	checks   []*poolCheck
	rates    []*rateCheck
	rateOf   map[rateID]int
	requests []*doorRequest
	needs    [][][]int // per request, per check, per tier
	rneeds   [][]int   // per request, per rate
}

func (c *Client) newAdmitCall() *admitCall {
	return &admitCall{c: c, rateOf: map[rateID]int{}}
}

// state returns the 1-based index of p's door state in the call.
func (a *admitCall) state(p *Pool) int {
	for k, s := range a.states {
		if s == p {
			return k + 1
		}
	}
	a.states = append(a.states, p)
	return len(a.states)
}

// check returns the index of p's backlog check in the call.
func (a *admitCall) check(p *Pool) int {
	for k, pc := range a.checks {
		if pc.pool == p {
			return k
		}
	}
	a.checks = append(a.checks, &poolCheck{pool: p, state: a.state(p)})
	return len(a.checks) - 1
}

// add takes a request into the call. It returns a refusal that needs no
// Redis (a batch larger than a rate's burst can never pass).
func (a *admitCall) add(r *doorRequest) error {
	var needs [][]int // per check
	rneeds := make([]int, len(a.rates), len(a.rates)+2)
	addRate := func(p *Pool, limit, name string, rt *Rate) {
		if rt == nil {
			return
		}
		id := rateID{p, limit, name}
		k, ok := a.rateOf[id]
		if !ok {
			k = len(a.rates)
			a.rateOf[id] = k
			rc := &rateCheck{pool: p, limit: limit, rate: *rt}
			switch limit {
			case "enqueue_rate_per_key":
				rc.key, rc.redisKey = name, a.c.ks.RateKey(p.Name(), "key:"+name)
			case "job_type_rates":
				rc.jobType, rc.state, rc.field = name, a.state(p), p.door.typeFields[name]
			default:
				rc.state, rc.field = a.state(p), enqueueRateField
			}
			a.rates = append(a.rates, rc)
			rneeds = append(rneeds, 0)
		}
		rneeds[k]++
	}
	for _, j := range r.jobs {
		p, req := r.pools[j.i], r.reqs[j.i]
		if p.cfg.MaxBacklog > 0 {
			k := a.check(p)
			for len(needs) <= k {
				needs = append(needs, nil)
			}
			if needs[k] == nil {
				needs[k] = make([]int, len(p.queues))
			}
			needs[k][p.rank(r.results[j.i].Queue)-1]++
		}
		addRate(p, "enqueue_rate", "", p.cfg.EnqueueRate)
		if jr, ok := p.cfg.JobTypeRates[req.JobType]; ok {
			addRate(p, "job_type_rates", req.JobType, &jr)
		}
		if req.Options.RateKey != "" {
			addRate(p, "enqueue_rate_per_key", req.Options.RateKey, p.cfg.EnqueueRatePerKey)
		}
	}
	for k, rc := range a.rates {
		if n := rneeds[k]; n > rc.rate.Burst {
			return rc.refusal(n, 0)
		}
	}
	a.requests = append(a.requests, r)
	a.needs = append(a.needs, needs)
	a.rneeds = append(a.rneeds, rneeds)
	return nil
}

// script builds the call's keys and arguments.
func (a *admitCall) script(wait bool, token string) (keys []string, args []any) {
	keys = make([]string, 0, 1+len(a.states)+len(a.rates)+2*len(a.requests))
	keys = append(keys, a.allQueuesKey())
	w := "0"
	if wait {
		w = "1"
	}
	args = make([]any, 0, 16+9*len(a.requests))
	args = append(args, len(a.states), len(a.checks), len(a.rates), len(a.requests), w, token,
		admitWaiterTTL.Milliseconds(), strconv.FormatInt(time.Now().UnixNano(), 10), a.c.backlogRecount.Milliseconds())
	// The fields each door state is read for: a backlog check's bound
	// first, then its rates.
	fields := make([][]any, len(a.states))
	for _, pc := range a.checks {
		fields[pc.state-1] = append(fields[pc.state-1], "est", "counted")
	}
	ratePos := make([]int, len(a.rates))
	for k, rc := range a.rates {
		if rc.state > 0 {
			fields[rc.state-1] = append(fields[rc.state-1], rc.field)
			ratePos[k] = len(fields[rc.state-1])
		}
	}
	for s, p := range a.states {
		keys = append(keys, p.door.state)
		args = append(args, len(fields[s]))
		args = append(args, fields[s]...)
	}
	for _, pc := range a.checks {
		d := pc.pool.door
		waits := "0"
		if pc.pool.cfg.BacklogWait > 0 {
			waits = "1"
			keys = append(keys, d.waiting, d.waitingData)
		}
		args = append(args, pc.state, waits, len(d.limits))
		for _, l := range d.limits {
			args = append(args, l)
		}
		args = append(args, d.queues)
	}
	for k, rc := range a.rates {
		if rc.state > 0 {
			args = append(args, rc.state, ratePos[k])
		} else {
			keys = append(keys, rc.redisKey)
			args = append(args, 0)
		}
		args = append(args, strconv.FormatFloat(float64(rc.rate.interval())/float64(time.Millisecond), 'f', -1, 64), rc.rate.Burst)
	}
	now := time.Now()
	for n, r := range a.requests {
		args = append(args, len(r.jobs))
		// Needs as pairs: per check, of tier and need; then of rate check
		// and need.
		for k := range a.checks {
			var need []int // nil when the request has no job in the pool
			if k < len(a.needs[n]) {
				need = a.needs[n][k]
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
		for k, v := range a.rneeds[n] {
			if v > 0 {
				args = append(args, k+1, v)
			}
		}
		args[at] = (len(args) - at - 1) / 2
		for _, j := range r.jobs {
			p, req, q := r.pools[j.i], r.reqs[j.i], r.results[j.i].Queue
			id := req.Options.ID
			if id == "" {
				id = uuid.NewString()
			}
			r.results[j.i].ID = id
			at, list := "0", rdb.PendingKey(q)
			if req.Options.ProcessIn > 0 {
				at, list = strconv.FormatInt(now.Add(req.Options.ProcessIn).Unix(), 10), rdb.ScheduledKey(q)
			}
			keys = append(keys, rdb.TaskKey(q, id), list)
			publish := ""
			if _, ok := a.c.published.Load(q); !ok {
				publish = q
			}
			replace := "0"
			if j.replaces != nil {
				replace = "1"
				set := rdb.ArchivedKey(j.replaces.queue)
				if j.replaces.state == "completed" {
					set = rdb.CompletedKey(j.replaces.queue)
				}
				keys = append(keys, rdb.TaskKey(j.replaces.queue, id), set)
			}
			args = append(args, id, appendTaskMessage(nil, p, q, id, req, now), at, publish, replace)
		}
	}
	return keys, args
}

// run runs the call once. For each request it returns nil (its jobs were
// written; a job whose ID was taken meanwhile is a Duplicate), or its
// refusal: a *BacklogError (without the wait) or a *RateLimitError.
func (a *admitCall) run(ctx context.Context, wait bool, token string) ([]error, error) {
	if err := a.publishFirst(ctx); err != nil {
		return nil, err
	}
	keys, args := a.script(wait, token)
	res, err := admitScript.Run(ctx, a.c.rdb, keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	out := make([]error, len(a.requests))
	for n, r := range a.requests {
		reply := res[n].([]any)
		switch reply[0] {
		case "ok":
			for k, j := range r.jobs {
				if reply[1+k].(int64) == 0 {
					// Its ID was taken meanwhile by something that does not
					// take the lock (asynq's own tools, say).
					r.results[j.i].Outcome = Duplicate
				} else if _, ok := a.c.published.Load(r.results[j.i].Queue); !ok {
					a.c.published.Store(r.results[j.i].Queue, true)
				}
			}
		case "rate":
			k := int(reply[1].(int64)) - 1
			out[n] = a.rates[k].refusal(a.rneeds[n][k], time.Duration(reply[2].(int64))*time.Millisecond)
		default:
			k := int(reply[1].(int64)) - 1
			out[n] = a.checks[k].refusal(reply[2:])
		}
	}
	return out, nil
}

// admit takes one request through the door: its jobs are checked and, if
// every check passes, written into their queues in the same Redis step. On
// a refusal nothing is written and the error is a *BacklogError or a
// *RateLimitError; a backlog refusal waits for room first where the pool
// says so. A request that may not wait may share its Redis call with
// other single enqueues of this client at the same moment.
func (c *Client) admit(ctx context.Context, r *doorRequest) error {
	if parts := c.splitDoorRequest(r); parts != nil {
		return c.admitEach(ctx, parts) // a Redis Cluster: one pool per call
	}
	if len(r.jobs) > admitMaxPerCall {
		return fmt.Errorf("%w: a batch may bring at most %d jobs to pools with door limits (max_backlog, rates), got %d: split it; nothing was enqueued", ErrInvalidRequest, admitMaxPerCall, len(r.jobs))
	}
	for _, j := range r.jobs {
		if p := r.pools[j.i]; p.cfg.MaxBacklog > 0 {
			r.wait = max(r.wait, p.cfg.BacklogWait)
		}
	}
	if r.wait == 0 && len(r.jobs) == 1 {
		return c.door.admit(ctx, c, r)
	}
	if c.fastable(r) {
		// A request that may wait is admitted at once if it fits under
		// the bound; else it waits through the general script.
		n, err := c.admitFast(ctx, []*doorRequest{r})
		if err != nil || n == 1 {
			return err
		}
	}
	a := c.newAdmitCall()
	if err := a.add(r); err != nil {
		c.countRefused(ctx, r, err)
		return err
	}
	token := uuid.NewString()
	start := time.Now()
	for {
		errs, err := a.run(ctx, r.wait > 0, token)
		if err != nil {
			c.leaveLine(ctx, a.checks, token)
			return err
		}
		be, ok := errs[0].(*BacklogError)
		if !ok || time.Since(start) >= r.wait {
			if be != nil && r.wait > 0 {
				be.Waited = time.Since(start)
			}
			if r.wait > 0 {
				c.leaveLine(ctx, a.checks, token)
			}
			if errs[0] != nil {
				c.countRefused(ctx, r, errs[0])
				return errs[0]
			}
			return nil
		}
		pause := admitPoll/2 + rand.N(admitPoll)
		t := time.NewTimer(min(pause, r.wait-time.Since(start)))
		select {
		case <-ctx.Done():
			t.Stop()
			c.leaveLine(ctx, a.checks, token)
			return ctx.Err()
		case <-t.C:
		}
	}
}

// doorGroup lets single enqueues that arrive while calls are running
// share the next call: under many producers, the door's checks (a backlog
// count per pool) are paid once per call rather than once per job. Up to
// doorCallsInFlight callers run calls at once, each for the requests
// waiting when it takes them; a caller whose own request is done hands the
// rest to the first waiting one, so nobody serves others for long.
type doorGroup struct {
	mu      sync.Mutex
	running int
	queue   []*doorRequest
}

const doorCallsInFlight = 2

func (g *doorGroup) admit(ctx context.Context, c *Client, r *doorRequest) error {
	r.done, r.lead = make(chan struct{}), make(chan struct{})
	g.mu.Lock()
	g.queue = append(g.queue, r)
	if g.running >= doorCallsInFlight {
		g.mu.Unlock()
		select {
		case <-r.done: // a running caller took it in a call
			return r.err
		case <-r.lead: // a running caller handed over: run calls now
		}
		g.mu.Lock()
	} else {
		g.running++
	}
	for len(g.queue) > 0 {
		batch := g.queue[:min(len(g.queue), admitMaxGroup)]
		g.queue = g.queue[len(batch):]
		g.mu.Unlock()
		c.admitGroup(context.WithoutCancel(ctx), batch)
		g.mu.Lock()
		if isClosed(r.done) {
			break
		}
	}
	if len(g.queue) > 0 && !g.queue[0].leads {
		g.queue[0].leads = true
		close(g.queue[0].lead) // it runs the rest; running stays
	} else {
		g.running--
	}
	g.mu.Unlock()
	<-r.done
	return r.err
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// admitGroup runs one call for single enqueues of different callers, and
// gives each its result. One caller's context does not cancel another's
// enqueue: the call runs without cancellation (Redis's timeouts bound it).
func (c *Client) admitGroup(ctx context.Context, batch []*doorRequest) {
	if parts := slotGroups(c.ks, batch, doorPool); len(parts) > 1 {
		for _, part := range parts { // a Redis Cluster: one pool per call
			c.admitGroup(ctx, part)
		}
		return
	}
	// The fast script first, for as long as it admits; from the first
	// request it does not take, the general script decides the rest.
	for len(batch) > 0 {
		n := c.fastRun(batch)
		if n == 0 {
			break
		}
		admitted, err := c.admitFast(ctx, batch[:n])
		if err != nil {
			for _, r := range batch {
				r.err = err
				close(r.done)
			}
			return
		}
		for _, r := range batch[:admitted] {
			close(r.done)
		}
		batch = batch[admitted:]
		if admitted < n {
			break
		}
	}
	if len(batch) == 0 {
		return
	}
	a := c.newAdmitCall()
	var in []*doorRequest
	for _, r := range batch {
		if err := a.add(r); err != nil {
			c.countRefused(ctx, r, err)
			r.err = err
			close(r.done)
			continue
		}
		in = append(in, r)
	}
	if len(in) == 0 {
		return
	}
	errs, err := a.run(ctx, false, "")
	for n, r := range in {
		if err != nil {
			r.err = err
		} else if errs[n] != nil {
			c.countRefused(ctx, r, errs[n])
			r.err = errs[n]
		}
		close(r.done)
	}
}

// leaveLine takes a request out of every waiting line it may be in.
func (c *Client) leaveLine(ctx context.Context, checks []*poolCheck, token string) {
	bg := context.WithoutCancel(ctx)
	for _, pc := range checks {
		if pc.pool.cfg.BacklogWait == 0 {
			continue
		}
		c.rdb.ZRem(bg, pc.pool.door.waiting, token)
		c.rdb.HDel(bg, pc.pool.door.waitingData, token)
	}
}

// countRefused adds the jobs a refusal turned away, in the refusing pool,
// to the pool's refusal counts, by tier and reason.
func (c *Client) countRefused(ctx context.Context, r *doorRequest, refusal error) {
	var pool, reason string
	switch e := refusal.(type) {
	case *BacklogError:
		pool, reason = e.Pool, "backlog"
	case *RateLimitError:
		pool, reason = e.Pool, "rate"
	default:
		return
	}
	_, _, refused := c.ks.DoorKeys(pool)
	byTier := map[string]int64{}
	for _, j := range r.jobs {
		if r.pools[j.i].Name() == pool {
			byTier[r.results[j.i].Tier]++
		}
	}
	bg := context.WithoutCancel(ctx)
	pipe := c.rdb.Pipeline()
	for tier, n := range byTier {
		pipe.HIncrBy(bg, refused, refusedField(tier, reason), n)
	}
	_, _ = pipe.Exec(bg) // counts only: a lost one is no reason to fail
}

// refusedField is the field of a pool's refusal counts (see doorKeys) that
// counts the jobs of tier refused for reason ("backlog" or "rate");
// DoorStats reads them all back.
func refusedField(tier, reason string) string { return tier + "|" + reason }

// refusal builds the error of a backlog refusal from the script's answer:
// the backlog, then per tier the room and the need.
func (pc *poolCheck) refusal(res []any) *BacklogError {
	e := &BacklogError{Pool: pc.pool.Name(), Backlog: int(res[0].(int64))}
	for k, limit := range pc.pool.door.limits {
		room, need := int(res[1+2*k].(int64)), int(res[2+2*k].(int64))
		tier := pc.pool.TierOf(pc.pool.queues[k])
		if need == 0 {
			continue
		}
		e.Tiers = append(e.Tiers, TierRoom{Tier: tier, Limit: limit, Room: room, Need: need})
		if e.Limit == 0 && need > room {
			e.Tier, e.Limit = tier, limit
		}
	}
	return e
}

func (rc *rateCheck) refusal(need int, after time.Duration) *RateLimitError {
	return &RateLimitError{Pool: rc.pool.Name(), Limit: rc.limit, JobType: rc.jobType, Key: rc.key, Rate: rc.rate, Need: need, RetryAfter: after}
}

// taskMessage encodes a job as asynq's task message (see rdb.AppendTask):
// the fields asynq's client sets for a job enqueued with the options the
// engine uses (see options).
func taskMessage(p *Pool, queue, id string, r Request, now time.Time) string {
	return string(appendTaskMessage(nil, p, queue, id, r, now))
}

// appendTaskMessage appends taskMessage's encoding to b.
func appendTaskMessage(b []byte, p *Pool, queue, id string, r Request, now time.Time) []byte {
	return rdb.AppendTask(b, rdb.Task{
		Type: r.JobType, Payload: r.Payload, ID: id, Queue: queue,
		Retry: p.cfg.retries() + CrashRetries, Timeout: p.cfg.JobTimeout, Retention: r.Options.Retention,
		ReadyAt: jobReadyAt(now, r.Options),
	})
}

// DoorStats is what a pool's door has done, read from Redis: every
// producer's refusals count.
type DoorStats struct {
	// Refused counts the jobs refused, by tier ("" for a pool without
	// tiers), then by reason: "backlog" or "rate".
	Refused map[string]map[string]int64
	// Waiting is how many requests wait for room in the backlog now.
	Waiting int64
}

// DoorStats reads what the door of the pool called name has done.
func (c *Client) DoorStats(ctx context.Context, name string) (DoorStats, error) {
	p, err := c.pools().get(name)
	if err != nil {
		return DoorStats{}, err
	}
	waiting, _, refused := c.ks.DoorKeys(p.Name())
	pipe := c.rdb.Pipeline()
	counts := pipe.HGetAll(ctx, refused)
	n := pipe.ZCard(ctx, waiting)
	if _, err := pipe.Exec(ctx); err != nil {
		return DoorStats{}, err
	}
	st := DoorStats{Refused: map[string]map[string]int64{}, Waiting: n.Val()}
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
