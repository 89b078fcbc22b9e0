package queues

import (
	"context"
	"slices"
	"time"
)

// Handing a slot on within a process: a job that ends gives its slot to a
// job of the same process waiting for one (handLocked, handTo) or to
// the next one it takes (takeHeldRelease), and a release the pool does not
// need at once waits to go with another call (releaseLater).

// release frees a slot, or hands it to a job waiting in this process
// (handLocked). The read lock covers only taking the slot out of the
// held set (and, on a hand-off, putting the next job's in): a renewal
// (which takes its view of the set and runs its script under the write
// lock) then either ran before, or never sees the slot. The release to
// Redis (free) runs outside the lock, since after a failed call its
// recovery takes the write lock itself.
func (g *gate) release(ctx context.Context, member string) {
	if ok, next := g.unhand(member); ok {
		if next != nil {
			g.deliver(next)
		}
		g.flush(false)
		return
	}
	g.awaitHandOff(member)
	g.renewMu.RLock()
	g.mu.Lock()
	delete(g.held, member)
	ran := g.ranLocked(member)
	next, op := g.handLocked(member, g.mayHandOnLocked(g.conf.Load().memberRank(member)), ran)
	g.mu.Unlock()
	g.renewMu.RUnlock()
	if next != nil {
		g.handTo(next, op)
		return
	}
	g.free(context.WithoutCancel(ctx), member, true, ran)
}

// abandon lets go of the slot of a job another process took over while
// this one did not answer (ErrFenced): the keeper stops renewing it, and
// Redis frees it only where this process still holds it (the job's new
// run elsewhere may hold a lease under the same member). Unlike release,
// it hands nothing to a job of this process, neither to a waiter nor, by
// holding the release back, to the next job that asks (takeHeldRelease):
// the slot may not be ours to hand, and a job it went to would run with
// a lease written beside the other process's, one more than the size.
func (g *gate) abandon(ctx context.Context, member string) {
	g.awaitHandOff(member)
	g.renewMu.RLock()
	g.mu.Lock()
	delete(g.held, member)
	delete(g.asked, member)
	g.mu.Unlock()
	g.renewMu.RUnlock()
	g.free(context.WithoutCancel(ctx), member, false, false)
}

// tick drops what dead processes left behind and settles the pause flags
// (the keeper's tick).
func (g *gate) tick(ctx context.Context) {
	if g.recover(ctx) != nil {
		return
	}
	if _, err := g.release1(ctx, ""); err != nil {
		g.failed(ctx)
		return
	}
	g.ok()
}

// free frees member's slot (and settles the pause flags), holding the
// release back for the next call of this process when mayHold and the
// pool has room (releaseLater), so that the process's next job may take
// it over. ran says that member held its slot here and waits nowhere in
// line (rdb.Free.Ran): a job that ran, or a stand-in granted a slot; not
// a run another process took over (abandon), whose member may.
func (g *gate) free(ctx context.Context, member string, mayHold, ran bool) {
	if g.recover(ctx) != nil {
		return
	}
	if mayHold && g.releaseLater(member) {
		return
	}
	if err := g.submit(&gateOp{release: member, ran: ran}).err; err != nil {
		g.failed(ctx)
		return
	}
	g.ok()
}

// handOffView is what the last step reply said that a hand-off in this
// process needs: whether the pool was exactly full, and the best live
// waiter of another process then, if any (handLocked); whether it had
// room and nobody waited (takeHeldRelease).
type handOffView struct {
	ok        bool          // exactly full, a pool without steering or a start rate, no recovery grace
	room      bool          // room, nobody waiting, no steering or start rate, no recovery grace
	otherRank int           // the best other process's waiter's rank (0: none)
	otherAge  time.Duration // how long it had waited at the reply
	at        time.Time     // when the reply came
	call      uint64        // the call it answered
}

// gateHandOffSlack is how much longer than a job waiting in this process
// another process's job of the same tier may have waited, for a slot
// freed here to go to this process's job without a call to Redis
// (handLocked). It bounds how far start order may stray from first
// come, first served across processes within a tier, and it lets each
// process keep handing its own slots on while the processes' waits are
// about even: a process whose jobs wait longer gets the next slots freed
// elsewhere, through Redis, until they are.
const gateHandOffSlack = 5 * time.Millisecond

