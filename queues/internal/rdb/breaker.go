package rdb

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A pool's circuit breaker lives in Redis, shared by every process: its
// state hash, the counts of its window, its suspects and its probes (see
// Keyspace.BreakerKeys), and asynq's pause key of each of the pool's
// queues, which it sets to BreakerPause while open. Every decision is one
// script, timed by Redis's clock; docs/BREAKER.md describes the states.

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

//go:embed lua/breaker_read.lua
var breakerReadLua string

//go:embed lua/breaker_refund.lua
var breakerRefundLua string

//go:embed lua/breaker_late.lua
var breakerLateLua string

//go:embed lua/breaker_clear.lua
var breakerClearLua string

// The breaker's scripts. Those built on lua/breaker_lib.lua share its KEYS
// (state, window, suspects, probes, then the pool's paused keys) and
// ARGV[1..7] (the settings); their own arguments follow.
var (
	breakerReportScript = redis.NewScript(breakerLib + breakerReportLua)
	breakerAdmitScript  = redis.NewScript(breakerLib + breakerAdmitLua)
	breakerDoneScript   = redis.NewScript(breakerLib + breakerDoneLua)
	breakerForceScript  = redis.NewScript(breakerLib + breakerForceLua)
	breakerRenewScript  = redis.NewScript(breakerLib + breakerRenewLua)
	breakerReadScript   = redis.NewScript(breakerLib + breakerReadLua)
	breakerRefundScript = redis.NewScript(breakerRefundLua)
	breakerLateScript   = redis.NewScript(breakerLateLua)
	breakerClearScript  = redis.NewScript(breakerClearLua)
)

// BreakerSettings are a breaker's thresholds, as its scripts take them.
type BreakerSettings struct {
	// FailureRatio and MinCalls trip it: that share of at least MinCalls
	// calls in the window failed.
	FailureRatio float64
	MinCalls     int
	// Window is how far back calls count (in ten buckets).
	Window time.Duration
	// CoolDown is how long it stays open before probing, doubled after
	// each failed probe up to MaxCoolDown.
	CoolDown, MaxCoolDown time.Duration
	// Probes is how many jobs run while half-open; ProbeTTL each probe's
	// lease, renewed while it runs.
	Probes   int
	ProbeTTL time.Duration
}

// Breaker runs the scripts of one pool's circuit breaker, for one
// configuration of the pool (its queues and settings): the keys and the
// settings' arguments are built once, here. Safe for concurrent use.
type Breaker struct {
	rc     redis.UniversalClient
	ks     Keyspace
	pool   string
	keys   []string // state, window, suspects, probes, then the queues' paused keys
	args   []any    // ARGV[1..7]: the settings
	late   []string // the late set, then the queues' retry sets
	queues []any    // the queues' names, in the order of late[1:]
}

// NewBreaker returns the breaker of pool, whose queues are queues, on rc.
func NewBreaker(rc redis.UniversalClient, ks Keyspace, pool string, queues []string, s BreakerSettings) *Breaker {
	state, window, suspects, probes := ks.BreakerKeys(pool)
	b := &Breaker{rc: rc, ks: ks, pool: pool,
		keys: []string{state, window, suspects, probes},
		args: []any{
			strconv.FormatFloat(s.FailureRatio, 'f', -1, 64), s.MinCalls, s.Window.Milliseconds(),
			s.CoolDown.Milliseconds(), s.MaxCoolDown.Milliseconds(), s.Probes, s.ProbeTTL.Milliseconds(),
		},
		late: []string{ks.BreakerLateKey(pool)},
	}
	for _, q := range queues {
		b.keys = append(b.keys, PausedKey(q))
		b.late = append(b.late, retryKey(q))
		b.queues = append(b.queues, q)
	}
	return b
}

