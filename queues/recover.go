package queues

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// Fast recovery and fencing (docs/RELIABILITY.md).
//
// asynq renews the lease of every job a process runs, or holds ahead of a
// slot, every 5 s. Every worker process watches the leases of its pools'
// queues (recoverer): a lease whose expiry nobody moved for RecoverAfter,
// measured on the watcher's own monotonic clock, belongs to a process that
// is dead, frozen or cut off from Redis. In a cluster-scoped pool the job's
// slot lease (Redis's clock) must have lapsed too. The job then goes back
// at the head of its tier's queue in one atomic step (rdb's
// lua/recover_job.lua), without using up a retry, and is noted in its
// queue's fenced set. asynq's own recoverer (a minute later at the
// earliest) stays as the last resort: its step and ours both start by
// taking the job off the active list, so a job goes back once.
//
// A process that was only stalled and comes back must not finish such a
// job (fences): it compares, for each job it has had for RecoverAfter or
// longer, when the job was taken (Redis's clock, as an age) with how long
// it has had it (its own clock, as an age), twice a second and before
// anything of the job is recorded. A job taken after this process started
// it is fenced: its context is cancelled with ErrFenced, the runner
// records nothing (no failure count, no breaker outcome, no slot freed
// that another process now holds) and asynq's writes for it (completion,
// retry, result) are refused (rdb.GuardedClient), so the run that took it over
// is the only one that counts.

// DefaultRecoverAfter is how long a running job's lease must go unrenewed
// before the job is taken from its process (Config.RecoverAfter).
const DefaultRecoverAfter = 15 * time.Second

// MinRecoverAfter is the least RecoverAfter may be: asynq renews a lease
// every 5 s, so less would take jobs from live processes.
const MinRecoverAfter = 5 * time.Second

// ErrFenced is the cause of the context of a job that another process took
// over while this one was stalled or cut off from Redis: the job runs
// again there, and nothing of this run may be recorded. CheckFence
// returns it.
var ErrFenced = errors.New("the job was taken over by another worker process while this one did not answer; this run must not record anything")

// recoverEvery is how often a process looks for jobs to recover (a lease
// that moved is seen at most that late: it adds to RecoverAfter), and
// fenceEvery how often it checks that the old jobs it runs are still its.
const (
	recoverEvery = 500 * time.Millisecond
	fenceEvery   = 500 * time.Millisecond
)

// fencedKeep is how long a recovered job stays in its queue's fenced set,
// and a fenced job's writes are refused: longer than asynq's lease (30 s),
// past which asynq itself writes nothing for the job.
const fencedKeep = 10 * time.Minute

// Recovery describes jobs of one pool taken back from a worker process
// that stopped answering, as Config.OnRecover receives it.
type Recovery struct {
	Pool string
	// Process is the process that ran the jobs as far as it is known:
	// asynq's server name (host:pid:id), or the slot holder; "" when
	// neither was left in Redis.
	Process string
	// Jobs are the IDs of the jobs put back.
	Jobs []string
	// Silent is how long their leases had gone unrenewed (at least).
	Silent time.Duration
}

// attempt is one job this process has taken from asynq, from the moment
// the runner sees it until asynq is done with it.
type attempt struct {
	job    rdb.Member
	began  time.Time // monotonic
	cancel context.CancelCauseFunc
	f      *fences
	mu     sync.Mutex
	fenced bool
}

func (a *attempt) isFenced() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fenced
}

type attemptKey struct{}

// fences tracks the jobs this process runs, fences those taken over, and
// refuses asynq's writes for them.
type fences struct {
	rdb   redis.UniversalClient
	ks    rdb.Keyspace
	after time.Duration
	log   *slog.Logger

	mu      sync.RWMutex
	running map[rdb.Member]*attempt
	// refused holds the task keys of fenced jobs whose outcome asynq has
	// yet to write, with when they were fenced: the next write for the
	// key is refused (guard). asynq writes a job's outcome once, right
	// after its handler returns (or at its deadline; a write that fails is
	// retried with a context already cancelled, so never reaches Redis).
	refused map[rdb.Member]time.Time
}

func newFences(rc redis.UniversalClient, ks rdb.Keyspace, after time.Duration, log *slog.Logger) *fences {
	return &fences{rdb: rc, ks: ks, after: after, log: log, running: map[rdb.Member]*attempt{}, refused: map[rdb.Member]time.Time{}}
}

