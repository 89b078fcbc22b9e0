package queues

import (
	"context"
	"fmt"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// Asking for a slot: a job's question to the gate (acquire), and the line
// of this process's jobs waiting for one, told when a release hands them
// a slot here or in another process (grant, relay).

// acquire takes a cluster-wide slot for the job, waiting (as a waiter, see
// gate) until it may, or until shortly before the job's deadline. It
// returns the lease member to release.
func (g *gate) acquire(ctx context.Context, jobID, queue string) (string, error) {
	return g.acquireReady(ctx, jobID, queue, time.Time{})
}

// acquireReady is acquire for a job first ready to run at ready (the zero
// time: unknown), which the starvation guard counts its wait from.
func (g *gate) acquireReady(ctx context.Context, jobID, queue string, ready time.Time) (string, error) {
	readyMs := int64(0)
	if !ready.IsZero() {
		readyMs = ready.UnixMilli()
	}
	return g.acquireMember(ctx, rdb.Member{ID: jobID, Queue: queue}.String(), queue, readyMs, false)
}

// acquireMember takes a slot under member, a job of queue or, with
// standIn, a stand-in of this process's jobs waiting for one of queue's
// slots (gate_standin.go): the stand-in never waits behind another, and
// neither takes a held slot over nor counts in the gate's waits.
func (g *gate) acquireMember(ctx context.Context, member, queue string, readyMs int64, standIn bool) (string, error) {
	giveUp := time.Time{}
	if deadline, ok := ctx.Deadline(); ok {
		giveUp = deadline.Add(-gateGiveUpMargin(time.Until(deadline)))
	}
	// The job's place among this process's waiters: its tier's rank with
	// strict tiers, else 1 (the gate orders waiters so).
	rank := g.conf.Load().rank(queue)
	var waitedSince time.Time
	var me *localWaiter // set once the job is registered as waiting here
	defer func() {
		if me != nil {
			g.mu.Lock()
			delete(g.waiters, member)
			g.leaveStandInLocked(me)
			g.mu.Unlock()
		}
	}()
	took := func() (string, error) {
		// A slot Redis gave took the member out of the line; one handed on
		// here was noted by takeWaiterLocked, asked or not.
		if standIn {
			g.mu.Lock()
			g.held[member] = true
			g.mu.Unlock()
		} else {
			g.took(member, waitedSince)
		}
		return member, nil
	}
	for {
		wake := g.wakeCh() // taken before asking, so a wake-up in between is not missed
		if err := g.recover(ctx); err != nil {
			if me != nil && g.claimed(member) {
				// A job of this process handed it its slot meanwhile.
				return took()
			}
			return "", fmt.Errorf("pool %q: %w: %w", g.name, errGateRedis, err)
		}
		if me == nil && !standIn && g.takeHeldRelease(member, rank) {
			g.took(member, time.Time{})
			return member, nil
		}
		if me == nil {
			// Registered before asking: a release may hand this job a slot
			// the moment the script below makes it a waiter, or, in this
			// process, before its question is even sent (handLocked).
			me = &localWaiter{member: member, queue: queue, ch: make(chan struct{}, 1), rank: rank, since: time.Now(), standIn: standIn}
			g.mu.Lock()
			g.waiters[member] = me
			g.mu.Unlock()
		}
		wait := gateRetryEvery
		behind, handed := g.waitBehindStandIn(me, time.Since(me.since) < gateStandInPatience)
		switch {
		case handed:
			return took()
		case behind:
			// It waits in this process, behind the stand-in that asks for
			// its queue: a job of this process that ends, or a slot
			// granted to the stand-in, is handed to it here.
			if waitedSince.IsZero() {
				waitedSince = g.now()
			}
		default:
			// A job's first question takes its place in line as of when it
			// began to wait here (gateStandInPatience). A stand-in's place is
			// its own question's: given its jobs' waits, it drew slots from
			// the other processes' own jobs whenever the waits differed by
			// the slack, and a full pool of 2 ms jobs cost 22 commands per
			// job instead of 19 (docs/BENCHMARKS.md, section 12,
			// "Stand-ins").
			waited := time.Since(me.since)
			if standIn {
				waited = 0
			}
			res := g.submit(&gateOp{ask: member, queue: queue, ready: readyMs, waited: waited})
			if res.err != nil {
				g.failed(ctx)
				if g.claimed(member) {
					// A job of this process handed it its slot meanwhile.
					return took()
				}
				return "", fmt.Errorf("pool %q: %w: %w", g.name, errGateRedis, res.err)
			}
			g.ok()
			if res.taken {
				return took()
			}
			if res.handedBack {
				// The job is back in its queue, its worker given to a job taken
				// back from a process that stopped answering. A slot a job of
				// this process handed it meanwhile (handLocked) is not its
				// to run: released as a job's slot is (after the op that
				// handed it, and handed on).
				if g.claimed(member) {
					g.release(ctx, member)
				}
				return "", fmt.Errorf("pool %q: %w", g.name, errHandedBack)
			}
			if waitedSince.IsZero() {
				waitedSince = g.now()
			}
			if res.wait > 0 {
				// The start rate allows this start then: ask again exactly
				// then, so starts keep to the rate.
				wait = res.wait
			}
		}
		if !giveUp.IsZero() {
			wait = min(wait, time.Until(giveUp))
		}
		t := time.NewTimer(max(wait, 0))
		var why string
		select {
		case <-me.ch:
			// A release handed this job a slot: its lease is written (or,
			// handed on in this process, on its way), held by this
			// process.
			t.Stop()
			return took()
		case <-ctx.Done():
			why = ctx.Err().Error()
		case <-g.stopping:
			why = "the client is stopping"
		case <-wake:
		case <-t.C:
			if !giveUp.IsZero() && !time.Now().Before(giveUp) {
				why = "the job's deadline is near"
			}
		}
		t.Stop()
		if why != "" {
			// Leave the waiters; a slot a release handed this job in the
			// meantime through Redis is freed (and handed on) in the same
			// call. One handed on by a job of this process (handLocked)
			// is already on its way to Redis as this job's: the job runs.
			// A job that only waited behind a stand-in is nowhere in Redis.
			if g.claimed(member) {
				return took()
			}
			if me.asked {
				if _, err := g.release1(context.WithoutCancel(ctx), member); err != nil {
					g.failed(ctx)
				}
			}
			return "", fmt.Errorf("pool %q: %w: %s", g.name, errGateWait, why)
		}
	}
}

// claimed takes member out of this process's waiters and says whether a
// job of this process had handed it its slot already (handLocked takes
// a waiter it hands a slot to out of the waiters itself): from then on
// that slot is the job's, and only its release frees it.
func (g *gate) claimed(member string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, waiting := g.waiters[member]
	delete(g.waiters, member)
	return !waiting
}

// took notes that member holds a slot now, and how long it waited for it
// (waitedSince is zero when it did not wait).
func (g *gate) took(member string, waitedSince time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held[member] = true
	if !waitedSince.IsZero() {
		g.waits++
		g.waitsTotal += g.now().Sub(waitedSince)
	}
}

// localWaiter is a job of this process waiting for a slot (acquire), or
// a stand-in asking for the jobs that wait behind it (gate_standin.go).
type localWaiter struct {
	member string
	queue  string
	ch     chan struct{} // told when a release hands it a slot
	rank   int           // its tier's rank with strict tiers, else 1: how the gate orders waiters
	since  time.Time     // when it first asked
	// asked: it asked Redis for a slot, so it may hold a place in the
	// waiting line (or a lease granted to it) that only Redis can free.
	// Set under g.mu, before the question goes, and only while it still
	// waits: a job handed a slot before it asked never asks.
	asked bool
	// behind: the stand-in it waits behind (nil: none).
	behind *standIn
	// standIn: this is a stand-in, not a job; no slot is handed to it here.
	standIn bool
}

// tell wakes the waiter with a slot (once: a second grant is the same slot).
func (w *localWaiter) tell() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// grant tells this process's waiter member that a release handed it a
// slot. A member that no longer waits here (it gave up) is ignored: its
// give-up freed the slot, or will.
func (g *gate) grant(member string) {
	g.mu.Lock()
	w := g.waiters[member]
	g.mu.Unlock()
	if w != nil {
		w.tell()
	}
}

// relay handles a message on the freed channel: every local waiter asks
// again, or this process's waiters a release elsewhere handed a slot to
// are told.
func (g *gate) relay(m rdb.Freed) {
	if m.AskAgain {
		g.broadcast()
		return
	}
	for _, member := range m.Granted {
		g.grant(member)
	}
}

// stopWaiting makes every job waiting for a slot give up: the client is
// stopping and will not run them.
func (g *gate) stopWaiting() { g.stopOnce.Do(func() { close(g.stopping) }) }

// isStopping says whether the client is stopping.
func (g *gate) isStopping() bool {
	select {
	case <-g.stopping:
		return true
	default:
		return false
	}
}

func (g *gate) wakeCh() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.wake
}

// broadcast wakes every local waiter.
func (g *gate) broadcast() {
	g.mu.Lock()
	close(g.wake)
	g.wake = make(chan struct{})
	g.mu.Unlock()
}
