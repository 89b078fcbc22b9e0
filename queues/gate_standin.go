package queues

import (
	"context"
	"strconv"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// Stand-ins: in a full pool, the jobs of one process that wait for a slot
// of one queue wait in the process, behind one stand-in that waits in
// Redis's line for them all.
//
// In a full pool most slots freed in a process go to a job waiting in the
// same process (handLocked; docs/BENCHMARKS.md, section 12,
// "Stand-ins"). When each of those jobs also asked Redis for a slot,
// every job entered the line and left it again, and every hand-off had to
// tell Redis at once that the job leaving the line now held the slot.
// Behind a stand-in a job never enters the line: a hand-off to it only
// renames the slot's lease, which Redis may hear up to gateHoldHandOn
// later, with other calls (gateOp.quiet); and a chain of short jobs
// handing one slot on is one rename. The stand-in keeps the process's
// place in the line, in its queue's tier: a slot freed in another process
// goes to it as it would to a job, and the process hands it to its best
// waiting job at once (handStandIn).
//
// A stand-in's member is a job member whose ID no job has ("~", the
// process and a sequence number), so Redis treats it as any job's: the
// cap, the tiers' order in the line, a dead process's entry expiring. Its
// lease lives only until the process renames it to the job it handed the
// slot to. A job waits behind a stand-in only while the last reply said
// the pool was full and the process may hand slots on (handOff.ok), and
// only if it never asked Redis itself; otherwise it asks as before.

// standIn is the stand-in of one queue's waiting jobs in this process.
type standIn struct {
	queue   string
	waiting int // jobs waiting behind it
	cancel  context.CancelFunc
}

// gateStandInPatience is how long a job waits behind a stand-in before it
// asks Redis itself (with its wait so far, so it keeps its seniority). A
// job whose own old lease lapsed (its process stopped before freeing it,
// and asynq gave it to this one) holds its slot until the job asks: Redis
// keeps a lapsed lease while asynq still leases the job, unless the job
// waits in line.
const gateStandInPatience = time.Second

// waitBehindStandIn says whether me, a job of this process that waits
// for a slot, waits behind its queue's stand-in now (starting one if none
// runs), or was handed a slot already; when neither, me asks Redis itself
// from now on (asked). patient: me has waited less than
// gateStandInPatience.
func (g *gate) waitBehindStandIn(me *localWaiter, patient bool) (behind, handed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.waiters[me.member]; !ok {
		return false, true
	}
	if !me.standIn && !me.asked && patient && g.standInsLocked() {
		if me.behind != nil && me.behind != g.standIns[me.queue] {
			g.leaveStandInLocked(me) // its stand-in stopped (a call failed): it waits behind the next one
		}
		if me.behind == nil {
			s := g.standIns[me.queue]
			if s == nil {
				ctx, cancel := context.WithCancel(context.Background())
				s = &standIn{queue: me.queue, cancel: cancel}
				g.standIns[me.queue] = s
				go g.runStandIn(ctx, s)
			}
			s.waiting++
			me.behind = s
		}
		return true, false
	}
	g.leaveStandInLocked(me)
	me.asked = true
	return false, false
}

// standInsLocked says whether a job that waits for a slot may wait behind
// a stand-in (g.mu held): the last reply said the pool was full, hand-offs
// in this process are allowed, and no recovery is due.
func (g *gate) standInsLocked() bool {
	return g.handOff.ok && !g.recovering && g.conf.Load().holdRelease && !g.isStopping()
}

// leaveStandInLocked takes w from behind its stand-in (g.mu held); the
// stand-in of no job stops, withdrawing from the line.
func (g *gate) leaveStandInLocked(w *localWaiter) {
	s := w.behind
	if s == nil {
		return
	}
	w.behind = nil
	s.waiting--
	if s.waiting == 0 {
		s.cancel()
		if g.standIns[s.queue] == s {
			delete(g.standIns, s.queue)
		}
	}
}

// runStandIn asks for slots of s's queue under a new member each time,
// and hands each one it gets to the best job waiting in this process,
// until no job waits behind it (ctx) or a call to Redis fails (the jobs
// behind it then ask themselves, as the recovery requires).
func (g *gate) runStandIn(ctx context.Context, s *standIn) {
	defer func() {
		g.mu.Lock()
		if g.standIns[s.queue] == s {
			delete(g.standIns, s.queue)
		}
		g.mu.Unlock()
		s.cancel()
	}()
	for ctx.Err() == nil {
		g.mu.Lock()
		g.standInSeq++
		id := "~" + g.processID + "." + strconv.FormatUint(g.standInSeq, 10)
		g.mu.Unlock()
		slot, err := g.acquireMember(ctx, rdb.Member{ID: id, Queue: s.queue}.String(), s.queue, 0, true)
		if err != nil {
			return
		}
		g.handStandIn(ctx, slot, s.queue)
	}
}

// handStandIn hands slot, just granted to the stand-in of queue in this
// process, to the best job waiting here of that queue's tier or a higher
// one, whatever the last reply said of the others: Redis gave the slot to
// this process's place in the line, in that tier. With none left waiting
// (they got slots here or gave up meanwhile), the slot is freed, and
// Redis hands it to the best waiter anywhere: a lower tier's job here is
// not the one it would pick.
func (g *gate) handStandIn(ctx context.Context, slot, queue string) {
	rank := g.conf.Load().rank(queue)
	g.renewMu.RLock()
	g.mu.Lock()
	delete(g.held, slot)
	next := g.bestWaiterLocked()
	if next != nil && next.rank > rank {
		next = nil
	}
	next, op := g.handLocked(slot, next, true)
	g.mu.Unlock()
	g.renewMu.RUnlock()
	if next != nil {
		g.handTo(next, op)
		return
	}
	g.free(context.WithoutCancel(ctx), slot, false, true)
}

// bestWaiterLocked is the job of this process that waits for a slot and
// would get the next one here: the highest tier, then the longest
// waiting (g.mu held). Stand-ins are no jobs. Nil when none waits.
func (g *gate) bestWaiterLocked() *localWaiter {
	var best *localWaiter
	for _, w := range g.waiters {
		if w.standIn {
			continue
		}
		if best == nil || w.rank < best.rank || (w.rank == best.rank && w.since.Before(best.since)) {
			best = w
		}
	}
	return best
}

// handLocked hands the slot of member (a job of this process that ended,
// or a stand-in) to next (g.mu held; nil: nobody), taking next out of
// the waiters: the op tells Redis, which the caller queues (handTo). ran
// says that member waits nowhere in line (rdb.Free.Ran). A job that never
// asked Redis holds no place there to take out: the op only renames the
// slot's lease, so Redis may hear it with a later call (quiet), and
// next's own release may still take it back (unhand).
func (g *gate) handLocked(member string, next *localWaiter, ran bool) (*localWaiter, *gateOp) {
	if next == nil {
		return nil, nil
	}
	op := &gateOp{release: member, ran: ran, since: time.Now(), done: make(chan gateReply, 1)}
	g.handToLocked(op, next)
	return next, op
}

// handToLocked makes op hand its slot to next (g.mu held): next leaves the
// waiters as the holder of that slot, and op is quiet when next never
// asked Redis (handLocked, unhand).
func (g *gate) handToLocked(op *gateOp, next *localWaiter) {
	g.takeWaiterLocked(next)
	op.to, op.toNew, op.quiet = next.member, !next.asked, !next.asked
	g.handing[next.member] = op
}

// takeWaiterLocked takes next out of this process's waiters as the holder
// of a slot handed to it here (g.mu held).
func (g *gate) takeWaiterLocked(next *localWaiter) {
	g.leaveStandInLocked(next)
	delete(g.waiters, next.member)
	g.held[next.member] = true
	if next.asked {
		g.asked[next.member] = true
	}
}

// ranLocked says whether member, a slot of this process being freed or
// handed on, waits nowhere in line (rdb.Free.Ran): it never asked Redis
// itself (g.mu held). It forgets member.
func (g *gate) ranLocked(member string) bool {
	asked := g.asked[member]
	delete(g.asked, member)
	return !asked
}
