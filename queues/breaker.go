package queues

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
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

// Breaker states.
const (
	BreakerClosed   = "closed"
	BreakerOpen     = "open"
	BreakerHalfOpen = "half-open"
)

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

//go:embed lua/breaker_lib.lua
var breakerLib string

//go:embed lua/breaker_report.lua
var breakerReportLua string

//go:embed lua/breaker_admit.lua
var breakerAdmitLua string

//go:embed lua/breaker_done.lua
var breakerDoneLua string

//go:embed lua/breaker_force.lua
var breakerForceLua string

//go:embed lua/breaker_renew.lua
var breakerRenewLua string

//go:embed lua/breaker_refund.lua
var breakerRefundLua string

//go:embed lua/breaker_late.lua
var breakerLateLua string

//go:embed lua/breaker_count.lua
var breakerCountLua string

//go:embed lua/breaker_counted.lua
var breakerCountedLua string

// The breaker's scripts; their KEYS and ARGV are described at the top of
// each file.
var (
	breakerReportScript  = redis.NewScript(breakerLib + breakerReportLua)
	breakerAdmitScript   = redis.NewScript(breakerLib + breakerAdmitLua)
	breakerDoneScript    = redis.NewScript(breakerLib + breakerDoneLua)
	breakerForceScript   = redis.NewScript(breakerLib + breakerForceLua)
	breakerRenewScript   = redis.NewScript(breakerLib + breakerRenewLua)
	breakerRefundScript  = redis.NewScript(breakerRefundLua)
	breakerLateScript    = redis.NewScript(breakerLateLua)
	breakerCountScript   = redis.NewScript(breakerCountLua)
	breakerCountedScript = redis.NewScript(breakerCountedLua)
)

// breakerScriptKeys returns the KEYS of the breaker's scripts for pool p.
func breakerScriptKeys(ks rdb.Keyspace, p *Pool) []string {
	state, window, suspects, probes := ks.BreakerKeys(p.Name())
	keys := []string{state, window, suspects, probes}
	for _, q := range p.queues {
		keys = append(keys, rdb.PausedKey(q))
	}
	return keys
}

// breakerScriptArgs returns ARGV[1..7] of the breaker's scripts.
func breakerScriptArgs(p *Pool) []any {
	b := p.cfg.Breaker.withDefaults()
	if b == nil {
		b = (&BreakerConfig{}).withDefaults()
	}
	return []any{
		strconv.FormatFloat(b.FailureRatio, 'f', -1, 64), b.MinCalls, b.Window.Milliseconds(),
		b.CoolDown.Milliseconds(), b.MaxCoolDown.Milliseconds(), b.Probes,
		breakerProbeTTL.Milliseconds(),
	}
}

// breakerResult is what every breaker script returns.
type breakerResult struct {
	state, from, why string
	left             time.Duration // of the cool-down; -1: until an operator acts
	extra            []string
}

func parseBreakerResult(v any) (breakerResult, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) < 4 {
		return breakerResult{}, fmt.Errorf("breaker: unexpected reply %v", v)
	}
	str := func(x any) string { s, _ := x.(string); return s }
	left, _ := vals[3].(int64)
	r := breakerResult{state: str(vals[0]), from: str(vals[1]), why: str(vals[2]), left: time.Duration(left) * time.Millisecond}
	if left < 0 {
		r.left = -1
	}
	for _, x := range vals[4:] {
		r.extra = append(r.extra, str(x))
	}
	return r, nil
}

// breaker is a pool's circuit breaker in one process. The state lives in
// Redis, shared by every process; each process keeps a view of it,
// refreshed every breakerTick and by every script it runs, counts its
// successful calls locally and reports them each tick, and reports a failure
// at once (so the breaker trips on the failure that passes the ratio, not a
// tick later).
type breaker struct {
	rdb     redis.UniversalClient
	name    string // the pool's
	ks      rdb.Keyspace
	conf    atomic.Pointer[breakerConf]
	log     *slog.Logger
	onClose func(ctx context.Context) // settles the gate's pauses, if any

	mu       sync.Mutex
	state    string
	syncedAt time.Time       // when the last call that read the state was sent
	calls    int64           // successful calls not reported yet
	cleared  []string        // jobs (job@queue) that succeeded, whose failure counts to delete
	probes   map[string]bool // the probes this process runs
}

