package queues

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

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
	i        int              // index in the batch
	replaces *rdb.FinishedJob // the finished job it replaces, or nil
}

// doorRequest is one enqueue request (a batch, or one job) at the door:
// all of its jobs are admitted, or none.
type doorRequest struct {
	reqs    []Request
	pools   []*Pool
	results []EnqueueResult
	jobs    []doorJob
	trace   *enqueueSpans // the jobs' trace headers; nil without tracing
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

func (c *Client) setBacklogRecount(d time.Duration) { c.jobs.SetRecount(d) }

// poolDoor is a pool's door: its layout in Redis, worked out once per
// pool, and its tiers' backlog limits.
type poolDoor struct {
	redis  *rdb.Door
	limits []int // per tier, highest first (0 without max_backlog)
}

func newPoolDoor(ks rdb.Keyspace, p *Pool) *poolDoor {
	d := &poolDoor{}
	for _, q := range p.queues {
		d.limits = append(d.limits, p.cfg.tierLimit(p.TierOf(q)))
	}
	cfg := rdb.DoorConfig{
		Pool: p.Name(), Queues: p.queues, Limits: d.limits,
		Backlog: p.cfg.MaxBacklog > 0, Waits: p.cfg.BacklogWait > 0,
		JobTypeRates: map[string]rdb.Rate{},
	}
	if r := p.cfg.EnqueueRate; r != nil {
		cfg.EnqueueRate = &rdb.Rate{Interval: r.interval(), Burst: r.Burst}
	}
	for jt, r := range p.cfg.JobTypeRates {
		cfg.JobTypeRates[jt] = rdb.Rate{Interval: r.interval(), Burst: r.Burst}
	}
	d.redis = rdb.NewDoor(ks, cfg)
	return d
}

// poolCheck is the backlog check of one pool in a call.
type poolCheck struct{ pool *Pool }

// rateCheck is the check of one enqueue rate limit in a call.
type rateCheck struct {
	pool         *Pool
	limit        string // the config key
	jobType, key string
	rate         Rate
}

// rateID names a rate check in a call: per pool, its limit and the job
// type or caller key it is for.
type rateID struct {
	pool        *Pool
	limit, name string
}

// admitCall is one run of the door's general script: the checks its
// requests need, and what each request brings to each check.
type admitCall struct {
	c        *Client
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

// check returns the index of p's backlog check in the call.
func (a *admitCall) check(p *Pool) int {
	for k, pc := range a.checks {
		if pc.pool == p {
			return k
		}
	}
	a.checks = append(a.checks, &poolCheck{pool: p})
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
				rc.key = name
			case "job_type_rates":
				rc.jobType = name
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

// args builds the call's typed arguments, with a new ID for each job
// enqueued without one.
func (a *admitCall) args(wait bool, token string) rdb.AdmitArgs {
	now := time.Now()
	args := rdb.AdmitArgs{Wait: wait, Token: token, WaiterTTL: admitWaiterTTL, Now: now,
		Checks: make([]*rdb.Door, len(a.checks)), Rates: make([]rdb.RateCheck, len(a.rates)), Requests: make([]rdb.AdmitRequest, len(a.requests))}
	for k, pc := range a.checks {
		args.Checks[k] = pc.pool.door.redis
	}
	for k, rc := range a.rates {
		args.Rates[k] = rdb.RateCheck{Door: rc.pool.door.redis, JobType: rc.jobType, Key: rc.key,
			Rate: rdb.Rate{Interval: rc.rate.interval(), Burst: rc.rate.Burst}}
	}
	for n, r := range a.requests {
		jobs := make([]rdb.AdmitJob, len(r.jobs))
		for k, j := range r.jobs {
			p, req, q := r.pools[j.i], r.reqs[j.i], r.results[j.i].Queue
			id := req.Options.ID
			if id == "" {
				id = uuid.NewString()
			}
			job := rdb.AdmitJob{Door: p.door.redis, Tier: p.rank(q) - 1, ID: id, Msg: appendTaskMessage(nil, p, q, id, req, now, r.trace.of(j.i))}
			if req.Options.ProcessIn > 0 {
				job.ProcessAt = now.Add(req.Options.ProcessIn)
			}
			if _, ok := a.c.published.Load(q); !ok {
				job.Publish = true
			}
			job.Replaces = j.replaces
			jobs[k] = job
		}
		args.Requests[n] = rdb.AdmitRequest{Backlog: a.needs[n], Rates: a.rneeds[n], Jobs: jobs}
	}
	return args
}

// run runs the call once. For each request it returns nil (its jobs were
// written, and their results say so; a job whose ID was taken meanwhile
// is a Duplicate), or its refusal: a *BacklogError (without the wait) or
// a *RateLimitError.
func (a *admitCall) run(ctx context.Context, wait bool, token string) ([]error, error) {
	if err := a.publishFirst(ctx); err != nil {
		return nil, err
	}
	args := a.args(wait, token)
	replies, err := a.c.jobs.Admit(ctx, args)
	if err != nil {
		return nil, err
	}
	out := make([]error, len(a.requests))
	for n, r := range a.requests {
		switch reply := replies[n]; {
		case reply.Rate != nil:
			k := reply.Rate.Check
			out[n] = a.rates[k].refusal(a.rneeds[n][k], reply.Rate.RetryAfter)
		case reply.Backlog != nil:
			out[n] = a.checks[reply.Backlog.Check].refusal(reply.Backlog)
		default:
			for k, j := range r.jobs {
				res := &r.results[j.i]
				if !reply.Written[k] {
					// Its ID was taken meanwhile by something that does not
					// take the lock (asynq's own tools, say).
					res.Outcome = Duplicate
					continue
				}
				res.ID, res.Outcome = args.Requests[n].Jobs[k].ID, Enqueued
				if j.replaces != nil {
					res.Outcome = Replaced
				}
				if args.Requests[n].Jobs[k].Publish {
					a.c.published.Store(res.Queue, true)
				}
			}
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

// leaveLine takes a request out of every waiting line it may be in. The
// line forgets a waiter that stops asking by itself (admitWaiterTTL), so
// a failure here costs nothing but that wait.
func (c *Client) leaveLine(ctx context.Context, checks []*poolCheck, token string) {
	doors := make([]*rdb.Door, len(checks))
	for k, pc := range checks {
		doors[k] = pc.pool.door.redis
	}
	_ = c.jobs.LeaveLine(context.WithoutCancel(ctx), doors, token)
}

// countRefused adds the jobs a refusal turned away, in the refusing pool,
// to the pool's refusal counts, by tier and reason.
func (c *Client) countRefused(ctx context.Context, r *doorRequest, refusal error) {
	var pool, reason string
	switch e := refusal.(type) {
	case *BacklogError:
		pool, reason = e.Pool, rdb.RefusedBacklog
	case *RateLimitError:
		pool, reason = e.Pool, rdb.RefusedRate
	default:
		return
	}
	byTier := map[string]int64{}
	for _, j := range r.jobs {
		if r.pools[j.i].Name() == pool {
			byTier[r.results[j.i].Tier]++
		}
	}
	// Counts only: a lost one is no reason to fail.
	_ = c.jobs.CountRefused(context.WithoutCancel(ctx), pool, reason, byTier)
}

// refusal builds the error of a backlog refusal from the script's answer.
func (pc *poolCheck) refusal(r *rdb.BacklogRefusal) *BacklogError {
	e := &BacklogError{Pool: pc.pool.Name(), Backlog: r.Backlog}
	for k, limit := range pc.pool.door.limits {
		room, need := r.Tiers[k].Room, r.Tiers[k].Need
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
	return string(appendTaskMessage(nil, p, queue, id, r, now, nil))
}

// appendTaskMessage appends taskMessage's encoding to b, with the trace
// headers trace (key, value pairs; nil for none).
func appendTaskMessage(b []byte, p *Pool, queue, id string, r Request, now time.Time, trace []string) []byte {
	if r.Options.run != "" {
		trace = append(slices.Clip(trace), rdb.RunHeader, r.Options.run)
	}
	return rdb.AppendTask(b, rdb.Task{
		Type: r.JobType, Payload: r.Payload, ID: id, Queue: queue,
		Retry: p.cfg.retries() + CrashRetries, Timeout: p.cfg.JobTimeout, Retention: r.Options.Retention,
		ReadyAt: jobReadyAt(now, r.Options), Headers: trace,
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
	st, err := c.jobs.DoorStats(ctx, p.Name())
	if err != nil {
		return DoorStats{}, err
	}
	return DoorStats{Refused: st.Refused, Waiting: st.Waiting}, nil
}