// track follows job from now on: the returned context ends with ErrFenced
// should another process take it over; untrack ends the following.
func (f *fences) track(ctx context.Context, job rdb.Member) (context.Context, *attempt, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	a := &attempt{job: job, began: time.Now(), cancel: cancel, f: f}
	ctx = context.WithValue(ctx, attemptKey{}, a)
	f.mu.Lock()
	f.running[a.job] = a
	f.mu.Unlock()
	return ctx, a, func() {
		f.mu.Lock()
		if f.running[a.job] == a {
			delete(f.running, a.job)
		}
		if fencedAt, ok := f.refused[a.job]; ok && fencedAt.Before(a.began) {
			// A later run of a fenced job, in this process: the fenced
			// run's write, if asynq made one, came long ago; this run's
			// outcome goes through.
			delete(f.refused, a.job)
		}
		f.mu.Unlock()
		cancel(nil)
	}
}

// old says whether a may have been taken over: only a job this process has
// had for RecoverAfter (less a second of rounding in asynq's lease) can be.
func (f *fences) old(a *attempt) bool { return time.Since(a.began) >= f.after-time.Second }

// fence marks a as taken over: its context ends with ErrFenced and
// asynq's writes for it are refused.
func (f *fences) fence(a *attempt, takenAgo time.Duration) {
	a.mu.Lock()
	first := !a.fenced
	a.fenced = true
	a.mu.Unlock()
	if !first {
		return
	}
	f.mu.Lock()
	f.refused[a.job] = time.Now()
	f.mu.Unlock()
	a.cancel(ErrFenced)
	f.log.Warn("job taken over by another worker process while this one did not answer; cancelled, nothing of this run is recorded",
		"job", a.job.ID, "queue", a.job.Queue, "taken_ago", takenAgo.Round(time.Millisecond), "had_for", time.Since(a.began).Round(time.Millisecond))
}

// handBack refuses asynq's write for a: the gate put its job back in its
// queue (errHandedBack), and asynq, told of a job that never ran, would
// otherwise move it again (to retry) or delete it.
func (f *fences) handBack(a *attempt) {
	f.mu.Lock()
	f.refused[a.job] = time.Now()
	f.mu.Unlock()
}

// check asks Redis whether the given attempts (old ones) were taken over,
// and fences those that were: taken after this process took them, i.e.
// taken less long ago than this process has had them, with half of
// RecoverAfter as margin (a job is taken only after RecoverAfter without a
// renewal, so a run that began after the taking is far younger).
func (f *fences) check(ctx context.Context, as []*attempt) error {
	byQueue := map[string][]*attempt{}
	for _, a := range as {
		byQueue[a.job.Queue] = append(byQueue[a.job.Queue], a)
	}
	var errs []error
	for q, list := range byQueue {
		ids := make([]string, len(list))
		for i, a := range list {
			ids[i] = a.job.ID
		}
		ages, err := f.ks.FenceAges(ctx, f.rdb, q, ids)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, a := range list {
			if ago, ok := ages[a.job.ID]; ok && time.Since(a.began) > ago+f.after/2 {
				f.fence(a, ago)
			}
		}
	}
	return errors.Join(errs...)
}

// checkOne checks a single attempt, if it is old enough to matter, and
// says whether it is fenced. A failed check leaves it as it was.
func (f *fences) checkOne(ctx context.Context, a *attempt) bool {
	if a.isFenced() {
		return true
	}
	if !f.old(a) {
		return false
	}
	_ = f.check(ctx, []*attempt{a})
	return a.isFenced()
}

// confirm is checkOne that, while Redis does not answer, asks again
// (100 ms, then up to a second apart) until it does or ctx ends: a run
// must not record anything, or publish a file, before it knows that it
// still counts. A process cut off from Redis learns this way, as soon as
// Redis answers again, that its jobs were taken meanwhile. The first read
// is made even when ctx has ended (bounded by outageRetryMax). It returns
// nil when the run still counts, ErrFenced when it does not, and an error
// saying so when ctx ended before Redis answered.
func (f *fences) confirm(ctx context.Context, a *attempt) error {
	if a.isFenced() {
		return ErrFenced
	}
	if !f.old(a) {
		return nil
	}
	pause := outageRetryFirst
	for first := true; ; first = false {
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if first {
			// The first look does not wait on ctx: a job's context often
			// ends just as it was taken over (asynq gives up the lease of
			// a process that was stopped past it), and one bounded read
			// then tells whether the run was taken, rather than "could
			// not tell" with Redis answering all along.
			cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), outageRetryMax)
		}
		err := f.check(cctx, []*attempt{a})
		cancel()
		switch {
		case a.isFenced():
			return ErrFenced
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("%w: %w (%w)", errUnconfirmed, context.Cause(ctx), err)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		pause = min(2*pause, outageRetryMax)
	}
}

