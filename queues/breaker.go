package queues

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// BreakerConfig is a pool's circuit breaker (see docs/BREAKER.md). While it
// is open, no worker process takes the pool's jobs from their queues: they
// wait there, in tier order, without failing or using up a retry. Every
// zero field takes the default its comment names.
type BreakerConfig struct {
	// FailureRatio trips the breaker when this share of the calls in the
	// window failed (errors that count, and slow calls). Defaults to 0.5;
	// more than 0 and at most 1.
	FailureRatio float64 `json:"failure_ratio"`
	// MinCalls is how many calls the window needs before the ratio can
	// trip the breaker. Defaults to 10; at least 1.
	MinCalls int `json:"min_calls"`
	// Window is how far back calls are counted, across every worker
	// process. Defaults to 1m; at least 1s.
	Window time.Duration `json:"window"`
	// SlowCall makes a job that runs longer than this count as a failure
	// (the job itself still succeeds). Defaults to 0: off.
	SlowCall time.Duration `json:"slow_call,omitempty"`
	// CoolDown is how long the breaker stays open before it lets probes
	// through (half-open). Defaults to 30s; at least 1s.
	CoolDown time.Duration `json:"cool_down"`
	// MaxCoolDown caps the cool-down, which doubles each time a probe fails
	// and the breaker opens again. Defaults to 5m, or CoolDown if that is
	// longer; at least CoolDown.
	MaxCoolDown time.Duration `json:"max_cool_down"`
	// Probes is how many jobs run, across every worker process, while the
	// breaker is half-open; when all of them succeed it closes, when one
	// fails it opens again. Defaults to 1; at least 1.
	Probes int `json:"probes"`
}

// Breaker defaults and limits.
const (
	DefaultBreakerFailureRatio = 0.5
	DefaultBreakerMinCalls     = 10
	DefaultBreakerWindow       = time.Minute
	DefaultBreakerCoolDown     = 30 * time.Second
	DefaultBreakerMaxCoolDown  = 5 * time.Minute
	DefaultBreakerProbes       = 1
	// MinBreakerCoolDown keeps a process's view of a closed breaker
	// (refreshed every breakerTick, trusted for breakerFresh) from
	// outliving an open state.
	MinBreakerCoolDown = time.Second
	// MinBreakerWindow is the shortest window.
	MinBreakerWindow = time.Second
)

// Breaker timings in each process.
const (
	// breakerTick is how often a process reports its calls and reads the
	// breaker's state.
	breakerTick = 250 * time.Millisecond
	// breakerFresh is how long a process trusts that the breaker is closed
	// without asking Redis: a job starting later asks (one script call).
	// Less than MinBreakerCoolDown, so no process can miss an open state
	// and run a job during half-open without asking.
	breakerFresh = 750 * time.Millisecond
	// breakerHoldDelay is how soon a job held back by the breaker goes back
	// to its queue (asynq's retry set, forwarded every
	// DelayedCheckInterval); its queue stays paused while the breaker is
	// open, so it waits there.
	breakerHoldDelay = time.Second
	// breakerProbeTTL is a probe's lease, renewed every breakerTick while
	// it runs: a probe whose process died frees its place after that.
	breakerProbeTTL = 5 * time.Second
	// breakerPauseValue marks a queue pause set by the breaker.
	breakerPauseValue = rdb.BreakerPause
	// breakerLateAge is how long a tick keeps looking for the retry of a
	// job a trip gave its failure back to before asynq had written that
	// retry (asynq writes it right after the handler returns).
	breakerLateAge = 30 * time.Second
)

// BreakerStatus is a circuit breaker's state: BreakerClosed, BreakerOpen
// or BreakerHalfOpen (docs/BREAKER.md has the state machine).
type BreakerStatus string

// Breaker states.
const (
	// BreakerClosed: jobs run; their calls are counted.
	BreakerClosed BreakerStatus = "closed"
	// BreakerOpen: no worker process takes the pool's jobs; they wait in
	// their queues.
	BreakerOpen BreakerStatus = "open"
	// BreakerHalfOpen: the cool-down is over and a few probe jobs run.
	BreakerHalfOpen BreakerStatus = "half-open"
)

