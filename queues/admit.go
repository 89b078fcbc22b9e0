package queues

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"
)

//go:embed lua/admit.lua
var admitLua string

var admitScript = redis.NewScript(admitLua)

// Waiting for room in a backlog: a waiting request asks again every
// admitPoll (jittered by half), and its place in line lapses admitWaiterTTL
// after it last asked, so a producer that died holds no room.
const (
	admitPoll       = 50 * time.Millisecond
	admitWaiterTTL  = time.Second
	admitMaxPerCall = 10000
)

// doorJob is one job of a batch that goes through its pool's door.
type doorJob struct {
	i        int          // index in the batch
	replaces *existingJob // the finished job it replaces, or nil
}

// poolCheck is a batch's backlog check of one pool.
type poolCheck struct {
	pool          *Pool
	limits, needs []int // per tier, highest first
}

// rateCheck is a batch's check of one enqueue rate limit.
type rateCheck struct {
	pool         *Pool
	limit        string // the config key
	jobType, key string
	rate         Rate
	need         int
	redisKey     string
}

// admit checks the doors of the jobs reqs[j.i] for each j in jobs (all of
// pools with a door, none a duplicate) and, if every check passes, writes
// them into their queues in the same Redis step. On a refusal nothing is
// written and the error is a *BacklogError or a *RateLimitError; a
// backlog refusal waits for room first where the pool says so.
func (c *Client) admit(ctx context.Context, reqs []Request, pools []*Pool, results []EnqueueResult, jobs []doorJob) error {
	if len(jobs) > admitMaxPerCall {
		return fmt.Errorf("%w: a batch may bring at most %d jobs to pools with door limits (max_backlog, rates), got %d: split it; nothing was enqueued", ErrInvalidRequest, admitMaxPerCall, len(jobs))
	}
	ns := c.cfg.Namespace
	var checks []*poolCheck
	checkOf := map[*Pool]*poolCheck{}
	var rates []*rateCheck
	rateOf := map[string]*rateCheck{}
	addRate := func(p *Pool, limit, jobType, key string, r *Rate, kind string) {
		if r == nil {
			return
		}
		rk := rateKey(ns, p.Name(), kind)
		rc, ok := rateOf[rk]
		if !ok {
			rc = &rateCheck{pool: p, limit: limit, jobType: jobType, key: key, rate: *r, redisKey: rk}
			rateOf[rk] = rc
			rates = append(rates, rc)
		}
		rc.need++
	}
	for _, j := range jobs {
		p, r := pools[j.i], reqs[j.i]
		if p.cfg.MaxBacklog > 0 {
			pc, ok := checkOf[p]
			if !ok {
				pc = &poolCheck{pool: p, needs: make([]int, len(p.queues))}
				for k := range p.queues {
					pc.limits = append(pc.limits, p.cfg.tierLimit(p.TierOf(p.queues[k])))
				}
				checkOf[p] = pc
				checks = append(checks, pc)
			}
			pc.needs[p.rank(results[j.i].Queue)-1]++
		}
		addRate(p, "enqueue_rate", "", "", p.cfg.EnqueueRate, "enqueue")
		if jr, ok := p.cfg.JobTypeRates[r.JobType]; ok {
			addRate(p, "job_type_rates", r.JobType, "", &jr, "type:"+r.JobType)
		}
		if r.Options.RateKey != "" {
			addRate(p, "enqueue_rate_per_key", "", r.Options.RateKey, p.cfg.EnqueueRatePerKey, "key:"+r.Options.RateKey)
		}
	}
	for _, rc := range rates {
		if rc.need > rc.rate.Burst {
			err := rc.refusal(0)
			c.countRefused(ctx, reqs, pools, results, jobs, rc.pool, "rate")
			return err
		}
	}

	keys := []string{asynqAllQueues}
	args := []any{"0", uuid.NewString(), admitWaiterTTL.Milliseconds(), len(checks), len(rates), len(jobs)}
	wait := time.Duration(0)
	for _, pc := range checks {
		waiting, data, _ := doorKeys(ns, pc.pool.Name())
		keys = append(keys, waiting, data)
		args = append(args, len(pc.limits))
		for k, q := range pc.pool.queues {
			keys = append(keys, asynqPendingKey(q), asynqScheduledKey(q), asynqRetryKey(q))
			args = append(args, pc.limits[k], pc.needs[k])
		}
		wait = max(wait, pc.pool.cfg.BacklogWait)
	}
	if wait > 0 {
		args[0] = "1"
	}
	for _, rc := range rates {
		keys = append(keys, rc.redisKey)
		args = append(args, strconv.FormatFloat(float64(rc.rate.interval())/float64(time.Millisecond), 'f', -1, 64), rc.rate.Burst, rc.need)
	}
	now := time.Now()
	for _, j := range jobs {
		p, r, q := pools[j.i], reqs[j.i], results[j.i].Queue
		id := r.Options.ID
		if id == "" {
			id = uuid.NewString()
		}
		results[j.i].ID = id
		at, list := "0", asynqPendingKey(q)
		if r.Options.ProcessIn > 0 {
			at, list = strconv.FormatInt(now.Add(r.Options.ProcessIn).Unix(), 10), asynqScheduledKey(q)
		}
		keys = append(keys, asynqTaskKey(q, id), list)
		replace := "0"
		if j.replaces != nil {
			replace = "1"
			set := asynqArchivedKey(j.replaces.queue)
			if j.replaces.state == "completed" {
				set = asynqCompletedKey(j.replaces.queue)
			}
			keys = append(keys, asynqTaskKey(j.replaces.queue, id), set)
		}
		args = append(args, id, taskMessage(p, q, id, r), at, q, replace)
	}

	start := time.Now()
	token := args[1]
	for {
		res, err := admitScript.Run(ctx, c.rdb, keys, args...).Slice()
		if err != nil {
			c.leaveLine(ctx, checks, token)
			return fmt.Errorf("enqueue: %w", err)
		}
		switch res[0] {
		case "ok":
			for n, j := range jobs {
				if res[1+n].(int64) == 0 {
					// Its ID was taken meanwhile by something that does not
					// take the lock (asynq's own tools, say).
					results[j.i].Outcome = Duplicate
				}
			}
			return nil
		case "rate":
			c.leaveLine(ctx, checks, token)
			rc := rates[res[1].(int64)-1]
			c.countRefused(ctx, reqs, pools, results, jobs, rc.pool, "rate")
			return rc.refusal(time.Duration(res[2].(int64)) * time.Millisecond)
		}
		pc := checks[res[1].(int64)-1]
		waited := time.Since(start)
		if waited < pc.pool.cfg.BacklogWait {
			pause := admitPoll/2 + rand.N(admitPoll)
			t := time.NewTimer(min(pause, pc.pool.cfg.BacklogWait-waited))
			select {
			case <-ctx.Done():
				t.Stop()
				c.leaveLine(ctx, checks, token)
				return ctx.Err()
			case <-t.C:
			}
			continue
		}
		c.leaveLine(ctx, checks, token)
		c.countRefused(ctx, reqs, pools, results, jobs, pc.pool, "backlog")
		return pc.refusal(res[2:], waited)
	}
}