func newBreaker(rc redis.UniversalClient, ks rdb.Keyspace, p *Pool, log *slog.Logger) *breaker {
	b := &breaker{
		rdb: rc, name: p.Name(), ks: ks,
		log: log.With("pool", p.Name(), "component", "breaker"), state: BreakerClosed, probes: map[string]bool{},
	}
	b.configure(p)
	return b
}

// breakerConf is what the breaker takes from its pool's config. A
// reconfiguration swaps it whole (breaker.configure); each script run
// reads one.
type breakerConf struct {
	queues []string
	cfg    BreakerConfig
	keys   []string
	args   []any
}

// configure derives every setting the breaker takes from the pool's
// config: its queues and thresholds (Client.Reconfigure). Its state, in
// Redis, stays.
func (b *breaker) configure(p *Pool) {
	b.conf.Store(&breakerConf{queues: p.Queues(), cfg: *p.cfg.Breaker.withDefaults(),
		keys: breakerScriptKeys(b.ks, p), args: breakerScriptArgs(p)})
}

// run runs a breaker script and applies its result to this process's view.
func (b *breaker) run(ctx context.Context, s *redis.Script, args ...any) (breakerResult, error) {
	sent := time.Now()
	c := b.conf.Load()
	v, err := s.Run(ctx, b.rdb, c.keys, append(append([]any(nil), c.args...), args...)...).Result()
	if err != nil {
		return breakerResult{}, err
	}
	r, err := parseBreakerResult(v)
	if err != nil {
		return r, err
	}
	b.mu.Lock()
	seen := b.state
	b.state, b.syncedAt = r.state, sent
	b.mu.Unlock()
	if seen != r.state {
		// Every process's own view, at debug level: when each process
		// stopped (or resumed) taking the pool's jobs.
		b.log.Debug("circuit breaker seen", "from", seen, "to", r.state)
	}
	if r.from != r.state {
		// Only the process whose script made the change sees it: one log
		// line per change, cluster-wide.
		b.log.Warn("circuit breaker", "from", r.from, "to", r.state, "why", r.why)
		if r.state == BreakerClosed && b.onClose != nil {
			b.onClose(context.WithoutCancel(ctx))
		}
	}
	return r, nil
}

// admit says whether a job may start: "run", "probe" or "wait". A process
// that saw the breaker closed less than breakerFresh ago answers "run"
// without asking Redis.
func (b *breaker) admit(ctx context.Context, member string) (string, error) {
	b.mu.Lock()
	fresh := b.state == BreakerClosed && time.Since(b.syncedAt) < breakerFresh
	b.mu.Unlock()
	if fresh {
		return "run", nil
	}
	r, err := b.run(context.WithoutCancel(ctx), breakerAdmitScript, member)
	if err != nil {
		return "", err
	}
	if len(r.extra) == 0 {
		return "", fmt.Errorf("breaker: admit: no verdict")
	}
	if r.extra[0] == "probe" {
		b.mu.Lock()
		b.probes[member] = true
		b.mu.Unlock()
	}
	return r.extra[0], nil
}

// succeeded counts a successful call that was not slow; the count is
// reported at the next tick. member (job@queue) is the job, whose failure
// count the tick deletes if it may have one (see clearCounts).
func (b *breaker) succeeded(member string) {
	b.mu.Lock()
	b.calls++
	b.cleared = append(b.cleared, member)
	b.mu.Unlock()
}

// clearCounts deletes the failure counts of members, jobs that succeeded,
// unless no job of the pool had a failure count when the check ran. Every
// job in members started before the check (it succeeded before the tick
// took the list), and a job's count is entered in the counted set before
// the count is made (lua/breaker_count.lua), so an empty set means none of
// them has one. A closed, healthy breaker thus deletes nothing: one small
// call per tick instead of a delete of every job that ran.
func (b *breaker) clearCounts(ctx context.Context, members []string) {
	counted := b.ks.BreakerCountedKey(b.name)
	if n, err := breakerCountedScript.Run(ctx, b.rdb, []string{counted}).Int64(); err == nil && n == 0 {
		return
	}
	_ = clearFailureCounts(ctx, b.rdb, b.ks, b.name, members...)
}