// BreakerStatuses lists every BreakerStatus, for exporters that want every
// series from the start.
var BreakerStatuses = []BreakerStatus{BreakerClosed, BreakerOpen, BreakerHalfOpen}

// BreakerChange is a change of a pool's circuit breaker from one state to
// another, as Config.OnBreakerChange receives it.
//
// Each change is made by one script call in Redis and seen by exactly one
// process: the one whose call made it. A worker process sees the changes
// its own calls make: the trip (its report of a failure, or of calls at a
// tick, passed the ratio), the end of the cool-down (its tick, or one of
// its jobs asking to start, was the first to look after it), and the
// probes' verdict (its probe closed the breaker, or failed and opened it
// again). A change an operator forces (Client.ForceBreaker: the enqueue
// command, the dashboard) is seen by the client that forced it, not by the
// workers. Summed over every process, each change is seen once.
//
// One call can make two changes, seen in order: a probe that outlived its
// half-open state (another probe failed and the breaker reopened) and
// ends after the new cool-down moves it to half-open, then to closed or
// open. Forcing a breaker into the state it is in (open when open) is no
// change.
type BreakerChange struct {
	Pool     string
	From, To BreakerStatus
	// Why says what moved it: "4 of 4 calls failed (…)", "cool-down
	// over", "2 of 2 probes succeeded", "a probe failed (…)", "forced open
	// by an operator", …
	Why string
	// At is when, by Redis's clock (as BreakerState.Since).
	At time.Time
}

// errBreakerOpen marks a job that did not run, or whose failure is put down
// to the outage, because its pool's breaker is open: it goes back to its
// queue without using up a retry.
var errBreakerOpen = errors.New("the pool's circuit breaker is open")

// errBreakerRedis marks a job that did not run because Redis failed while
// it asked the breaker. No retry is used up.
var errBreakerRedis = errors.New("could not reach Redis for the circuit breaker")

// DependencyError marks err as the fault of the pool's dependency (its
// database, a service): it counts toward the pool's circuit breaker even
// when it would not (for example a Permanent error). DependencyError(nil)
// is nil.
func DependencyError(err error) error {
	if err == nil {
		return nil
	}
	return &dependencyMark{err: err, dep: true}
}

// NotDependency marks err as the job's own fault: the job fails and is
// retried as usual, but the pool's circuit breaker does not count it.
// NotDependency(nil) is nil.
func NotDependency(err error) error {
	if err == nil {
		return nil
	}
	return &dependencyMark{err: err, dep: false}
}

type dependencyMark struct {
	err error
	dep bool
}

func (m *dependencyMark) Error() string { return m.err.Error() }
func (m *dependencyMark) Unwrap() error { return m.err }

// breakerCounts says whether a job's error counts toward its pool's
// breaker: ordinary errors do; permanent failures (malformed payload,
// panic, SkipRetry, Permanent), jobs that never ran and jobs cancelled by a
// stopping worker do not; a handler's DependencyError or NotDependency
// decides.
func breakerCounts(err error) bool {
	if err == nil {
		return false
	}
	var m *dependencyMark
	if errors.As(err, &m) {
		return m.dep
	}
	switch {
	case errors.Is(err, asynq.SkipRetry), errors.Is(err, errGateWait), errors.Is(err, errGateRedis),
		errors.Is(err, errBreakerOpen), errors.Is(err, errBreakerRedis), errors.Is(err, context.Canceled):
		return false
	}
	return true
}

// softFailure is a failure of a job in a pool with a breaker. asynq does not
// count it (IsFailure is false): the runner's own count in Redis, n, is
// the only one, so that a failure the breaker puts down to an outage can be
// given back.
type softFailure struct {
	n   int
	err error
}

func (f *softFailure) Error() string { return f.err.Error() }
func (f *softFailure) Unwrap() error { return f.err }