// errUnconfirmed: an old job's end came while Redis did not answer, so
// whether another process took it over is not known; nothing is recorded.
var errUnconfirmed = errors.New("could not tell whether this run still counts (Redis did not answer before the job's context ended)")

// loop checks the old jobs of this process every fenceEvery (at once after
// a stall: a stopped process's ticker fires as soon as it runs again), and
// forgets refusals past their time.
func (f *fences) loop(ctx context.Context) {
	everyTick(ctx, fenceEvery, func() { f.look(ctx) })
}

// look checks the old jobs of this process once (loop).
func (f *fences) look(ctx context.Context) {
	now := time.Now()
	var old []*attempt
	f.mu.Lock()
	for _, a := range f.running {
		if !a.isFenced() && f.old(a) {
			old = append(old, a)
		}
	}
	for k, at := range f.refused {
		if now.Sub(at) > fencedKeep {
			delete(f.refused, k)
		}
	}
	f.mu.Unlock()
	if len(old) > 0 {
		cctx, cancel := context.WithTimeout(ctx, fenceEvery*4)
		defer cancel()
		_ = f.check(cctx, old)
	}
}

// guard is asked before asynq writes for jobs: it refuses a write for
// the task of a fenced run (once: the outcome asynq writes for it), and,
// for an old job this process still runs (asynq writes for a job whose
// deadline passed without waiting for its handler), checks the fence
// first.
func (f *fences) guard(ctx context.Context, jobs []rdb.Member) error {
	f.mu.Lock()
	var check *attempt
	refused := false
	for _, k := range jobs {
		if _, ok := f.refused[k]; ok {
			if a := f.running[k]; a == nil || !a.isFenced() {
				delete(f.refused, k) // the fenced run's outcome: refused once
			}
			refused = true
			break
		}
		if a := f.running[k]; a != nil && f.old(a) {
			check = a
		}
	}
	f.mu.Unlock()
	if !refused && check != nil {
		refused = f.checkOne(context.WithoutCancel(ctx), check)
	}
	if refused {
		return fmt.Errorf("compartment: not written: %w", ErrFenced)
	}
	return nil
}

// isOwn says whether this process runs (or holds) the job.
func (f *fences) isOwn(job rdb.Member) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	_, ok := f.running[job]
	return ok
}

// CheckFence returns ErrFenced when the job of ctx (a handler's context)
// was taken over by another worker process while this one was stalled or
// cut off from Redis, and nil when the run still counts (also outside a
// job). A handler
// calls it before a step that must happen once, such as a report's final
// rename: a job this process has had for less than RecoverAfter costs
// nothing, an older one one read. While Redis does not answer it waits
// for it; if ctx ends first it returns an error saying it could not tell
// (without Redis it cannot know), and the step must not happen either.
func CheckFence(ctx context.Context) error {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	if a == nil {
		return nil
	}
	if a.isFenced() {
		return ErrFenced
	}
	return a.f.confirm(ctx, a)
}

// recoverer takes back the jobs of worker processes that stopped
// answering, for the pools of this process.
type recoverer struct {
	r     *runner
	after time.Duration
	// seen: per queue, per job, the lease expiry last seen and since when
	// (monotonic) it has not moved.
	seen map[string]map[string]leaseSeen
	last time.Time // the last look (monotonic)
}

type leaseSeen struct {
	expiry float64
	since  time.Time
}

func (rc *recoverer) loop(ctx context.Context) {
	everyTick(ctx, recoverEvery, func() {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		rc.look(lctx)
	})
}