// leaveLine takes a request out of every waiting line it may be in.
func (c *Client) leaveLine(ctx context.Context, checks []*poolCheck, token any) {
	bg := context.WithoutCancel(ctx)
	for _, pc := range checks {
		if pc.pool.cfg.BacklogWait == 0 {
			continue
		}
		waiting, data, _ := doorKeys(c.cfg.Namespace, pc.pool.Name())
		c.rdb.ZRem(bg, waiting, token)
		c.rdb.HDel(bg, data, fmt.Sprint(token))
	}
}

// countRefused adds the jobs of pool p in a refused batch to the pool's
// refusal counts, by tier and reason.
func (c *Client) countRefused(ctx context.Context, reqs []Request, pools []*Pool, results []EnqueueResult, jobs []doorJob, p *Pool, reason string) {
	_, _, refused := doorKeys(c.cfg.Namespace, p.Name())
	byTier := map[string]int64{}
	for _, j := range jobs {
		if pools[j.i] == p {
			byTier[results[j.i].Tier]++
		}
	}
	pipe := c.rdb.Pipeline()
	for tier, n := range byTier {
		pipe.HIncrBy(context.WithoutCancel(ctx), refused, tier+"|"+reason, n)
	}
	_, _ = pipe.Exec(context.WithoutCancel(ctx)) // counts only: a lost one is no reason to fail
}

// refusal builds the error of a backlog refusal from the script's answer:
// the backlog, then per tier the room and the need.
func (pc *poolCheck) refusal(res []any, waited time.Duration) *BacklogError {
	e := &BacklogError{Pool: pc.pool.Name(), Backlog: int(res[0].(int64))}
	if pc.pool.cfg.BacklogWait > 0 {
		e.Waited = waited
	}
	for k := range pc.limits {
		room, need := int(res[1+2*k].(int64)), int(res[2+2*k].(int64))
		tier := pc.pool.TierOf(pc.pool.queues[k])
		if need == 0 {
			continue
		}
		e.Tiers = append(e.Tiers, TierRoom{Tier: tier, Limit: pc.limits[k], Room: room, Need: need})
		if e.Limit == 0 && need > room {
			e.Tier, e.Limit = tier, pc.limits[k]
		}
	}
	return e
}

func (rc *rateCheck) refusal(after time.Duration) *RateLimitError {
	return &RateLimitError{Pool: rc.pool.Name(), Limit: rc.limit, JobType: rc.jobType, Key: rc.key, Rate: rc.rate, Need: rc.need, RetryAfter: after}
}

// taskMessage encodes a job as asynq's task message (its protobuf
// TaskMessage, the fields asynq's client sets for a job enqueued with the
// options the engine uses: see options). TestTaskMessage pins it against
// what asynq itself reads back.
func taskMessage(p *Pool, queue, id string, r Request) string {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, r.JobType)
	if len(r.Payload) > 0 {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, r.Payload)
	}
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendString(b, id)
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	b = protowire.AppendString(b, queue)
	if retry := p.cfg.retries() + CrashRetries; retry != 0 {
		b = protowire.AppendTag(b, 5, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(retry))
	}
	b = protowire.AppendTag(b, 8, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(p.cfg.JobTimeout/time.Second))
	if s := int64(r.Options.Retention / time.Second); s > 0 {
		b = protowire.AppendTag(b, 12, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(s))
	}
	return string(b)
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
	p, err := c.pools.get(name)
	if err != nil {
		return DoorStats{}, err
	}
	waiting, _, refused := doorKeys(c.cfg.Namespace, p.Name())
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