// WithDefaults returns a copy of b with its defaults filled; nil stays nil.
func (b *BreakerConfig) withDefaults() *BreakerConfig {
	if b == nil {
		return nil
	}
	c := *b
	if c.FailureRatio == 0 {
		c.FailureRatio = DefaultBreakerFailureRatio
	}
	if c.MinCalls == 0 {
		c.MinCalls = DefaultBreakerMinCalls
	}
	if c.Window == 0 {
		c.Window = DefaultBreakerWindow
	}
	if c.CoolDown == 0 {
		c.CoolDown = DefaultBreakerCoolDown
	}
	if c.MaxCoolDown == 0 {
		c.MaxCoolDown = max(DefaultBreakerMaxCoolDown, c.CoolDown)
	}
	if c.Probes == 0 {
		c.Probes = DefaultBreakerProbes
	}
	return &c
}

// problems checks a breaker (defaults filled).
func (b *BreakerConfig) problems(label string) []string {
	if b == nil {
		return nil
	}
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(label+": breaker: "+format, args...)) }
	if !(b.FailureRatio > 0 && b.FailureRatio <= 1) {
		add("failure_ratio must be more than 0 and at most 1, got %g", b.FailureRatio)
	}
	if b.MinCalls < 1 {
		add("min_calls must be >= 1, got %d", b.MinCalls)
	}
	if b.Window < MinBreakerWindow {
		add("window must be >= %s, got %s", MinBreakerWindow, b.Window)
	}
	if b.SlowCall < 0 {
		add("slow_call must be >= 0 (0: off), got %s", b.SlowCall)
	}
	if b.CoolDown < MinBreakerCoolDown {
		add("cool_down must be >= %s, got %s", MinBreakerCoolDown, b.CoolDown)
	}
	if b.MaxCoolDown < b.CoolDown {
		add("max_cool_down must be >= cool_down (%s), got %s", b.CoolDown, b.MaxCoolDown)
	}
	if b.Probes < 1 {
		add("probes must be >= 1, got %d", b.Probes)
	}
	return out
}

// breakerSettings are the settings the breaker's scripts take from b.
func breakerSettings(b *BreakerConfig) rdb.BreakerSettings {
	b = b.withDefaults()
	if b == nil {
		b = (&BreakerConfig{}).withDefaults()
	}
	return rdb.BreakerSettings{
		FailureRatio: b.FailureRatio, MinCalls: b.MinCalls, Window: b.Window,
		CoolDown: b.CoolDown, MaxCoolDown: b.MaxCoolDown, Probes: b.Probes, ProbeTTL: breakerProbeTTL,
	}
}

// breakerScripts returns the scripts of pool p's breaker, for p's current
// queues and settings.
func breakerScripts(rc redis.UniversalClient, ks rdb.Keyspace, p *Pool) *rdb.Breaker {
	return rdb.NewBreaker(rc, ks, p.Name(), p.queues, breakerSettings(p.cfg.Breaker))
}

// breaker is a pool's circuit breaker in one process. The state lives in
// Redis, shared by every process; each process keeps a view of it,
// refreshed every breakerTick and by every script it runs, counts its
// successful calls locally and reports them each tick, and reports a failure
// at once (so the breaker trips on the failure that passes the ratio, not a
// tick later).
type breaker struct {
	rc      redis.UniversalClient
	ks      rdb.Keyspace
	name    string // the pool's
	counts  rdb.FailureCounts
	conf    atomic.Pointer[breakerConf]
	log     *slog.Logger
	onClose func(ctx context.Context) // settles the gate's pauses, if any
	// onChange is Config.OnBreakerChange (nil: none).
	onChange func(BreakerChange)

	mu       sync.Mutex
	state    BreakerStatus
	syncedAt time.Time           // when the last call that read the state was sent
	calls    int64               // successful calls not reported yet
	cleared  []rdb.Member        // jobs that succeeded, whose failure counts to delete
	probes   map[rdb.Member]bool // the probes this process runs
	// pausedAt and resumedAt are when this process last saw the breaker
	// leave the closed state and come back to it (its own clock; zero
	// until it has, resumedAt zero while it is not closed): a job's run
	// span tells whether the job waited through that pause.
	pausedAt, resumedAt time.Time
}

func newBreaker(rc redis.UniversalClient, ks rdb.Keyspace, p *Pool, log *slog.Logger) *breaker {
	b := &breaker{
		rc: rc, ks: ks, name: p.Name(), counts: rdb.NewFailureCounts(rc, ks, p.Name()),
		log: log.With("pool", p.Name(), "component", "breaker"), state: BreakerClosed, probes: map[rdb.Member]bool{},
	}
	b.configure(p)
	return b
}