// BreakerReply is what every state script of the breaker returns.
type BreakerReply struct {
	// State is the breaker's state after the call ("closed", "open" or
	// "half-open"), From the state before it.
	State, From string
	// Why says what moved it to State.
	Why string
	// CoolDownLeft is what is left of an open breaker's cool-down; -1 while
	// it stays open until an operator acts, 0 when not open.
	CoolDownLeft time.Duration
	// Now is Redis's clock when the script ran: when its changes were
	// made.
	Now time.Time
	// Changes are the changes of state this call made, in order: none,
	// one, or two (a call that finds an open breaker's cool-down over
	// moves it to half-open, then a probe's verdict moves it on).
	Changes []Transition
}

// Transition is one change of a breaker's state.
type Transition struct {
	From, To, Why string
}

// Changed says whether the call that returned r changed the state.
func (r BreakerReply) Changed() bool { return len(r.Changes) > 0 }

// run runs s with the breaker's keys and settings, then extra, and reads
// the common part of its reply; the rest of the reply follows.
func (b *Breaker) run(ctx context.Context, what string, s *redis.Script, extra ...any) (BreakerReply, []any, error) {
	args := make([]any, 0, len(b.args)+len(extra))
	args = append(append(args, b.args...), extra...)
	v, err := s.Run(ctx, b.rc, b.keys, args...).Result()
	if err != nil {
		return BreakerReply{}, nil, fmt.Errorf("breaker of pool %q: %s: %w", b.pool, what, err)
	}
	r, rest, err := parseBreakerReply(v)
	if err != nil {
		return BreakerReply{}, nil, fmt.Errorf("breaker of pool %q: %s: %w", b.pool, what, err)
	}
	return r, rest, nil
}

// parseBreakerReply reads {state, why, ms left, now ms, n, n × (from, to,
// why), ...} (lua/breaker_lib.lua's result) and returns the rest.
func parseBreakerReply(v any) (BreakerReply, []any, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) < 5 {
		return BreakerReply{}, nil, fmt.Errorf("unexpected reply %v", v)
	}
	var r BreakerReply
	var left, now, n int64
	var errs [5]error
	r.State, errs[0] = replyString(vals[0], "state")
	r.Why, errs[1] = replyString(vals[1], "why")
	left, errs[2] = replyInt(vals[2], "cool-down left")
	now, errs[3] = replyInt(vals[3], "clock")
	n, errs[4] = replyInt(vals[4], "number of changes")
	for _, err := range errs {
		if err != nil {
			return BreakerReply{}, nil, err
		}
	}
	if n < 0 || int64(len(vals)-5) < 3*n {
		return BreakerReply{}, nil, fmt.Errorf("unexpected reply: %d changes in %d values", n, len(vals))
	}
	r.CoolDownLeft = time.Duration(left) * time.Millisecond
	if left < 0 {
		r.CoolDownLeft = -1
	}
	r.Now = time.UnixMilli(now)
	if n > 0 {
		r.Changes = make([]Transition, n)
	}
	for i := range r.Changes {
		at := 5 + 3*i
		var errs [3]error
		c := &r.Changes[i]
		c.From, errs[0] = replyString(vals[at], "change's from")
		c.To, errs[1] = replyString(vals[at+1], "change's to")
		c.Why, errs[2] = replyString(vals[at+2], "change's why")
		for _, err := range errs {
			if err != nil {
				return BreakerReply{}, nil, err
			}
		}
	}
	r.From = r.State
	if n > 0 {
		r.From = r.Changes[0].From
	}
	return r, vals[5+3*n:], nil
}

func replyString(v any, what string) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("unexpected reply: %s %v is not a string", what, v)
	}
	return s, nil
}

func replyInt(v any, what string) (int64, error) {
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("unexpected reply: %s %v is not an integer", what, v)
	}
	return n, nil
}

// ReportArgs are a process's calls since its last report.
type ReportArgs struct {
	// Calls counts every call, Failures those that failed and Slow those
	// that took too long (part of Calls too).
	Calls, Failures, Slow int64
	// Suspect is a job whose failure is among them, remembered so that a
	// trip gives it back; the zero Member for none.
	Suspect Member
}