// everyTick calls fn every d until ctx ends (a tick missed while the
// process was stopped comes as soon as it runs again).
func everyTick(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// look reads the leases of every queue of this process's pools and puts
// back the jobs whose lease has not moved for RecoverAfter.
func (rc *recoverer) look(ctx context.Context) {
	now := time.Now()
	if !rc.last.IsZero() && now.Sub(rc.last) > max(3*recoverEvery, 2*time.Second) {
		// This process was stalled (or slow): it did not watch, so what it
		// saw says nothing of the time in between. Start over.
		rc.seen = nil
	}
	rc.last = now
	if rc.seen == nil {
		rc.seen = map[string]map[string]leaseSeen{}
	}
	pools := rc.r.c.pools().pools
	poolOf := map[string]*Pool{}
	var queues []string
	for _, p := range pools {
		for _, q := range p.queues {
			poolOf[q] = p
			queues = append(queues, q)
		}
	}
	leases, err := rdb.Leases(ctx, rc.r.c.rdb, queues)
	if err != nil {
		rc.seen = nil // the leases may move while we cannot see them
		return
	}
	due := map[*Pool][]stale{}
	for _, q := range queues {
		prev := rc.seen[q]
		cur := make(map[string]leaseSeen, len(leases[q]))
		for _, l := range leases[q] {
			s, ok := prev[l.ID]
			if !ok || s.expiry != l.Expiry {
				s = leaseSeen{expiry: l.Expiry, since: now}
			}
			cur[l.ID] = s
			job := rdb.Member{ID: l.ID, Queue: q}
			if silent := now.Sub(s.since); silent >= rc.after && !rc.r.fences.isOwn(job) {
				due[poolOf[q]] = append(due[poolOf[q]], stale{job: job, expiry: l.Expiry, silent: silent})
			}
		}
		rc.seen[q] = cur
	}
	for p, jobs := range due {
		rc.recoverJobs(ctx, p, jobs)
	}
}

// recoverPlace is where a job of p recovered from queue waits for a slot:
// nil for a process-scoped pool; for a cluster-scoped one, at the head of
// its tier's jobs (ranked by tier with strict tiers), kept for two minutes
// for it to be dequeued again and ask.
func (r *runner) recoverPlace(p *Pool, queue string) *rdb.RecoverPlace {
	g := r.gates[p.Name()]
	if g == nil {
		return nil
	}
	rank := 1
	if g.conf.Load().strict {
		rank = p.rank(queue)
	}
	return &rdb.RecoverPlace{Rank: rank, Keep: 2 * time.Minute}
}

type stale struct {
	job    rdb.Member
	expiry float64
	silent time.Duration
}

// recoverJobs puts back p's stale jobs, then logs and reports what went
// back, by the process that ran it.
func (rc *recoverer) recoverJobs(ctx context.Context, p *Pool, jobs []stale) {
	r := rc.r
	ids := make([]string, len(jobs))
	for i, s := range jobs {
		ids[i] = s.job.ID
	}
	// Who ran them, while asynq still lists the process (10 s after its
	// last heartbeat): best effort, for the log.
	servers, _ := rdb.RunningOn(ctx, r.c.rdb, ids)
	byProcess := map[string]*Recovery{}
	for _, s := range jobs {
		res, err := r.c.ks.RecoverJob(ctx, r.c.rdb, s.job, s.expiry, p.Name(), r.recoverPlace(p, s.job.Queue), fencedKeep)
		if err != nil {
			r.log.Warn("could not recover a job of a worker process that stopped answering; asynq's recoverer remains", "pool", p.Name(), "job", s.job.ID, "error", err)
			continue
		}
		if res.Outcome != rdb.Recovered {
			continue
		}
		proc := servers[s.job.ID]
		if proc == "" {
			proc = res.Holder
		}
		rec := byProcess[proc]
		if rec == nil {
			rec = &Recovery{Pool: p.Name(), Process: proc, Silent: time.Duration(math.MaxInt64)}
			byProcess[proc] = rec
		}
		rec.Jobs = append(rec.Jobs, s.job.ID)
		rec.Silent = min(rec.Silent, s.silent)
	}
	procs := make([]string, 0, len(byProcess))
	for proc := range byProcess {
		procs = append(procs, proc)
	}
	sort.Strings(procs)
	for _, proc := range procs {
		rec := byProcess[proc]
		name := proc
		if name == "" {
			name = "(unknown: it left nothing in Redis)"
		}
		r.log.Warn("recovered the jobs of a worker process that stopped answering: back at the head of their queue, no retry used up",
			"pool", rec.Pool, "process", name, "jobs", strings.Join(rec.Jobs, ","), "silent_for", rec.Silent.Round(100*time.Millisecond))
		if f := r.c.cfg.OnRecover; f != nil {
			f(*rec)
		}
	}
}