// breakerConf is what the breaker takes from its pool's config. A
// reconfiguration swaps it whole (breaker.configure); each script run
// reads one.
type breakerConf struct {
	cfg     BreakerConfig
	scripts *rdb.Breaker // built for the pool's queues and cfg
}

// configure derives every setting the breaker takes from the pool's
// config: its queues and thresholds (Client.Reconfigure). Its state, in
// Redis, stays.
func (b *breaker) configure(p *Pool) {
	b.conf.Store(&breakerConf{cfg: *p.cfg.Breaker.withDefaults(), scripts: breakerScripts(b.rc, b.ks, p)})
}

// scripts returns the breaker's scripts for the configuration in effect.
func (b *breaker) scripts() *rdb.Breaker { return b.conf.Load().scripts }

// apply applies the reply of a script sent at sent to this process's view,
// and logs and reports the changes the script made.
func (b *breaker) apply(ctx context.Context, sent time.Time, r rdb.BreakerReply) {
	now := BreakerStatus(r.State)
	b.mu.Lock()
	seen := b.state
	b.state, b.syncedAt = now, sent
	switch {
	case seen == BreakerClosed && now != BreakerClosed:
		b.pausedAt, b.resumedAt = time.Now(), time.Time{}
	case seen != BreakerClosed && now == BreakerClosed && !b.pausedAt.IsZero():
		b.resumedAt = time.Now()
	}
	b.mu.Unlock()
	if seen != now {
		// Every process's own view, at debug level: when each process
		// stopped (or resumed) taking the pool's jobs.
		b.log.Debug("circuit breaker seen", "from", string(seen), "to", r.State)
	}
	if !r.Changed() {
		return
	}
	// Only the process whose script made a change sees it: one log line
	// and one call of the hook per change, cluster-wide.
	for _, c := range r.Changes {
		b.log.Warn("circuit breaker", "from", c.From, "to", c.To, "why", c.Why)
	}
	reportChanges(b.onChange, b.name, r)
	if now == BreakerClosed && b.onClose != nil {
		b.onClose(context.WithoutCancel(ctx))
	}
}