// ReportReply is the breaker after a report.
type ReportReply struct {
	BreakerReply
	// Suspects, when this report tripped the breaker, are the jobs whose
	// failures in the window tripped it (at most 5,000, the latest); a
	// stored member that does not parse is left out.
	Suspects []Member
}

// Report adds calls to the breaker's window and trips it when the failures
// pass the ratio (lua/breaker_report.lua). Counts are dropped unless the
// breaker is closed and not forced closed. It also moves an open breaker
// whose cool-down is over to half-open: every process reports each tick.
func (b *Breaker) Report(ctx context.Context, a ReportArgs) (ReportReply, error) {
	extra := []any{a.Calls, a.Failures, a.Slow}
	if a.Suspect != (Member{}) {
		extra = append(extra, a.Suspect.String())
	}
	r, rest, err := b.run(ctx, "report", breakerReportScript, extra...)
	if err != nil {
		return ReportReply{}, err
	}
	out := ReportReply{BreakerReply: r}
	for _, v := range rest {
		s, err := replyString(v, "suspect")
		if err != nil {
			return ReportReply{}, fmt.Errorf("breaker of pool %q: report: %w", b.pool, err)
		}
		if m, ok := ParseMember(s); ok {
			out.Suspects = append(out.Suspects, m)
		}
	}
	return out, nil
}

// Verdict is what the breaker says of a job about to start.
type Verdict string

// Verdicts.
const (
	// VerdictRun: the breaker is closed, the job runs.
	VerdictRun Verdict = "run"
	// VerdictProbe: half-open, and the job is one of the probes.
	VerdictProbe Verdict = "probe"
	// VerdictWait: open, or half-open with every probe place taken; the
	// job goes back to its queue.
	VerdictWait Verdict = "wait"
)

// Admit asks whether job may start (lua/breaker_admit.lua); a probe takes
// a place, leased for ProbeTTL, and the pool's queues are paused when the
// last place is taken.
func (b *Breaker) Admit(ctx context.Context, job Member) (BreakerReply, Verdict, error) {
	r, rest, err := b.run(ctx, "admit", breakerAdmitScript, job.String())
	if err != nil {
		return BreakerReply{}, "", err
	}
	if len(rest) != 1 {
		return BreakerReply{}, "", fmt.Errorf("breaker of pool %q: admit: unexpected reply: %d values after the state, want the verdict", b.pool, len(rest))
	}
	s, err := replyString(rest[0], "verdict")
	if err != nil {
		return BreakerReply{}, "", fmt.Errorf("breaker of pool %q: admit: %w", b.pool, err)
	}
	switch v := Verdict(s); v {
	case VerdictRun, VerdictProbe, VerdictWait:
		return r, v, nil
	}
	return BreakerReply{}, "", fmt.Errorf("breaker of pool %q: admit: unexpected verdict %q", b.pool, s)
}

// ProbeOutcome is how a probe ended.
type ProbeOutcome string

// Probe outcomes.
const (
	// ProbeOK: it succeeded in time.
	ProbeOK ProbeOutcome = "ok"
	// ProbeFail: it failed, or was slow; the breaker opens again.
	ProbeFail ProbeOutcome = "fail"
	// ProbeNone: its outcome says nothing of the dependency; its place goes
	// to another job.
	ProbeNone ProbeOutcome = "none"
)

// ProbeDone reports the end of probe job (lua/breaker_done.lua): all
// probes succeeded closes the breaker, a failed one opens it again. A
// probe that no longer holds a place (its lease lapsed, or the state it
// probed is over) changes nothing.
func (b *Breaker) ProbeDone(ctx context.Context, job Member, outcome ProbeOutcome) (BreakerReply, error) {
	switch outcome {
	case ProbeOK, ProbeFail, ProbeNone:
	default:
		return BreakerReply{}, fmt.Errorf("breaker of pool %q: probe done: outcome must be %q, %q or %q, got %q", b.pool, ProbeOK, ProbeFail, ProbeNone, outcome)
	}
	r, _, err := b.run(ctx, "probe done", breakerDoneScript, job.String(), string(outcome))
	return r, err
}

