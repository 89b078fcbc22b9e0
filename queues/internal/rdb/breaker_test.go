package rdb

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// testBreakerSettings are the settings of the breakers in these cases.
var testBreakerSettings = BreakerSettings{
	FailureRatio: 0.5, MinCalls: 4, Window: 10 * time.Second,
	CoolDown: 2 * time.Second, MaxCoolDown: 5 * time.Second, Probes: 2, ProbeTTL: 5 * time.Second,
}

// breakerCase is a breaker of pool "p" with tiers "hi" and "lo" on a case's
// Redis, and its keys.
type breakerCase struct {
	t                               *testing.T
	b                               backend
	br                              *Breaker
	queues                          []string
	state, window, suspects, probes string
	ctx                             context.Context
}

func newBreakerCase(t *testing.T, b backend) *breakerCase {
	t.Helper()
	queues := []string{b.KS.Queue("p", "hi"), b.KS.Queue("p", "lo")}
	c := &breakerCase{t: t, b: b, queues: queues, ctx: context.Background(),
		br: NewBreaker(b.RC, b.KS, "p", queues, testBreakerSettings)}
	c.state, c.window, c.suspects, c.probes = b.KS.BreakerKeys("p")
	return c
}

// job is a job of the pool's first queue.
func (c *breakerCase) job(id string) Member { return Member{ID: id, Queue: c.queues[0]} }

// now is Redis's clock.
func (c *breakerCase) now() time.Time {
	c.t.Helper()
	now, err := c.b.RC.Time(c.ctx).Result()
	require.NoError(c.t, err)
	return now
}

func (c *breakerCase) hash() map[string]string {
	c.t.Helper()
	h, err := c.b.RC.HGetAll(c.ctx, c.state).Result()
	require.NoError(c.t, err)
	return h
}

func (c *breakerCase) set(fields ...any) {
	c.t.Helper()
	require.NoError(c.t, c.b.RC.HSet(c.ctx, c.state, fields...).Err())
}

// pauses returns each queue's pause value ("" when not paused).
func (c *breakerCase) pauses() []string {
	c.t.Helper()
	var out []string
	for _, q := range c.queues {
		v, err := c.b.RC.Get(c.ctx, PausedKey(q)).Result()
		if errors.Is(err, redis.Nil) {
			v = ""
		} else {
			require.NoError(c.t, err)
		}
		out = append(out, v)
	}
	return out
}

func (c *breakerCase) zset(key string) []redis.Z {
	c.t.Helper()
	z, err := c.b.RC.ZRangeWithScores(c.ctx, key, 0, -1).Result()
	require.NoError(c.t, err)
	return z
}

func (c *breakerCase) exists(keys ...string) int64 {
	c.t.Helper()
	var n int64
	for _, k := range keys { // one at a time: on a cluster keys of several slots
		v, err := c.b.RC.Exists(c.ctx, k).Result()
		require.NoError(c.t, err)
		n += v
	}
	return n
}

// reply checks that got was made by Redis's clock now, and returns it
// without its clock, to compare.
func (c *breakerCase) reply(got BreakerReply) BreakerReply {
	c.t.Helper()
	require.WithinDuration(c.t, c.now(), got.Now, 2*time.Second, "the script's clock is Redis's")
	got.Now = time.Time{}
	return got
}

// change is one change of state.
func change(from, to, why string) []Transition { return []Transition{{From: from, To: to, Why: why}} }

// trip opens the breaker the way four failed calls do.
func (c *breakerCase) trip() ReportReply {
	c.t.Helper()
	r, err := c.br.Report(c.ctx, ReportArgs{Calls: 4, Failures: 4, Suspect: c.job("a")})
	require.NoError(c.t, err)
	require.Equal(c.t, "open", r.State)
	return r
}

// within says that got is want give or take a second (Redis's clock moved
// between the script and the test's look).
func within(t *testing.T, want, got time.Duration) {
	t.Helper()
	require.InDelta(t, want.Seconds(), got.Seconds(), 1, "want %s, got %s", want, got)
}

