package queues

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// Batching calls to Redis: the releases, hand-ons and questions of one
// process's jobs go to Redis together, in one call of the step script
// (submit, flush, runStep).

// Sharing calls to Redis among the jobs of one process.
const (
	// gateMaxInFlight is how many calls to the step script one process
	// makes at once per pool; what jobs ask meanwhile goes together in the
	// next.
	gateMaxInFlight = 2
	// gateHoldAsk is how long a job taken from its queue while the pool
	// is full (as the last reply said) and this process runs jobs of the
	// pool may wait before it asks for a slot, so that its question goes
	// in the same call as the release of a job that ends here: one call
	// instead of two.
	gateHoldAsk = 2 * time.Millisecond
	// gateHoldRelease is how long the release of a job that ended while
	// the pool had room (at the last reply) may wait for another call of
	// this process to carry it, typically the question of the job this
	// process takes next: one call instead of two, and none at all when
	// that job takes the held slot over (takeHeldRelease). Nobody waits
	// for such a slot (the pool had free ones), and holding a slot a
	// moment longer never lets more jobs run than the size. 5 ms is the
	// slack a hand-off in a full pool keeps to (gateHandOffSlack); with
	// 1 ms the next job's dequeue, on a loaded machine, often came too
	// late to take the slot over (docs/BENCHMARKS.md, section 12, "Held
	// releases").
	gateHoldRelease = 5 * time.Millisecond
	// gateTakeOverReplyAge is how old the reply a take-over goes by may
	// be (takeHeldRelease): a process taking held slots over makes a call
	// at least every gateHoldRelease (the held release goes then), so a
	// chain of take-overs keeps within it, and the first take-over after a
	// quiet spell asks Redis instead.
	gateTakeOverReplyAge = 2 * gateHoldRelease
	// gateHoldHandOn is how long a quiet hand-on (handLocked: a slot handed
	// in this process to a job that never asked Redis) may wait for
	// another call of this process to carry it. It moves no count, so
	// holding it never lets more jobs run than the size; meanwhile Redis
	// holds the slot under the job that ended, and a job ending before
	// the op goes hands the slot on within the same op (unhand), so a
	// chain of short jobs is one op. With 5 ms a 2 ms job in a full pool
	// cost about 21 commands, with 20 ms about 19 (docs/BENCHMARKS.md,
	// section 12, "Stand-ins").
	gateHoldHandOn = 20 * time.Millisecond
)

// gateOp is one thing a job asks of the gate: to free a slot, or to take
// one (ask).
type gateOp struct {
	release string        // a member whose slot (or place among the waiters) to free
	ran     bool          // release held its slot and waits nowhere in line (rdb.Free.Ran)
	to      string        // a member of this process the slot is handed to (handTo, takeHeldRelease)
	toNew   bool          // to never asked Redis for a slot (takeHeldRelease, a stand-in's job): this op is all Redis will know of it
	lazy    bool          // a release nobody waits for (releaseLater)
	rank    int           // a held release: the rank (gateConf.rank) of the job whose slot it holds now (takeHeldRelease)
	quiet   bool          // a hand-on to a job that never asked (handLocked): Redis may hear it with a later call
	due     bool          // a held release or quiet hand-on whose timer fired (heldReleasesDue, quietDueNow): it goes with the next call
	ask     string        // a member asking for a slot
	queue   string        // the asking job's queue
	ready   int64         // when the asking job was first ready to run, ms (0: unknown)
	waited  time.Duration // how long the asking job waited in this process already (0 for a stand-in)
	since   time.Time
	done    chan gateReply
}

// gateReply is what the step script said to one op.
type gateReply struct {
	taken bool // the asking job took a slot
	// handedBack: the asking job went back to its queue, its worker given
	// to a job taken back (rdb.AskReply.HandedBack).
	handedBack bool
	wait       time.Duration // when the start rate allows its start (0: now or no rate)
	err        error
}

// submit queues op and returns its reply. The ops of one process go to
// Redis together, gateMaxInFlight calls at a time (flush): a job's op
// either starts a call or joins the next. An ask that could only wait (the
// pool was full at the last reply and a job of this process will end
// soon) is held up to gateHoldAsk for a release to carry it.
func (g *gate) submit(op *gateOp) gateReply {
	op.done = make(chan gateReply, 1)
	op.since = time.Now()
	g.bmu.Lock()
	g.queue = append(g.queue, op)
	g.bmu.Unlock()
	g.flush(false)
	if op.ask == "" {
		return <-op.done
	}
	t := time.NewTimer(gateHoldAsk)
	defer t.Stop()
	select {
	case r := <-op.done:
		return r
	case <-t.C:
		g.flush(true)
		return <-op.done
	}
}

// flush sends the queued ops while fewer than gateMaxInFlight calls are
// in flight: at once when one frees a slot, when the pool had room at the
// last reply, when this process holds no slot (no release will come), or
// when an ask was held long enough (force, or its age).
func (g *gate) flush(force bool) {
	for {
		g.bmu.Lock()
		if len(g.queue) == 0 || g.inFlight >= gateMaxInFlight || !(force || g.sendable()) {
			g.bmu.Unlock()
			return
		}
		batch := g.queue
		g.queue = nil
		g.inFlight++
		g.calls++
		call := g.calls
		g.mu.Lock()
		failures := g.failures
		g.mu.Unlock()
		g.bmu.Unlock()
		g.runStep(batch, call, failures)
		g.bmu.Lock()
		g.inFlight--
		g.bmu.Unlock()
		force = false
	}
}

