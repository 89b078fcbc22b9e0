package queues

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// The door's fast path. Most enqueues at a door are single jobs that fit
// under the pool's running bound and pass its rates. The general script
// (lua/admit.lua) decides any request, and pays for it on every call: it
// takes 40-odd arguments and defines its helpers each time it runs, and
// Lua, not Redis, is what a call costs. lua/admit_fast.lua decides only
// the common case, from a dozen arguments, and hands everything else back
// untouched, so the general script decides it exactly as before.

//go:embed lua/admit_fast.lua
var admitFastLua string

var admitFastScript = redis.NewScript(admitFastLua)

// fastDoor is what the fast script needs of a pool, worked out once.
type fastDoor struct {
	// heads are the script's arguments before the jobs, by job type ("":
	// job types without a rate of their own); the first two, the recount
	// interval and pending_since, are filled in per call.
	heads map[string][]any
	// limits and pending are per tier, highest first: its backlog limit
	// as an argument ("0" without max_backlog) and its pending list.
	limits  []any
	pending []string
}

func newFastDoor(p *Pool, d *poolDoor) fastDoor {
	f := fastDoor{heads: map[string][]any{}}
	for k, q := range p.queues {
		f.limits = append(f.limits, strconv.Itoa(d.limits[k]))
		f.pending = append(f.pending, rdb.PendingKey(q))
	}
	head := func(rates []*Rate, fields []string) []any {
		waits, backlog := "0", "0"
		if p.cfg.BacklogWait > 0 {
			waits = "1"
		}
		if p.cfg.MaxBacklog > 0 {
			backlog = "1"
		}
		h := []any{"", "", waits, backlog, strconv.Itoa(len(rates))}
		for _, field := range fields {
			h = append(h, field)
		}
		for _, rt := range rates {
			// The same numbers as the general script's: its interval
			// argument and burst times that interval.
			iv := float64(rt.interval()) / float64(time.Millisecond)
			h = append(h, strconv.FormatFloat(iv, 'f', -1, 64), strconv.FormatFloat(float64(rt.Burst)*iv, 'f', -1, 64))
		}
		return h
	}
	var rates []*Rate
	var fields []string
	if p.cfg.EnqueueRate != nil {
		rates, fields = append(rates, p.cfg.EnqueueRate), append(fields, enqueueRateField)
	}
	f.heads[""] = head(rates, fields)
	for jt, rt := range p.cfg.JobTypeRates {
		f.heads[jt] = head(append(rates[:len(rates):len(rates)], &rt), append(fields[:len(fields):len(fields)], d.typeFields[jt]))
	}
	return f
}

// head returns the fast script's leading arguments for a job type.
func (f *fastDoor) head(jobType string) []any {
	if h, ok := f.heads[jobType]; ok {
		return h
	}
	return f.heads[""]
}

// fastable reports whether the fast path may take request r: one job,
// enqueued now, replacing nothing, with no caller key's rate (it has a key
// of its own), into a queue asynq's set of queue names already has (the
// fast script touches no key but its pool's).
func (c *Client) fastable(r *doorRequest) bool {
	if len(r.jobs) != 1 {
		return false
	}
	j := r.jobs[0]
	p, o := r.pools[j.i], r.reqs[j.i].Options
	if j.replaces != nil || o.ProcessIn > 0 || (o.RateKey != "" && p.cfg.EnqueueRatePerKey != nil) {
		return false
	}
	_, ok := c.published.Load(r.results[j.i].Queue)
	return ok
}

// fastRun returns how many requests from the start of rs the fast script
// can take in one call: fastable ones of the same pool, with the same
// rates.
func (c *Client) fastRun(rs []*doorRequest) int {
	var head []any
	var pool *Pool
	for n, r := range rs {
		if !c.fastable(r) {
			return n
		}
		j := r.jobs[0]
		p := r.pools[j.i]
		h := p.door.fast.head(r.reqs[j.i].JobType)
		if n == 0 {
			head, pool = h, p
		} else if p != pool || &h[0] != &head[0] {
			return n
		}
	}
	return len(rs)
}

// admitFast runs the fast script for rs (a fastRun): it admits them in
// order while each fits under the bound and passes its rates, and returns
// how many it admitted, from the first. The rest are untouched, for the
// general script.
func (c *Client) admitFast(ctx context.Context, rs []*doorRequest) (int, error) {
	j0 := rs[0].jobs[0]
	p := rs[0].pools[j0.i]
	f := &p.door.fast
	head := f.head(rs[0].reqs[j0.i].JobType)

	keys := make([]string, 1, 2+2*len(rs))
	keys[0] = p.door.state
	if p.cfg.BacklogWait > 0 {
		keys = append(keys, p.door.waiting)
	}
	now := time.Now()
	args := make([]any, len(head), len(head)+3*len(rs))
	copy(args, head)
	args[0], args[1] = c.recountArg, strconv.FormatInt(now.UnixNano(), 10)
	ids := make([]string, len(rs))
	for n, r := range rs {
		j := r.jobs[0]
		req, q := r.reqs[j.i], r.results[j.i].Queue
		id := req.Options.ID
		if id == "" {
			id = uuid.NewString()
		}
		ids[n] = id
		tier := p.rank(q) - 1
		keys = append(keys, rdb.TaskKey(q, id), f.pending[tier])
		args = append(args, f.limits[tier], id, appendTaskMessage(nil, p, q, id, req, now))
	}
	res, err := admitFastScript.Run(ctx, c.rdb, keys, args...).Slice()
	if err != nil {
		return 0, fmt.Errorf("enqueue: %w", err)
	}
	for n, w := range res {
		j := rs[n].jobs[0]
		rs[n].results[j.i].ID = ids[n]
		if w.(int64) == 0 {
			// Its ID was taken meanwhile by something that does not take
			// the lock (asynq's own tools, say).
			rs[n].results[j.i].Outcome = Duplicate
		}
	}
	return len(res), nil
}