// report reports the calls counted so far plus one call that failed
// (failed or slow; member is a job whose failure the breaker may give back,
// or ""), and, when this report tripped the breaker, gives back the
// counted failures of the jobs in the window.
func (b *breaker) report(ctx context.Context, failed, slow int, member string) (breakerResult, error) {
	b.mu.Lock()
	calls, cleared := b.calls, b.cleared
	b.calls, b.cleared = 0, nil
	b.mu.Unlock()
	args := []any{calls + int64(failed+slow), failed, slow}
	if member != "" {
		args = append(args, member)
	}
	bg := context.WithoutCancel(ctx)
	if len(cleared) > 0 {
		b.clearCounts(bg, cleared)
	}
	r, err := b.run(bg, breakerReportScript, args...)
	if err != nil {
		// Lost counts only delay a trip; give the calls back for the next
		// tick.
		b.mu.Lock()
		b.calls += calls
		b.mu.Unlock()
		return r, err
	}
	if r.from == BreakerClosed && r.state == BreakerOpen && len(r.extra) > 0 {
		b.refund(bg, r.extra)
	}
	return r, nil
}

// refund gives back one counted failure of each job in members
// (job@queue) and brings its retry forward (see lua/breaker_refund.lua).
func (b *breaker) refund(ctx context.Context, members []string) {
	if err := refundFailures(ctx, b.rdb, b.ks, b.name, members, true); err != nil {
		b.log.Error("circuit breaker: could not give back the failures of the jobs that tripped it", "jobs", len(members), "error", err)
	}
}

// refundFailures runs lua/breaker_refund.lua for members (job@queue) of
// pool. late says whether a job whose retry asynq has not written yet is
// remembered, so that a later tick brings it forward (a trip's suspects),
// or not (a job that failed while the breaker was open: asynq retries it
// after breakerHoldDelay anyway).
func refundFailures(ctx context.Context, rc redis.UniversalClient, ks rdb.Keyspace, pool string, members []string, late bool) error {
	var counts, retries []string
	var ids, full []any
	for _, m := range members {
		id, queue, ok := cutMember(m)
		if !ok {
			continue
		}
		counts = append(counts, ks.FailureCountKey(queue, id))
		retries = append(retries, rdb.RetryKey(queue))
		ids, full = append(ids, id), append(full, m)
	}
	if len(counts) == 0 {
		return nil
	}
	flag := "0"
	if late {
		flag = "1"
	}
	keys := append(append(counts, retries...), ks.BreakerLateKey(pool))
	args := append(append([]any{len(counts), flag}, ids...), full...)
	return breakerRefundScript.Run(ctx, rc, keys, args...).Err()
}

// bringLateForward brings forward the retries of the jobs a trip gave
// their failures back to before asynq had written those retries (see
// lua/breaker_late.lua). One script call per tick; it returns at once
// when there are none.
func (b *breaker) bringLateForward(ctx context.Context) error {
	keys := []string{b.ks.BreakerLateKey(b.name)}
	args := []any{breakerLateAge.Milliseconds()}
	for _, q := range b.conf.Load().queues {
		keys = append(keys, rdb.RetryKey(q))
		args = append(args, q)
	}
	return breakerLateScript.Run(ctx, b.rdb, keys, args...).Err()
}

// probeDone reports the end of a probe: "ok", "fail" or "none".
func (b *breaker) probeDone(ctx context.Context, member, outcome string) {
	b.mu.Lock()
	delete(b.probes, member)
	b.mu.Unlock()
	if _, err := b.run(context.WithoutCancel(ctx), breakerDoneScript, member, outcome); err != nil {
		// The probe's lease frees its place after breakerProbeTTL.
		b.log.Error("circuit breaker: could not report a probe", "job", member, "outcome", outcome, "error", err)
	}
}