func init() {
	scriptCases = append(scriptCases,
		scriptCase{script: "breaker_report", name: "counts calls in the window while closed", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			r, err := c.br.Report(c.ctx, ReportArgs{Calls: 3, Failures: 1, Suspect: c.job("a")})
			require.NoError(t, err)
			require.Equal(t, BreakerReply{State: "closed", From: "closed"}, c.reply(r.BreakerReply))
			require.Empty(t, r.Suspects)
			require.False(t, r.Changed())
			rec, err := c.br.Read(c.ctx)
			require.NoError(t, err)
			require.Equal(t, []int{3, 1, 0}, []int{rec.WindowCalls, rec.WindowFailures, rec.WindowSlow})
			z := c.zset(c.suspects)
			require.Len(t, z, 1)
			require.Equal(t, "a@"+c.queues[0], z[0].Member, "the failed job is remembered")
			require.Equal(t, []string{"", ""}, c.pauses())
			// A report without a suspect adds none; 2 of 5 calls failed or
			// were slow: below the ratio.
			r, err = c.br.Report(c.ctx, ReportArgs{Calls: 2, Slow: 1})
			require.NoError(t, err)
			require.Equal(t, "closed", r.State)
			require.Len(t, c.zset(c.suspects), 1)
			rec, err = c.br.Read(c.ctx)
			require.NoError(t, err)
			require.Equal(t, []int{5, 1, 1}, []int{rec.WindowCalls, rec.WindowFailures, rec.WindowSlow})
		}},
		scriptCase{script: "breaker_report", name: "trips at the ratio, pauses the queues and returns the suspects", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			// An operator's pause keeps its value; the gate's is taken over.
			require.NoError(t, b.RC.Set(c.ctx, PausedKey(c.queues[1]), GatePause, 0).Err())
			r, err := c.br.Report(c.ctx, ReportArgs{Calls: 2, Failures: 1, Suspect: c.job("a")})
			require.NoError(t, err)
			require.Equal(t, "closed", r.State, "2 calls: fewer than min_calls")
			r, err = c.br.Report(c.ctx, ReportArgs{Calls: 2, Failures: 1, Suspect: Member{ID: "b@x", Queue: c.queues[1]}})
			require.NoError(t, err)
			why := "2 of 4 calls failed (2 errors, 0 slow) in the window, ratio 0.50 >= 0.50"
			within(t, testBreakerSettings.CoolDown, r.CoolDownLeft)
			require.Equal(t, BreakerReply{State: "open", From: "closed", Why: why, CoolDownLeft: r.CoolDownLeft,
				Changes: change("closed", "open", why)}, c.reply(r.BreakerReply))
			require.True(t, r.Changed())
			require.Equal(t, []Member{c.job("a"), {ID: "b@x", Queue: c.queues[1]}}, r.Suspects, "an ID holding '@' comes back whole")
			require.Equal(t, []string{BreakerPause, BreakerPause}, c.pauses())
			h := c.hash()
			require.Equal(t, "open", h["state"])
			require.Equal(t, []string{"4", "2", "0", "1"}, []string{h["calls"], h["failures"], h["slow"], h["trips"]})
			require.Zero(t, c.exists(c.window, c.suspects), "the window starts afresh")
		}},
		scriptCase{script: "breaker_report", name: "skips a suspect that does not parse", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			require.NoError(t, b.RC.ZAdd(c.ctx, c.suspects, redis.Z{Score: float64(c.now().UnixMilli()), Member: "no-queue"}).Err())
			r := c.trip()
			require.Equal(t, []Member{c.job("a")}, r.Suspects)
		}},
		scriptCase{script: "breaker_report", name: "drops counts unless closed and not forced closed", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			c.trip()
			r, err := c.br.Report(c.ctx, ReportArgs{Calls: 9, Failures: 9, Suspect: c.job("z")})
			require.NoError(t, err)
			require.Equal(t, BreakerReply{State: "open", From: "open", Why: r.Why, CoolDownLeft: r.CoolDownLeft}, c.reply(r.BreakerReply), "no change")
			require.Empty(t, r.Suspects)
			require.Zero(t, c.exists(c.window, c.suspects))

			_, err = c.br.Force(c.ctx, ForceClose)
			require.NoError(t, err)
			r, err = c.br.Report(c.ctx, ReportArgs{Calls: 9, Failures: 9, Suspect: c.job("z")})
			require.NoError(t, err)
			require.Equal(t, "closed", r.State, "forced closed: it does not trip")
			require.Zero(t, c.exists(c.window, c.suspects))
		}},
		scriptCase{script: "breaker_report", name: "moves an open breaker whose cool-down is over to half-open", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			c.trip()
			c.set("until", 1)
			r, err := c.br.Report(c.ctx, ReportArgs{})
			require.NoError(t, err)
			require.Equal(t, BreakerReply{State: "half-open", From: "open", Why: "cool-down over",
				Changes: change("open", "half-open", "cool-down over")}, c.reply(r.BreakerReply))
			require.Empty(t, r.Suspects)
			require.Equal(t, []string{"", ""}, c.pauses(), "half-open: the pauses lift for the probes")
			require.Equal(t, "half-open", c.hash()["state"])
		}},

		scriptCase{script: "breaker_admit", name: "closed: run, nothing written", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			r, v, err := c.br.Admit(c.ctx, c.job("a"))
			require.NoError(t, err)
			require.Equal(t, VerdictRun, v)
			require.Equal(t, BreakerReply{State: "closed", From: "closed"}, c.reply(r))
			require.Zero(t, c.exists(c.state, c.probes))
			require.Equal(t, []string{"", ""}, c.pauses())
		}},
		scriptCase{script: "breaker_admit", name: "open: wait, the queues stay paused", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			c.trip()
			require.NoError(t, b.RC.Del(c.ctx, PausedKey(c.queues[0])).Err(), "a pause lost (asynq's tools)")
			r, v, err := c.br.Admit(c.ctx, c.job("x"))
			require.NoError(t, err)
			require.Equal(t, VerdictWait, v)
			require.Equal(t, "open", r.State)
			require.Equal(t, []string{BreakerPause, BreakerPause}, c.pauses(), "paused again")
			require.Zero(t, c.exists(c.probes))
		}},
		scriptCase{script: "breaker_admit", name: "half-open: probes up to the limit, then wait and paused", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			c.set("state", "half-open", "probes_ok", 0)
			before := c.now()
			var got []Verdict
			for _, id := range []string{"a", "b", "c"} {
				r, v, err := c.br.Admit(c.ctx, c.job(id))
				require.NoError(t, err)
				require.Equal(t, "half-open", r.State)
				got = append(got, v)
			}
			require.Equal(t, []Verdict{VerdictProbe, VerdictProbe, VerdictWait}, got)
			z := c.zset(c.probes)
			require.Len(t, z, 2)
			require.Equal(t, []any{"a@" + c.queues[0], "b@" + c.queues[0]}, []any{z[0].Member, z[1].Member})
			lease := time.UnixMilli(int64(z[0].Score)).Sub(before)
			within(t, testBreakerSettings.ProbeTTL, lease)
			require.Equal(t, []string{BreakerPause, BreakerPause}, c.pauses(), "every place taken: paused")
		}},

		scriptCase{script: "breaker_done", name: "the last probe that succeeds closes it", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			c.set("state", "half-open", "probes_ok", 0, "trips", 3)
			for _, id := range []string{"a", "b"} {
				_, v, err := c.br.Admit(c.ctx, c.job(id))
				require.NoError(t, err)
				require.Equal(t, VerdictProbe, v)
			}
			r, err := c.br.ProbeDone(c.ctx, c.job("a"), ProbeOK)
			require.NoError(t, err)
			require.Equal(t, BreakerReply{State: "half-open", From: "half-open"}, BreakerReply{State: r.State, From: r.From})
			require.Equal(t, "1", c.hash()["probes_ok"])
			r, err = c.br.ProbeDone(c.ctx, c.job("b"), ProbeOK)
			require.NoError(t, err)
			require.Equal(t, BreakerReply{State: "closed", From: "half-open", Why: "2 of 2 probes succeeded",
				Changes: change("half-open", "closed", "2 of 2 probes succeeded")}, c.reply(r))
			h := c.hash()
			require.Equal(t, []string{"closed", "0", "2", "0"}, []string{h["state"], h["trips"], h["calls"], h["failures"]})
			require.Zero(t, c.exists(c.probes))
			require.Equal(t, []string{"", ""}, c.pauses())
		}},
		scriptCase{script: "breaker_done", name: "a failed probe opens it again, its cool-down doubled up to the cap", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			c.set("trips", 1) // the trip that opened it first
			for _, want := range []time.Duration{4 * time.Second, 5 * time.Second} {
				c.set("state", "half-open", "probes_ok", 0)
				_, v, err := c.br.Admit(c.ctx, c.job("a"))
				require.NoError(t, err)
				require.Equal(t, VerdictProbe, v)
				r, err := c.br.ProbeDone(c.ctx, c.job("a"), ProbeFail)
				require.NoError(t, err)
				why := "a probe failed (0 of 2 had succeeded)"
				within(t, want, r.CoolDownLeft)
				require.Equal(t, BreakerReply{State: "open", From: "half-open", Why: why, CoolDownLeft: r.CoolDownLeft,
					Changes: change("half-open", "open", why)}, c.reply(r))
				require.Equal(t, strconv.FormatInt(want.Milliseconds(), 10), c.hash()["cool_down"])
				require.Equal(t, []string{BreakerPause, BreakerPause}, c.pauses())
			}
			require.Equal(t, "3", c.hash()["trips"])
		}},
		scriptCase{script: "breaker_done", name: "a probe with no verdict frees its place; one without a place changes nothing", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			c.set("state", "half-open", "probes_ok", 0)
			for _, id := range []string{"a", "b"} {
				_, _, err := c.br.Admit(c.ctx, c.job(id))
				require.NoError(t, err)
			}
			require.Equal(t, []string{BreakerPause, BreakerPause}, c.pauses())
			r, err := c.br.ProbeDone(c.ctx, c.job("a"), ProbeNone)
			require.NoError(t, err)
			require.Equal(t, BreakerReply{State: "half-open", From: "half-open", Why: ""}, BreakerReply{State: r.State, From: r.From})
			require.Len(t, c.zset(c.probes), 1)
			require.Equal(t, []string{"", ""}, c.pauses(), "a place is free: the pauses lift")
			// A job that holds no place (it never was a probe) cannot
			// close or open it.
			r, err = c.br.ProbeDone(c.ctx, c.job("stranger"), ProbeFail)
			require.NoError(t, err)
			require.Equal(t, "half-open", r.State)
			require.False(t, r.Changed())
			require.Len(t, c.zset(c.probes), 1)
		}},
		scriptCase{script: "breaker_done", name: "a probe that outlived its half-open state makes two changes", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			one := testBreakerSettings
			one.Probes = 1
			c.br = NewBreaker(b.RC, b.KS, "p", c.queues, one)
			for _, tc := range []struct {
				outcome ProbeOutcome
				to, why string
			}{
				{ProbeOK, "closed", "1 of 1 probes succeeded"},
				{ProbeFail, "open", "a probe failed (0 of 1 had succeeded)"},
			} {
				c.set("state", "half-open", "probes_ok", 0, "trips", 1)
				_, v, err := c.br.Admit(c.ctx, c.job("long"))
				require.NoError(t, err)
				require.Equal(t, VerdictProbe, v)
				// Another probe failed meanwhile and the breaker reopened;
				// its cool-down is over, and nobody looked yet.
				c.set("state", "open", "until", 1)
				r, err := c.br.ProbeDone(c.ctx, c.job("long"), tc.outcome)
				require.NoError(t, err)
				require.Equal(t, []Transition{{From: "open", To: "half-open", Why: "cool-down over"}, {From: "half-open", To: tc.to, Why: tc.why}}, r.Changes,
					"both changes, in order: the half-open state is not hidden")
				require.Equal(t, "open", r.From)
				require.Equal(t, tc.to, r.State)
				require.Equal(t, tc.to, c.hash()["state"])
			}
		}},
		scriptCase{script: "breaker_done", name: "an unknown outcome is refused before Redis", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			c.set("state", "half-open", "probes_ok", 0)
			_, _, err := c.br.Admit(c.ctx, c.job("a"))
			require.NoError(t, err)
			_, err = c.br.ProbeDone(c.ctx, c.job("a"), "maybe")
			require.EqualError(t, err, `breaker of pool "p": probe done: outcome must be "ok", "fail" or "none", got "maybe"`)
			require.Len(t, c.zset(c.probes), 1, "nothing changed")
		}},

		scriptCase{script: "breaker_force", name: "open holds it open until an operator acts", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			r, err := c.br.Force(c.ctx, ForceOpen)
			require.NoError(t, err)
			require.Equal(t, BreakerReply{State: "open", From: "closed", Why: "forced open by an operator", CoolDownLeft: -1,
				Changes: change("closed", "open", "forced open by an operator")}, c.reply(r))
			require.Equal(t, []string{BreakerPause, BreakerPause}, c.pauses())
			h := c.hash()
			require.Equal(t, []string{"open", "open", "-1"}, []string{h["state"], h["forced"], h["until"]})
			// Its cool-down never ends.
			r2, err := c.br.Report(c.ctx, ReportArgs{})
			require.NoError(t, err)
			require.Equal(t, "open", r2.State)
			rec, err := c.br.Read(c.ctx)
			require.NoError(t, err)
			require.True(t, rec.UntilOperator)
			require.True(t, rec.Until.IsZero())
		}},
		scriptCase{script: "breaker_force", name: "close lifts only the breaker's pauses and keeps it from tripping", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			c.trip()
			require.NoError(t, b.RC.Set(c.ctx, PausedKey(c.queues[1]), "1700000000", 0).Err(), "an operator's pause")
			r, err := c.br.Force(c.ctx, ForceClose)
			require.NoError(t, err)
			require.Equal(t, BreakerReply{State: "closed", From: "open", Why: "forced closed by an operator",
				Changes: change("open", "closed", "forced closed by an operator")}, c.reply(r))
			require.Equal(t, []string{"", "1700000000"}, c.pauses())
			h := c.hash()
			require.Equal(t, []string{"closed", "closed", "0", "0"}, []string{h["state"], h["forced"], h["trips"], h["calls"]})
		}},
		scriptCase{script: "breaker_force", name: "reset closes it and counts afresh", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			_, err := c.br.Force(c.ctx, ForceOpen)
			require.NoError(t, err)
			r, err := c.br.Force(c.ctx, Reset)
			require.NoError(t, err)
			require.Equal(t, BreakerReply{State: "closed", From: "open", Why: "reset by an operator",
				Changes: change("open", "closed", "reset by an operator")}, c.reply(r))
			_, forced := c.hash()["forced"]
			require.False(t, forced)
			require.Equal(t, []string{"", ""}, c.pauses())
			require.Equal(t, "open", c.trip().State, "it trips again")
		}},
		scriptCase{script: "breaker_force", name: "an unknown action is refused before Redis", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			_, err := c.br.Force(c.ctx, "sideways")
			require.EqualError(t, err, `breaker of pool "p": force: action must be "open", "close" or "reset", got "sideways"`)
			require.Zero(t, c.exists(c.state), "nothing written (the script would have reset it)")
		}},

		scriptCase{script: "breaker_renew", name: "extends running probes, never brings back an ended one", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			c.set("state", "half-open", "probes_ok", 0)
			_, _, err := c.br.Admit(c.ctx, c.job("a"))
			require.NoError(t, err)
			require.NoError(t, b.RC.ZAdd(c.ctx, c.probes, redis.Z{Score: 1, Member: "a@" + c.queues[0]}).Err(), "its lease set back")
			before := c.now()
			r, err := c.br.RenewProbes(c.ctx, []Member{c.job("a"), c.job("ended")})
			require.NoError(t, err)
			require.Equal(t, BreakerReply{State: "half-open", From: "half-open"}, c.reply(r))
			z := c.zset(c.probes)
			require.Len(t, z, 1, "the ended probe is not brought back")
			within(t, testBreakerSettings.ProbeTTL, time.UnixMilli(int64(z[0].Score)).Sub(before))
		}},

		scriptCase{script: "breaker_read", name: "a breaker never used reads closed and empty", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			before := c.now()
			rec, err := c.br.Read(c.ctx)
			require.NoError(t, err)
			require.WithinDuration(t, before, rec.Now, 2*time.Second, "Redis's clock")
			rec.Now = time.Time{}
			require.Equal(t, BreakerRecord{State: "closed"}, rec)
			require.Zero(t, c.exists(c.state, c.window, c.probes))
		}},
		scriptCase{script: "breaker_read", name: "reads state, probes and window in one look and writes nothing", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			now := c.now().UnixMilli()
			bucket := testBreakerSettings.Window.Milliseconds() / 10
			cur := now / bucket
			// The script's clock may be a bucket later than this one.
			old := strconv.FormatInt(cur-11, 10)
			require.NoError(t, b.RC.HSet(c.ctx, c.window,
				strconv.FormatInt(cur, 10)+":c", 5, strconv.FormatInt(cur-8, 10)+":c", 2,
				strconv.FormatInt(cur, 10)+":f", 3, strconv.FormatInt(cur, 10)+":s", 1,
				old+":c", 100, old+":f", 100).Err())
			c.set("state", "half-open", "since", now-1000, "why", "cool-down over", "until", now-1000,
				"cool_down", 4000, "trips", 2, "probes_ok", 1, "calls", 3, "failures", 1, "slow", 0)
			require.NoError(t, b.RC.ZAdd(c.ctx, c.probes, redis.Z{Score: float64(now + 60000), Member: "a@" + c.queues[0]},
				redis.Z{Score: 1, Member: "lapsed@" + c.queues[0]}).Err())
			rec, err := c.br.Read(c.ctx)
			require.NoError(t, err)
			require.Equal(t, BreakerRecord{
				Now: rec.Now, State: "half-open", Since: time.UnixMilli(now - 1000), Why: "cool-down over",
				Until: time.UnixMilli(now - 1000), CoolDown: 4 * time.Second, Trips: 2,
				Calls: 3, Failures: 1, ProbesSucceeded: 1, ProbesRunning: 1,
				WindowCalls: 7, WindowFailures: 3, WindowSlow: 1,
			}, rec, "the lapsed probe and the bucket out of the window do not count")
			n, err := b.RC.HLen(c.ctx, c.window).Result()
			require.NoError(t, err)
			require.EqualValues(t, 6, n, "the old bucket is still there: a read writes nothing")
			require.Len(t, c.zset(c.probes), 2)
		}},

		scriptCase{script: "breaker_refund", name: "gives back one failure and brings the retry forward", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			twice, once, none := c.job("twice"), Member{ID: "once", Queue: c.queues[1]}, c.job("none")
			require.NoError(t, b.RC.Set(c.ctx, b.KS.FailureCountKey(twice.Queue, twice.ID), 2, time.Hour).Err())
			require.NoError(t, b.RC.Set(c.ctx, b.KS.FailureCountKey(once.Queue, once.ID), 1, time.Hour).Err())
			later := float64(c.now().Add(time.Hour).Unix())
			require.NoError(t, b.RC.ZAdd(c.ctx, retryKey(twice.Queue), redis.Z{Score: later, Member: "twice"}).Err())
			require.NoError(t, b.RC.ZAdd(c.ctx, retryKey(once.Queue), redis.Z{Score: later, Member: "once"}).Err())
			before := c.now()
			require.NoError(t, c.br.Refund(c.ctx, []Member{twice, once, none}, true))
			require.Equal(t, "1", b.RC.Get(c.ctx, b.KS.FailureCountKey(twice.Queue, twice.ID)).Val())
			require.Zero(t, c.exists(b.KS.FailureCountKey(once.Queue, once.ID), b.KS.FailureCountKey(none.Queue, none.ID)), "a count never goes below zero")
			for _, m := range []Member{twice, once} {
				score, err := b.RC.ZScore(c.ctx, retryKey(m.Queue), m.ID).Result()
				require.NoError(t, err)
				require.InDelta(t, float64(before.Unix()), score, 2, "retry of %s brought forward to now", m)
			}
			late := c.zset(b.KS.BreakerLateKey("p"))
			require.Len(t, late, 1, "the job whose retry asynq has not written yet is remembered")
			require.Equal(t, none.String(), late[0].Member)
			ttl, err := b.RC.PTTL(c.ctx, b.KS.BreakerLateKey("p")).Result()
			require.NoError(t, err)
			require.Greater(t, ttl, 50*time.Second)
		}},
		scriptCase{script: "breaker_refund", name: "without late, a job not in its retry set is not remembered", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			require.NoError(t, c.br.Refund(c.ctx, []Member{c.job("none")}, false))
			require.Zero(t, c.exists(b.KS.BreakerLateKey("p")))
			require.NoError(t, c.br.Refund(c.ctx, nil, true), "no jobs: no call")
		}},

		scriptCase{script: "breaker_late", name: "brings written retries forward, keeps young entries, drops old ones", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			lateKey := b.KS.BreakerLateKey("p")
			now := c.now()
			written, young, old := c.job("written"), Member{ID: "young", Queue: c.queues[1]}, c.job("old")
			foreign := Member{ID: "foreign", Queue: b.KS.Queue("p", "gone")}
			require.NoError(t, b.RC.ZAdd(c.ctx, lateKey,
				redis.Z{Score: float64(now.UnixMilli()), Member: written.String()},
				redis.Z{Score: float64(now.UnixMilli()), Member: young.String()},
				redis.Z{Score: float64(now.Add(-time.Minute).UnixMilli()), Member: old.String()},
				redis.Z{Score: float64(now.UnixMilli()), Member: foreign.String()}).Err())
			require.NoError(t, b.RC.ZAdd(c.ctx, retryKey(written.Queue), redis.Z{Score: float64(now.Add(time.Hour).Unix()), Member: "written"}).Err())
			n, err := c.br.BringLateForward(c.ctx, 30*time.Second)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			score, err := b.RC.ZScore(c.ctx, retryKey(written.Queue), "written").Result()
			require.NoError(t, err)
			require.InDelta(t, float64(now.Unix()), score, 2)
			var left []any
			for _, z := range c.zset(lateKey) {
				left = append(left, z.Member)
			}
			require.Equal(t, []any{young.String()}, left, "a queue no longer the pool's, and entries past the age, are dropped")
			n, err = c.br.BringLateForward(c.ctx, 30*time.Second)
			require.NoError(t, err)
			require.Zero(t, n)
		}},

		scriptCase{script: "breaker_clear", name: "removes the state and lifts only the breaker's pauses", run: func(t *testing.T, b backend) {
			c := newBreakerCase(t, b)
			c.trip()
			require.NoError(t, b.RC.Set(c.ctx, PausedKey(c.queues[1]), GatePause, 0).Err())
			require.NoError(t, b.RC.ZAdd(c.ctx, b.KS.BreakerLateKey("p"), redis.Z{Score: 1, Member: "x@" + c.queues[0]}).Err())
			require.NoError(t, b.RC.ZAdd(c.ctx, b.KS.breakerCountedKey("p"), redis.Z{Score: 1, Member: "x@" + c.queues[0]}).Err())
			require.NoError(t, b.RC.ZAdd(c.ctx, c.probes, redis.Z{Score: 1, Member: "x@" + c.queues[0]}).Err())
			require.NoError(t, b.RC.HSet(c.ctx, c.window, "1:c", 1).Err())
			require.NoError(t, b.RC.ZAdd(c.ctx, c.suspects, redis.Z{Score: 1, Member: "x@" + c.queues[0]}).Err())
			n, err := c.br.Clear(c.ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, []string{"", GatePause}, c.pauses())
			require.Zero(t, c.exists(c.state, c.window, c.suspects, c.probes, b.KS.BreakerLateKey("p"), b.KS.breakerCountedKey("p")))
			n, err = c.br.Clear(c.ctx)
			require.NoError(t, err)
			require.Zero(t, n)
		}},
	)
}