// mayHandOnLocked is the job of this process that may take a slot freed
// here with no call to Redis first (g.mu held), from a job of rank (its
// place among waiters, gateConf.rank): the pool was exactly full at the
// last reply, so a freed slot goes to a waiter anyway, and this process's
// best waiter is the one the gate would choose, give or take
// gateHandOffSlack: no other process's waiter was of a higher tier, nor
// of the same tier and waiting longer by more than the slack. None (nil)
// for a pool with steering or a start rate (their rules see every slot
// freed), while a recovery is due, or once the client stops.
//
// Nor does a slot go on here to a job of a lower tier than the one that
// held it: the reply sees only the jobs waiting in Redis's line, and a
// higher tier's job of another process may have been taken from its
// queue and wait behind its stand-in (between two of the stand-in's
// questions, it holds no place in the line) or be on its way to ask. Only
// Redis sees those (the step script's check of jobs dequeued and not
// asked), so such a slot is freed there and goes to the job Redis picks.
// A tier's last job ending is the only time this costs a call.
func (g *gate) mayHandOnLocked(rank int) *localWaiter {
	v := g.handOff
	if !v.ok || g.recovering || len(g.waiters) == 0 || !g.conf.Load().holdRelease || g.isStopping() {
		return nil
	}
	best := g.bestWaiterLocked()
	if best == nil || best.rank > rank {
		return nil
	}
	if v.otherRank > 0 {
		if best.rank > v.otherRank {
			return nil
		}
		if best.rank == v.otherRank && v.otherAge+time.Since(v.at)-time.Since(best.since) > g.handOffSlack {
			return nil
		}
	}
	return best
}

// handTo hands the slot of a job of this process that ended to next, a
// job waiting here (handLocked): next starts now, and op tells Redis
// that the slot is next's (the step script frees the ended job's lease and
// writes next's in the same call, so the count never moves), at once or,
// quiet, with a later call (within gateHoldHandOn).
func (g *gate) handTo(next *localWaiter, op *gateOp) {
	g.bmu.Lock()
	g.queue = append(g.queue, op)
	if op.quiet {
		g.armLocked(&g.quietDue, gateHoldHandOn, g.quietDueNow)
	}
	g.bmu.Unlock()
	g.deliver(next)
	g.flush(false)
}

// deliver tells next, a job of this process waiting for a slot, that it
// was handed one (handLocked). A question next had queued and not sent
// yet is answered here instead.
func (g *gate) deliver(next *localWaiter) {
	g.bmu.Lock()
	var ask *gateOp
	for i, op := range g.queue {
		if op.ask == next.member {
			ask = op
			g.queue = slices.Delete(g.queue, i, i+1)
			break
		}
	}
	g.bmu.Unlock()
	if ask != nil {
		ask.done <- gateReply{taken: true}
	} else {
		next.tell()
	}
}

// quietDueNow runs when the quiet hand-ons' timer fires: each queued now
// goes with the next call, which this flush makes (heldReleasesDue).
func (g *gate) quietDueNow() {
	g.opsDue(&g.quietDue, func(op *gateOp) bool { return op.quiet })
}

// opsDue clears armed, the flag of a timer that fired, marks the queued
// ops of that timer (of) due, and flushes.
func (g *gate) opsDue(armed *bool, of func(*gateOp) bool) {
	g.bmu.Lock()
	*armed = false
	for _, op := range g.queue {
		if of(op) {
			op.due = true
		}
	}
	g.bmu.Unlock()
	g.flush(false)
}

// armLocked makes sure a timer will run due within after (bmu held):
// armed is its flag, which due clears (opsDue).
func (g *gate) armLocked(armed *bool, after time.Duration, due func()) {
	if !*armed {
		*armed = true
		time.AfterFunc(after, due)
	}
}

// releaseLater queues the release of member's slot without waiting for
// it, when the pool had room at the last reply: it goes with the next call
// this process makes, or on its own gateHoldRelease later. It returns
// false, and queues nothing, when the pool was full (waiting jobs need the
// slot now) or has steering or a start rate.
func (g *gate) releaseLater(member string) bool {
	if !g.conf.Load().holdRelease {
		return false
	}
	g.bmu.Lock()
	defer g.bmu.Unlock()
	if g.full {
		return false
	}
	g.queue = append(g.queue, &gateOp{release: member, ran: true, lazy: true, rank: g.conf.Load().memberRank(member), since: time.Now(), done: make(chan gateReply, 1)})
	g.armLocked(&g.lazyDue, gateHoldRelease, g.heldReleasesDue)
	return true
}

// heldReleasesDue runs when the timer of the held releases fires: every
// release held back until now is due (sendable), so this flush sends them,
// or, while gateMaxInFlight calls are in flight, the first of them to end
// does, even if a release held after this arms the next timer meanwhile.
func (g *gate) heldReleasesDue() {
	g.opsDue(&g.lazyDue, func(op *gateOp) bool { return op.lazy })
}