// pausedWithin returns the part of [from, to] during which this process
// last saw the breaker hold the pool's jobs back (not closed), if any.
func (b *breaker) pausedWithin(from, to time.Time) (start, end time.Time, ok bool) {
	b.mu.Lock()
	paused, resumed := b.pausedAt, b.resumedAt
	b.mu.Unlock()
	if paused.IsZero() {
		return time.Time{}, time.Time{}, false
	}
	if resumed.IsZero() {
		resumed = to
	}
	start, end = maxTime(paused, from), minTime(resumed, to)
	return start, end, end.After(start)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// reportChanges calls hook (if any) with each change r made to pool's
// breaker, in order.
func reportChanges(hook func(BreakerChange), pool string, r rdb.BreakerReply) {
	if hook == nil {
		return
	}
	for _, c := range r.Changes {
		hook(BreakerChange{Pool: pool, From: BreakerStatus(c.From), To: BreakerStatus(c.To), Why: c.Why, At: r.Now})
	}
}

// admit says whether a job may start. A process that saw the breaker
// closed less than breakerFresh ago answers rdb.VerdictRun without asking
// Redis.
func (b *breaker) admit(ctx context.Context, job rdb.Member) (rdb.Verdict, error) {
	b.mu.Lock()
	fresh := b.state == BreakerClosed && time.Since(b.syncedAt) < breakerFresh
	b.mu.Unlock()
	if fresh {
		return rdb.VerdictRun, nil
	}
	sent := time.Now()
	r, v, err := b.scripts().Admit(context.WithoutCancel(ctx), job)
	if err != nil {
		return "", err
	}
	b.apply(ctx, sent, r)
	if v == rdb.VerdictProbe {
		b.mu.Lock()
		b.probes[job] = true
		b.mu.Unlock()
	}
	return v, nil
}

// succeeded counts a successful call that was not slow; the count is
// reported at the next tick. job is the job, whose failure count the tick
// deletes if it may have one (see clearCounts).
func (b *breaker) succeeded(job rdb.Member) {
	b.mu.Lock()
	b.calls++
	b.cleared = append(b.cleared, job)
	b.mu.Unlock()
}

// clearCounts deletes the failure counts of jobs that succeeded, unless no
// job of the pool had a failure count when the check ran. Every job in
// jobs started before the check (it succeeded before the tick took the
// list), and a job's count is entered in the counted set before the count
// is made (rdb.FailureCounts.AddCounted), so an empty set means none of
// them has one. A closed, healthy breaker thus deletes nothing: one small
// call per tick instead of a delete of every job that ran.
func (b *breaker) clearCounts(ctx context.Context, jobs []rdb.Member) {
	if n, err := b.counts.Counted(ctx); err == nil && n == 0 {
		return
	}
	_ = b.counts.Clear(ctx, jobs...)
}

// report reports the calls counted so far plus one call that failed
// (failed or slow; suspect is a job whose failure the breaker may give
// back, or the zero Member), and, when this report tripped the breaker,
// gives back the counted failures of the jobs in the window.
func (b *breaker) report(ctx context.Context, failed, slow int, suspect rdb.Member) (rdb.BreakerReply, error) {
	b.mu.Lock()
	calls, cleared := b.calls, b.cleared
	b.calls, b.cleared = 0, nil
	b.mu.Unlock()
	bg := context.WithoutCancel(ctx)
	if len(cleared) > 0 {
		b.clearCounts(bg, cleared)
	}
	scripts := b.scripts()
	sent := time.Now()
	r, err := scripts.Report(bg, rdb.ReportArgs{Calls: calls + int64(failed+slow), Failures: int64(failed), Slow: int64(slow), Suspect: suspect})
	if err != nil {
		// Lost counts only delay a trip; give the calls back for the next
		// tick.
		b.mu.Lock()
		b.calls += calls
		b.mu.Unlock()
		return rdb.BreakerReply{}, err
	}
	b.apply(ctx, sent, r.BreakerReply)
	if BreakerStatus(r.From) == BreakerClosed && BreakerStatus(r.State) == BreakerOpen && len(r.Suspects) > 0 {
		if err := scripts.Refund(bg, r.Suspects, true); err != nil {
			b.log.Error("circuit breaker: could not give back the failures of the jobs that tripped it", "jobs", len(r.Suspects), "error", err)
		}
	}
	return r.BreakerReply, nil
}

// forgetProbe stops renewing the probe job of this process when another
// process took the job over (fenced): its new run may hold the probe's
// place under the same member, so nothing is removed from Redis; a place
// nobody renews frees itself after breakerProbeTTL.
func (b *breaker) forgetProbe(job rdb.Member) {
	b.mu.Lock()
	delete(b.probes, job)
	b.mu.Unlock()
}

// probeDone reports the end of a probe, which this process stops renewing.
func (b *breaker) probeDone(ctx context.Context, job rdb.Member, outcome rdb.ProbeOutcome) {
	b.forgetProbe(job)
	sent := time.Now()
	r, err := b.scripts().ProbeDone(context.WithoutCancel(ctx), job, outcome)
	if err != nil {
		// The probe's lease frees its place after breakerProbeTTL.
		b.log.Error("circuit breaker: could not report a probe", "job", job.String(), "outcome", string(outcome), "error", err)
		return
	}
	b.apply(ctx, sent, r)
}

// sync reports the calls counted so far and reads the state (the tick),
// renews the leases of the probes this process runs, and brings forward
// the retries of the jobs a trip gave their failures back to before asynq
// had written those retries (one script call; it returns at once when
// there are none).
func (b *breaker) sync(ctx context.Context) error {
	b.mu.Lock()
	var probes []rdb.Member
	for m := range b.probes {
		probes = append(probes, m)
	}
	b.mu.Unlock()
	if len(probes) > 0 {
		sent := time.Now()
		r, err := b.scripts().RenewProbes(ctx, probes)
		if err != nil {
			return err
		}
		b.apply(ctx, sent, r)
	}
	if _, err := b.report(ctx, 0, 0, rdb.Member{}); err != nil {
		return err
	}
	_, err := b.scripts().BringLateForward(ctx, breakerLateAge)
	return err
}

// loop reports and reads the breaker every breakerTick until ctx ends,
// then reports what is left.
func (b *breaker) loop(ctx context.Context) {
	t := time.NewTicker(breakerTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = b.sync(context.WithoutCancel(ctx))
			return
		case <-t.C:
			_ = b.sync(ctx)
		}
	}
}