// TestBreakerReplyMalformed: a reply the scripts never send is an error
// that says what is wrong, never a panic.
func TestBreakerReplyMalformed(t *testing.T) {
	for name, tc := range map[string]struct {
		reply any
		want  string
	}{
		"not a list":        {"OK", "unexpected reply OK"},
		"too short":         {[]any{"open", "why", int64(0), int64(1)}, "unexpected reply [open why 0 1]"},
		"state":             {[]any{int64(1), "why", int64(0), int64(1), int64(0)}, "unexpected reply: state 1 is not a string"},
		"why is a number":   {[]any{"open", int64(3), int64(0), int64(1), int64(0)}, "unexpected reply: why 3 is not a string"},
		"cool-down left":    {[]any{"open", "why", "soon", int64(1), int64(0)}, "unexpected reply: cool-down left soon is not an integer"},
		"clock":             {[]any{"open", "why", int64(0), nil, int64(0)}, "unexpected reply: clock <nil> is not an integer"},
		"changes":           {[]any{"open", "why", int64(0), int64(1), "one"}, "unexpected reply: number of changes one is not an integer"},
		"changes missing":   {[]any{"open", "why", int64(0), int64(1), int64(1), "closed", "open"}, "unexpected reply: 1 changes in 7 values"},
		"negative changes":  {[]any{"open", "why", int64(0), int64(1), int64(-1)}, "unexpected reply: -1 changes in 5 values"},
		"change not a word": {[]any{"open", "why", int64(0), int64(1), int64(1), "closed", int64(2), "tripped"}, "unexpected reply: change's to 2 is not a string"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := parseBreakerReply(tc.reply)
			require.EqualError(t, err, tc.want)
		})
	}
	r, rest, err := parseBreakerReply([]any{"open", "tripped", int64(-1), int64(1700000000000), int64(1), "closed", "open", "tripped", "x"})
	require.NoError(t, err)
	require.Equal(t, BreakerReply{State: "open", From: "closed", Why: "tripped", CoolDownLeft: -1, Now: time.UnixMilli(1700000000000),
		Changes: change("closed", "open", "tripped")}, r)
	require.Equal(t, []any{"x"}, rest)
}