// takeHeldRelease gives member the slot of a job of this process that
// ended while the pool had room, when that job's release is still held
// back (releaseLater), nobody waited for a slot anywhere at the last
// reply, no older than gateTakeOverReplyAge, member is of the tier of the
// job that held the slot last or a higher one, and no job of a higher tier than
// member's (rank: gateConf.rank) waits for one in this process now: the
// held release becomes a hand-off to
// member (it still goes with the process's next call, or on its own
// gateHoldRelease after it was made), and member starts with no call to
// Redis. Short jobs that never fill the pool thus make one call
// to the gate for several jobs. The count never moves, so the cap holds
// whatever happened since the reply; a job that began waiting elsewhere
// since then may see the slots held in this process go by, for as long
// as that reply still counts.
func (g *gate) takeHeldRelease(member string, rank int) bool {
	c := g.conf.Load()
	if !c.holdRelease {
		return false
	}
	g.bmu.Lock()
	defer g.bmu.Unlock()
	// Only a slot last held by a job of member's tier or a lower one
	// (mayHandOnLocked): freed, a slot of a higher tier's job might go to a
	// job of that tier that another process took from its queue and that
	// has not asked yet, which only Redis sees. After a chain of take-overs
	// the slot's last holder is the job that ended last (unhand), not the
	// one whose release it is.
	var held *gateOp
	for _, op := range g.queue {
		if op.lazy && op.to == "" && op.rank >= rank {
			held = op
			break
		}
	}
	if held == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.handOff.room || time.Since(g.handOff.at) > gateTakeOverReplyAge || g.recovering || g.isStopping() {
		return false
	}
	// Nor ahead of a higher tier's job of this process that waits for a
	// slot: the last reply may predate its question (in flight, or
	// queued), which the held slot, freed, would have gone to. A job of
	// the same tier that asked before may find another of the free slots.
	for _, w := range g.waiters {
		if w.rank < rank {
			return false
		}
	}
	held.to, held.toNew = member, true
	g.held[member] = true
	g.handing[member] = held
	return true
}

// unhand takes member's slot back out of the hand-off that gave it to
// member, when that op is still queued (Redis has not heard of it) and
// member never asked Redis for a slot itself (takeHeldRelease, or a job
// that waited behind a stand-in; a waiter that asked may hold a lease or
// a place that its release must free). The op then hands the slot on to
// the next job of this process that may take it (mayHandOnLocked), which
// unhand returns for the caller to tell (deliver); or, with none, goes
// back to being the release of the job that ended before member (held
// back or not, as it was). Either way Redis never sees member's lease: a
// chain of short jobs handing one slot on is one op. It says whether it
// took the slot back; otherwise member's release goes its usual way.
func (g *gate) unhand(member string) (bool, *localWaiter) {
	g.renewMu.RLock()
	defer g.renewMu.RUnlock()
	g.bmu.Lock()
	defer g.bmu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	op := g.handing[member]
	if op == nil || !op.toNew || !slices.Contains(g.queue, op) {
		return false, nil
	}
	delete(g.handing, member)
	delete(g.held, member)
	delete(g.asked, member) // it never asked (toNew)
	if next := g.mayHandOnLocked(g.conf.Load().memberRank(member)); next != nil {
		g.handToLocked(op, next)
		if op.quiet {
			g.armLocked(&g.quietDue, gateHoldHandOn, g.quietDueNow)
		}
		return true, next
	}
	op.to, op.toNew, op.quiet = "", false, false
	op.rank = g.conf.Load().memberRank(member)
	return true, nil
}

// awaitHandOff waits, when member's slot was handed to it in this process
// (handTo) and Redis has not heard of that yet, until it has: the
// release of member must reach Redis after the op that writes its lease,
// or that op would write it again after the release (a slot held by no
// job until its lease expired). Two calls of one process may be in flight
// at once, so order among them is not otherwise kept.
func (g *gate) awaitHandOff(member string) {
	g.mu.Lock()
	op := g.handing[member]
	g.mu.Unlock()
	if op == nil {
		return
	}
	g.flush(true)
	r := <-op.done
	op.done <- r // for any other reader
}

// handedOn forgets the hand-offs of batch (handTo) once Redis has heard of
// them, or failed to: the jobs they went to may free their slots now
// (awaitHandOff).
func (g *gate) handedOn(batch []*gateOp) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, op := range batch {
		if op.to != "" && g.handing[op.to] == op {
			delete(g.handing, op.to)
		}
	}
}
