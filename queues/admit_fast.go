package queues

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// The door's fast path. Most enqueues at a door are single jobs that fit
// under the pool's running bound and pass its rates. The general script
// (rdb's lua/admit.lua) decides any request, and pays for it on every
// call: it takes 40-odd arguments and defines its helpers each time it
// runs, and Lua, not Redis, is what a call costs. The fast script
// (lua/admit_fast.lua) decides only the common case, from a dozen
// arguments, and hands everything else back untouched, so the general
// script decides it exactly as before. rdb.Door holds its arguments,
// worked out once per pool.

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
	for n, r := range rs {
		if !c.fastable(r) {
			return n
		}
		if n > 0 && fastDoorOf(r) != fastDoorOf(rs[0]) {
			return n
		}
	}
	return len(rs)
}

// fastDoorOf returns the fast script's view of a fastable request's door.
func fastDoorOf(r *doorRequest) *rdb.FastDoor {
	j := r.jobs[0]
	return r.pools[j.i].door.redis.Fast(r.reqs[j.i].JobType)
}

// admitFast runs the fast script for rs (a fastRun): it admits them in
// order while each fits under the bound and passes its rates, and returns
// how many it admitted, from the first, with their results set. The rest
// are untouched, for the general script.
func (c *Client) admitFast(ctx context.Context, rs []*doorRequest) (int, error) {
	j0 := rs[0].jobs[0]
	p := rs[0].pools[j0.i]
	now := time.Now()
	call := p.door.redis.Fast(rs[0].reqs[j0.i].JobType).Call(len(rs), now)
	ids := make([]string, len(rs))
	for n, r := range rs {
		j := r.jobs[0]
		req, q := r.reqs[j.i], r.results[j.i].Queue
		id := req.Options.ID
		if id == "" {
			id = uuid.NewString()
		}
		ids[n] = id
		call.Add(p.rank(q)-1, id, appendTaskMessage(nil, p, q, id, req, now, r.trace.of(j.i)))
	}
	reply, err := c.jobs.AdmitFast(ctx, &call)
	if err != nil {
		return 0, err
	}
	for n := range reply.Admitted() {
		res := &rs[n].results[rs[n].jobs[0].i]
		if !reply.Written(n) {
			// Its ID was taken meanwhile by something that does not take
			// the lock (asynq's own tools, say).
			res.Outcome = Duplicate
			continue
		}
		res.ID, res.Outcome = ids[n], Enqueued
	}
	return reply.Admitted(), nil
}