// TestBreakerRecordMalformed: the same for the read script's reply.
func TestBreakerRecordMalformed(t *testing.T) {
	good := func() []any {
		return []any{int64(1700000000000), "open", []any{"since", "1700000000000", "trips", "2"}, int64(0), int64(4), int64(2), int64(1)}
	}
	for name, tc := range map[string]struct {
		change func(r []any) any
		want   string
	}{
		"not a list":  {func([]any) any { return int64(3) }, "unexpected reply 3"},
		"short":       {func(r []any) any { return r[:6] }, "unexpected reply [1700000000000 open [since 1700000000000 trips 2] 0 4 2]"},
		"clock":       {func(r []any) any { r[0] = "now"; return r }, "unexpected reply: clock now is not an integer"},
		"state":       {func(r []any) any { r[1] = int64(1); return r }, "unexpected reply: state 1 is not a string"},
		"hash":        {func(r []any) any { r[2] = "h"; return r }, "unexpected reply: state hash h"},
		"odd hash":    {func(r []any) any { r[2] = []any{"since"}; return r }, "unexpected reply: state hash [since]"},
		"hash value":  {func(r []any) any { r[2] = []any{"since", int64(1)}; return r }, "unexpected reply: state hash [since 1]"},
		"probes":      {func(r []any) any { r[3] = nil; return r }, "unexpected reply: probes running <nil> is not an integer"},
		"window slow": {func(r []any) any { r[6] = "1"; return r }, "unexpected reply: window slow calls 1 is not an integer"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseBreakerRecord(tc.change(good()))
			require.EqualError(t, err, tc.want)
		})
	}
	rec, err := parseBreakerRecord(good())
	require.NoError(t, err)
	require.Equal(t, BreakerRecord{Now: time.UnixMilli(1700000000000), State: "open", Since: time.UnixMilli(1700000000000), Trips: 2,
		WindowCalls: 4, WindowFailures: 2, WindowSlow: 1}, rec)
}