// sync reports the calls counted so far and reads the state (the tick),
// and renews the leases of the probes this process runs.
func (b *breaker) sync(ctx context.Context) error {
	b.mu.Lock()
	var probes []any
	for m := range b.probes {
		probes = append(probes, m)
	}
	b.mu.Unlock()
	if len(probes) > 0 {
		if _, err := b.run(ctx, breakerRenewScript, probes...); err != nil {
			return err
		}
	}
	if _, err := b.report(ctx, 0, 0, ""); err != nil {
		return err
	}
	return b.bringLateForward(ctx)
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
func (r *runner) breakerOutcome(ctx context.Context, p *Pool, b *breaker, member string, probe bool, took time.Duration, err error) error {
	cfg := b.conf.Load().cfg
	slow := cfg.SlowCall > 0 && took > cfg.SlowCall
	ks, bg := r.c.ks, context.WithoutCancel(ctx)
	counts := breakerCounts(err)
	if probe {
		outcome := "none"
		switch {
		case counts || slow:
			outcome = "fail"
		case err == nil:
			outcome = "ok"
		}
		b.probeDone(ctx, member, outcome)
		if counts {
			return held(p, err)
		}
	} else {
		switch {
		case err == nil && !slow:
			b.succeeded(member)
		case err == nil || !counts:
			if slow {
				_, _ = b.report(ctx, 0, 1, "")
			}
		default:
			// A failure that counts: count it against the job first, so
			// that a trip by any process can give it back.
			n, cerr := countBreakerFailure(bg, r.c.rdb, ks, p.Name(), member)
			s := 0
			if slow {
				s = 1
			}
			res, rerr := b.report(ctx, 1-s, s, member)
			if rerr == nil && res.state != BreakerClosed && res.from != BreakerClosed {
				// The breaker was open already: this failure is the
				// outage's, not the job's.
				_ = refundFailures(bg, r.c.rdb, ks, p.Name(), []string{member}, false)
			}
			if rerr == nil && res.state != BreakerClosed {
				return held(p, err)
			}
			if cerr != nil {
				return err // Redis fails: asynq's own count decides
			}
			return r.softVerdict(ctx, p, member, n, err)
		}
	}
	switch {
	case err == nil:
		if probe || slow {
			_ = clearFailureCounts(bg, r.c.rdb, ks, p.Name(), member)
		}
		return nil
	case errors.Is(err, asynq.SkipRetry):
		_ = clearFailureCounts(bg, r.c.rdb, ks, p.Name(), member)
		return err
	case errors.Is(err, errGateWait), errors.Is(err, errGateRedis):
		return err
	}
	n, cerr := countBreakerFailure(bg, r.c.rdb, ks, p.Name(), member)
	if cerr != nil {
		return err
	}
	return r.softVerdict(ctx, p, member, n, err)
}

// countBreakerFailure counts one failure against member (job@queue), a job
// of a pool with a breaker, and returns its count: one call that enters the
// job in the pool's counted set, then counts (lua/breaker_count.lua).
func countBreakerFailure(ctx context.Context, rc redis.UniversalClient, ks rdb.Keyspace, pool, member string) (int64, error) {
	id, queue, _ := cutMember(member)
	keys := []string{ks.FailureCountKey(queue, id), ks.BreakerCountedKey(pool)}
	return breakerCountScript.Run(ctx, rc, keys, member, failureCountTTL.Milliseconds()).Int64()
}

// clearFailureCounts deletes the failure counts of members (job@queue) of
// pool, and takes them out of its counted set, the count first.
func clearFailureCounts(ctx context.Context, rc redis.UniversalClient, ks rdb.Keyspace, pool string, members ...string) error {
	if len(members) == 0 {
		return nil
	}
	keys := make([]string, 0, len(members))
	zs := make([]any, 0, len(members))
	for _, m := range members {
		id, queue, ok := cutMember(m)
		if !ok {
			continue
		}
		keys = append(keys, ks.FailureCountKey(queue, id))
		zs = append(zs, m)
	}
	if len(keys) == 0 {
		return nil
	}
	_, err := rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, keys...)
		p.ZRem(ctx, ks.BreakerCountedKey(pool), zs...)
		return nil
	})
	return err
}

// cutMember splits a breaker member, job@queue.
func cutMember(m string) (id, queue string, ok bool) {
	i := strings.LastIndex(m, "@")
	if i < 0 {
		return m, "", false
	}
	return m[:i], m[i+1:], true
}

// softVerdict turns the n-th counted failure of a job in a breaker pool
// into a permanent one past max_retry, or a soft failure asynq retries
// without counting.
func (r *runner) softVerdict(ctx context.Context, p *Pool, member string, n int64, err error) error {
	if maxRetry := p.cfg.retries(); n > int64(maxRetry) {
		if ctx.Err() == nil {
			_ = clearFailureCounts(context.WithoutCancel(ctx), r.c.rdb, r.c.ks, p.Name(), member)
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
// and lifts any pause a breaker left on its queues.
func clearBreaker(ctx context.Context, rc redis.UniversalClient, ks rdb.Keyspace, p *Pool) error {
	state, window, suspects, probes := ks.BreakerKeys(p.Name())
	keys := breakerScriptKeys(ks, p)
	if err := breakerClearScript.Run(ctx, rc, keys[4:]).Err(); err != nil {
		return err
	}
	return rc.Del(ctx, state, window, suspects, probes, ks.BreakerLateKey(p.Name()), ks.BreakerCountedKey(p.Name())).Err()
}

var breakerClearScript = redis.NewScript(`
for _, key in ipairs(KEYS) do
  if redis.call("GET", key) == "compartment-breaker" then redis.call("DEL", key) end
end
return 0`)