// RenewProbes extends the leases of probes a process runs
// (lua/breaker_renew.lua); a probe that already ended is not brought back.
func (b *Breaker) RenewProbes(ctx context.Context, probes []Member) (BreakerReply, error) {
	extra := make([]any, len(probes))
	for i, m := range probes {
		extra[i] = m.String()
	}
	r, _, err := b.run(ctx, "renew probes", breakerRenewScript, extra...)
	return r, err
}

// Action is an operator's command to a breaker.
type Action string

// Actions.
const (
	// ForceOpen opens it until a close or reset.
	ForceOpen Action = "open"
	// ForceClose closes it; it does not trip until a reset.
	ForceClose Action = "close"
	// Reset closes it and makes it count afresh.
	Reset Action = "reset"
)

// Force applies an operator's action (lua/breaker_force.lua).
func (b *Breaker) Force(ctx context.Context, action Action) (BreakerReply, error) {
	switch action {
	case ForceOpen, ForceClose, Reset:
	default:
		return BreakerReply{}, fmt.Errorf("breaker of pool %q: force: action must be %q, %q or %q, got %q", b.pool, ForceOpen, ForceClose, Reset, action)
	}
	r, _, err := b.run(ctx, "force "+string(action), breakerForceScript, string(action))
	return r, err
}

// BreakerRecord is a breaker as Redis holds it, read at one instant.
type BreakerRecord struct {
	// Now is Redis's clock at the read.
	Now time.Time
	// State is "closed" (also when never set), "open" or "half-open";
	// Forced "open" or "closed" while an operator holds it so, or "".
	State, Forced string
	// Since is when it entered State (zero if it never left its first
	// closed state); Why what moved it there.
	Since time.Time
	Why   string
	// Until is when an open breaker's cool-down ends; zero when none was
	// set, or it stays open until an operator acts (UntilOperator).
	Until         time.Time
	UntilOperator bool
	// CoolDown is the cool-down of the last opening; Trips the openings
	// in a row without a close.
	CoolDown time.Duration
	Trips    int
	// Calls, Failures and Slow drove the last change of state.
	Calls, Failures, Slow int
	// ProbesSucceeded and ProbesRunning count a half-open breaker's probes
	// (ProbesRunning is 0 in other states).
	ProbesSucceeded, ProbesRunning int
	// WindowCalls, WindowFailures and WindowSlow are counted now, over the
	// window.
	WindowCalls, WindowFailures, WindowSlow int
}

// Read reads the breaker in one script (lua/breaker_read.lua), which
// writes nothing.
func (b *Breaker) Read(ctx context.Context) (BreakerRecord, error) {
	v, err := breakerReadScript.Run(ctx, b.rc, b.keys, b.args...).Result()
	if err == nil {
		var rec BreakerRecord
		if rec, err = parseBreakerRecord(v); err == nil {
			return rec, nil
		}
	}
	return BreakerRecord{}, fmt.Errorf("breaker of pool %q: read: %w", b.pool, err)
}