// outcome applies a job's outcome to the breaker and returns the job's
// verdict: nil, the handler's permanent error, a soft failure (counted by
// the runner only), or one held back for the outage (errBreakerOpen: no
// retry used up). took is the handler's own run time.
func (r *runner) breakerOutcome(ctx context.Context, p *Pool, b *breaker, job rdb.Member, probe bool, took time.Duration, err error) error {
	cfg := b.conf.Load().cfg
	slow := cfg.SlowCall > 0 && took > cfg.SlowCall
	bg := context.WithoutCancel(ctx)
	counts := breakerCounts(err)
	if probe {
		outcome := rdb.ProbeNone
		switch {
		case counts || slow:
			outcome = rdb.ProbeFail
		case err == nil:
			outcome = rdb.ProbeOK
		}
		b.probeDone(ctx, job, outcome)
		if counts {
			return held(p, err)
		}
	} else {
		switch {
		case err == nil && !slow:
			b.succeeded(job)
		case err == nil || !counts:
			if slow {
				_, _ = b.report(ctx, 0, 1, rdb.Member{})
			}
		default:
			// A failure that counts: count it against the job first, so
			// that a trip by any process can give it back.
			n, cerr := b.counts.AddCounted(bg, job, failureCountTTL)
			s := 0
			if slow {
				s = 1
			}
			res, rerr := b.report(ctx, 1-s, s, job)
			if rerr == nil && BreakerStatus(res.State) != BreakerClosed && BreakerStatus(res.From) != BreakerClosed {
				// The breaker was open already: this failure is the
				// outage's, not the job's.
				_ = b.scripts().Refund(bg, []rdb.Member{job}, false)
			}
			if rerr == nil && BreakerStatus(res.State) != BreakerClosed {
				return held(p, err)
			}
			if cerr != nil {
				return err // Redis fails: asynq's own count decides
			}
			return r.softVerdict(ctx, p, b, job, n, err)
		}
	}
	switch {
	case err == nil:
		if probe || slow {
			_ = b.counts.Clear(bg, job)
		}
		return nil
	case errors.Is(err, asynq.SkipRetry):
		_ = b.counts.Clear(bg, job)
		return err
	case errors.Is(err, errGateWait), errors.Is(err, errGateRedis):
		return err
	}
	n, cerr := b.counts.AddCounted(bg, job, failureCountTTL)
	if cerr != nil {
		return err
	}
	return r.softVerdict(ctx, p, b, job, n, err)
}

// softVerdict turns the n-th counted failure of a job in a breaker pool
// into a permanent one past max_retry, or a soft failure asynq retries
// without counting.
func (r *runner) softVerdict(ctx context.Context, p *Pool, b *breaker, job rdb.Member, n int64, err error) error {
	if maxRetry := p.cfg.retries(); n > int64(maxRetry) {
		if ctx.Err() == nil {
			_ = b.counts.Clear(context.WithoutCancel(ctx), job)
		}
		return tooMany(n, maxRetry, err)
	}
	return &softFailure{n: int(n), err: err}
}

// held is the verdict of a job whose failure the breaker puts down to the
// outage: back to its queue, no retry used up. The job's error is kept as
// text only: a DependencyError(Permanent(…)) must not make asynq archive a
// job the outage failed.
func held(p *Pool, err error) error {
	return fmt.Errorf("pool %q: %w; the job goes back to its queue: %v", p.Name(), errBreakerOpen, err)
}

// clearBreaker removes the breaker state of a pool that runs without one,
// and lifts any pause a breaker left on its queues: one script.
func clearBreaker(ctx context.Context, rc redis.UniversalClient, ks rdb.Keyspace, p *Pool) error {
	_, err := breakerScripts(rc, ks, p).Clear(ctx)
	return err
}