// sendable says whether the queued ops should go now (bmu held). A
// release goes at once, unless it was held back (releaseLater), the pool
// still has room and the timer that sends it is still due. A question goes
// at once while the pool has room (at the last reply) or this process
// holds no slot (no release of its own will come to carry it), else once
// it has waited gateHoldAsk.
func (g *gate) sendable() bool {
	holding := -1
	for _, op := range g.queue {
		if op.ask == "" {
			// A held release goes once its timer fired (due), or no timer
			// is due to send it, so none is left behind by a timer that
			// found the calls in flight, whatever timer is armed after. A
			// quiet hand-on the same, full pool or not: it frees nothing.
			if op.quiet {
				if op.due || !g.quietDue || time.Since(op.since) >= gateHoldHandOn {
					return true
				}
				continue
			}
			if !op.lazy || g.full || op.due || !g.lazyDue || time.Since(op.since) >= gateHoldRelease {
				return true
			}
			continue
		}
		if !g.full || time.Since(op.since) >= gateHoldAsk {
			return true
		}
		if holding < 0 {
			g.mu.Lock()
			holding = len(g.held)
			g.mu.Unlock()
		}
		if holding == 0 {
			return true
		}
	}
	return false
}

// sendOps sends every queued op and waits until none is in flight, up to
// a second: at a stop, so that no release held back (releaseLater) is
// left behind to hold its slot until its lease expires.
func (g *gate) sendOps() {
	deadline := time.Now().Add(time.Second)
	for {
		g.flush(true)
		g.bmu.Lock()
		idle := len(g.queue) == 0 && g.inFlight == 0
		g.bmu.Unlock()
		if idle || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// runStep runs the step script for batch, the process's call-th call, made
// after failures calls to Redis had failed, and hands each op its reply.
// What the reply says of the pool (full, the hand-off view) replaces only
// what an older call's reply said: with two calls in flight, replies may
// come back out of order. The hand-off view is not taken from a call made
// before a failure: the pool's state then says nothing of what a recovery
// finds.
func (g *gate) runStep(batch []*gateOp, call, failures uint64) {
	c := g.conf.Load()
	var asks []*gateOp
	var step rdb.StepArgs
	g.mu.Lock() // a recovery clears toNew under it (renewHeld)
	for _, op := range batch {
		if op.ask != "" {
			asks = append(asks, op)
		} else {
			step.Frees = append(step.Frees, rdb.Free{Member: op.release, To: op.to, Ran: op.ran, ToNew: op.toNew})
		}
	}
	g.mu.Unlock()
	// Jobs that ask together ask in their tier's order, then in the order
	// they were enqueued (when known), which is the order asynq took them
	// in, whatever order their goroutines reached the gate.
	slices.SortStableFunc(asks, func(a, b *gateOp) int {
		if ra, rb := c.pool.rank(a.queue), c.pool.rank(b.queue); ra != rb {
			return ra - rb
		}
		if a.ready == 0 || b.ready == 0 {
			return 0
		}
		return cmp.Compare(a.ready, b.ready)
	})
	if len(asks) > 0 {
		step.Asks = make([]rdb.Ask, len(asks))
		for i, op := range asks {
			step.Asks[i] = rdb.Ask{Member: op.ask, Rank: c.pool.rank(op.queue), ReadyAt: op.ready, Waited: op.waited}
		}
	}
	res, err := c.slots.Step(context.Background(), step)
	if err != nil {
		g.mu.Lock()
		g.handOff.ok, g.handOff.room = false, false
		g.mu.Unlock()
		unheard := false
		for _, op := range batch {
			op.done <- gateReply{err: err}
			unheard = unheard || op.lazy || op.to != ""
		}
		g.handedOn(batch)
		if unheard {
			// Nobody waits for these releases and hand-offs: note the
			// failure here, so that the next call re-adds what this
			// process still holds (recover), the jobs slots were handed
			// to among them; the slots freed stay taken until their
			// leases expire, as after any failed release.
			g.failed(context.Background())
		}
		return
	}
	count, size := res.Count, res.Size // an operator's resize wins over c.size
	g.bmu.Lock()
	if call > g.fullAt {
		g.full, g.fullAt = count >= size, call
	}
	g.bmu.Unlock()
	g.mu.Lock()
	if call > g.handOff.call && failures == g.failures {
		g.handOff = handOffView{
			ok: count == size && res.OtherRank >= 0 && !g.recovering, otherRank: res.OtherRank,
			room:     count < size && res.OtherRank == 0 && !g.recovering,
			otherAge: res.OtherAge, at: time.Now(), call: call,
		}
	}
	g.mu.Unlock()
	for i, op := range asks {
		op.done <- gateReply{taken: res.Asks[i].Taken, handedBack: res.Asks[i].HandedBack, wait: res.Asks[i].Wait}
	}
	for _, m := range res.Granted {
		g.grant(m)
	}
	g.handedOn(batch)
	for _, op := range batch {
		if op.ask == "" {
			op.done <- gateReply{}
		}
	}
}