// parseBreakerRecord reads {now, state, state hash, probes running, window
// calls, failures, slow calls}.
func parseBreakerRecord(v any) (BreakerRecord, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) != 7 {
		return BreakerRecord{}, fmt.Errorf("unexpected reply %v", v)
	}
	state, err := replyString(vals[1], "state")
	if err != nil {
		return BreakerRecord{}, err
	}
	hash, ok := vals[2].([]any)
	if !ok || len(hash)%2 != 0 {
		return BreakerRecord{}, fmt.Errorf("unexpected reply: state hash %v", vals[2])
	}
	var ints [5]int64
	for i, at := range []int{0, 3, 4, 5, 6} {
		what := [...]string{"clock", "probes running", "window calls", "window failures", "window slow calls"}[i]
		if ints[i], err = replyInt(vals[at], what); err != nil {
			return BreakerRecord{}, err
		}
	}
	h := make(map[string]string, len(hash)/2)
	for i := 0; i < len(hash); i += 2 {
		k, err1 := replyString(hash[i], "state field")
		v, err2 := replyString(hash[i+1], "state value")
		if err1 != nil || err2 != nil {
			return BreakerRecord{}, fmt.Errorf("unexpected reply: state hash %v", hash)
		}
		h[k] = v
	}
	// A number the engine did not write reads as 0, as Redis's own
	// counters do.
	num := func(f string) int64 { n, _ := strconv.ParseInt(h[f], 10, 64); return n }
	ms := func(n int64) time.Time {
		if n <= 0 {
			return time.Time{}
		}
		return time.UnixMilli(n)
	}
	return BreakerRecord{
		Now: time.UnixMilli(ints[0]), State: state, Forced: h["forced"],
		Since: ms(num("since")), Why: h["why"],
		Until: ms(num("until")), UntilOperator: num("until") < 0,
		CoolDown: time.Duration(num("cool_down")) * time.Millisecond, Trips: int(num("trips")),
		Calls: int(num("calls")), Failures: int(num("failures")), Slow: int(num("slow")),
		ProbesSucceeded: int(num("probes_ok")), ProbesRunning: int(ints[1]),
		WindowCalls: int(ints[2]), WindowFailures: int(ints[3]), WindowSlow: int(ints[4]),
	}, nil
}

// Refund gives back one counted failure of each of jobs, whose failures
// the breaker puts down to an outage, and brings its retry forward to now
// (lua/breaker_refund.lua). late remembers a job whose retry asynq has not
// written yet in the pool's late set, for BringLateForward; without it
// such a job keeps its own backoff. Every job must be one of the pool's.
func (b *Breaker) Refund(ctx context.Context, jobs []Member, late bool) error {
	if len(jobs) == 0 {
		return nil
	}
	n := len(jobs)
	keys := make([]string, 2*n+1)
	args := make([]any, 2+2*n)
	args[0], args[1] = n, "0"
	if late {
		args[1] = "1"
	}
	for i, m := range jobs {
		keys[i] = b.ks.FailureCountKey(m.Queue, m.ID)
		keys[n+i] = retryKey(m.Queue)
		args[2+i], args[2+n+i] = m.ID, m.String()
	}
	keys[2*n] = b.late[0]
	if err := breakerRefundScript.Run(ctx, b.rc, keys, args...).Err(); err != nil {
		return fmt.Errorf("breaker of pool %q: give back %d failures: %w", b.pool, n, err)
	}
	return nil
}

// BringLateForward brings forward the retry of each job in the pool's late
// set once asynq has written it, and drops entries older than maxAge
// (lua/breaker_late.lua). It returns how many it brought forward; with an
// empty late set it costs one read.
func (b *Breaker) BringLateForward(ctx context.Context, maxAge time.Duration) (int, error) {
	args := make([]any, 0, 1+len(b.queues))
	args = append(append(args, maxAge.Milliseconds()), b.queues...)
	n, err := breakerLateScript.Run(ctx, b.rc, b.late, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("breaker of pool %q: bring late retries forward: %w", b.pool, err)
	}
	return int(n), nil
}

// Clear removes the breaker's state (every key of it) and lifts the pauses
// it set on the pool's queues, an operator's and the gate's staying
// (lua/breaker_clear.lua): for a pool that runs without a breaker now.
// It returns how many pauses it lifted.
func (b *Breaker) Clear(ctx context.Context) (int, error) {
	keys := make([]string, 0, 6+len(b.keys)-4)
	keys = append(append(keys, b.keys[:4]...), b.late[0], b.ks.breakerCountedKey(b.pool))
	keys = append(keys, b.keys[4:]...)
	n, err := breakerClearScript.Run(ctx, b.rc, keys, BreakerPause).Int64()
	if err != nil {
		return 0, fmt.Errorf("breaker of pool %q: clear: %w", b.pool, err)
	}
	return int(n), nil
}
