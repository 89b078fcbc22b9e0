package queues

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testredis"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// TestBreakerHalfOpenGrantsExactlyProbes: over 1,000 half-open trials (300
// on the embedded Redis),
// three "processes" (each its own Redis connection) with four jobs each
// ask at once; exactly `probes` of the twelve become probes, every trial.
// When a probe ends without a verdict its place goes to another job; once
// all probes succeed the breaker closes and its pauses are gone.
func TestBreakerHalfOpenGrantsExactlyProbes(t *testing.T) {
	t.Parallel()
	const probes, procs, perProc = 3, 3, 4
	r := testredis.New(t)
	trials := 1000
	switch {
	case testing.Short():
		trials = 100
	case r.Mini != nil:
		trials = 300 // the embedded Redis is slower; a real one runs all 1,000
	}
	cfg := Config{Namespace: r.Namespace(t), Pools: []PoolConfig{{Name: "p", Size: 12, JobTypes: []string{"x"}, Scope: ScopeProcess,
		Breaker: &BreakerConfig{Probes: probes, CoolDown: time.Second}}}}.WithDefaults()
	reg, err := newRegistry(cfg, rdb.NewKeyspace(cfg.Namespace, false), nil)
	require.NoError(t, err)
	p := reg.pools[0]
	breakers := make([]*breaker, procs)
	for i := range breakers {
		rc := redis.NewClient(r.Options)
		t.Cleanup(func() { _ = rc.Close() })
		breakers[i] = newBreaker(rc, rdb.NewKeyspace(cfg.Namespace, false), p, slog.New(slog.DiscardHandler))
	}
	ctx := context.Background()
	stateKey, _, _, probesKey := rdb.NewKeyspace(cfg.Namespace, false).BreakerKeys("p")
	paused := rdb.PausedKey(p.queues[0])
	for trial := range trials {
		// Open with its cool-down over: the first caller moves it to
		// half-open.
		// The previous trial's probes have ended.
		require.NoError(t, r.Client.Del(ctx, probesKey).Err())
		require.NoError(t, r.Client.HSet(ctx, stateKey, "state", string(BreakerOpen), "until", 1, "probes_ok", 0).Err())
		require.NoError(t, r.Client.Set(ctx, paused, breakerPauseValue, 0).Err())
		// A real half-open state comes at least MinBreakerCoolDown after
		// the trip: no process still trusts a view of the breaker closed.
		for _, b := range breakers {
			b.mu.Lock()
			b.syncedAt = b.syncedAt.Add(-MinBreakerCoolDown)
			b.mu.Unlock()
		}
		var mu sync.Mutex
		var granted []rdb.Member
		var wg sync.WaitGroup
		for i, b := range breakers {
			for j := range perProc {
				wg.Go(func() {
					job := rdb.Member{ID: fmt.Sprintf("t%d-p%d-j%d", trial, i, j), Queue: "q"}
					v, err := b.admit(ctx, job)
					require.NoError(t, err)
					if v == rdb.VerdictProbe {
						mu.Lock()
						granted = append(granted, job)
						mu.Unlock()
					} else {
						require.Equal(t, rdb.VerdictWait, v)
					}
				})
			}
		}
		wg.Wait()
		require.Len(t, granted, probes, "trial %d", trial)
		require.Equal(t, breakerPauseValue, r.Client.Get(ctx, paused).Val(), "every probe taken: paused again")
		if trial%100 != 0 {
			continue
		}
		// One probe ends without a verdict: its place frees (the pause
		// lifts) and one more job may probe, but only one.
		breakers[0].probeDone(ctx, granted[0], rdb.ProbeNone)
		require.Empty(t, r.Client.Get(ctx, paused).Val())
		extra1, extra2 := rdb.Member{ID: "extra1", Queue: "q"}, rdb.Member{ID: "extra2", Queue: "q"}
		v1, err := breakers[1].admit(ctx, extra1)
		require.NoError(t, err)
		v2, err := breakers[2].admit(ctx, extra2)
		require.NoError(t, err)
		require.Equal(t, []rdb.Verdict{rdb.VerdictProbe, rdb.VerdictWait}, []rdb.Verdict{v1, v2})
		for _, m := range append(granted[1:], extra1) {
			breakers[1].probeDone(ctx, m, rdb.ProbeOK)
		}
		st := r.Client.HGet(ctx, stateKey, "state").Val()
		require.Equal(t, BreakerClosed, BreakerStatus(st))
		require.Empty(t, r.Client.Get(ctx, paused).Val(), "no breaker pause survives the close")
	}
}

// TestBreakerProbeOfADeadProcessFrees: a probe whose process died (its
// lease no longer renewed) frees its place after breakerProbeTTL; a probe
// whose process lives keeps its place.
func TestBreakerProbeOfADeadProcessFrees(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := Config{Namespace: r.Namespace(t), Pools: []PoolConfig{{Name: "p", Size: 4, JobTypes: []string{"x"}, Scope: ScopeProcess,
		Breaker: &BreakerConfig{Probes: 2, CoolDown: time.Second}}}}.WithDefaults()
	reg, err := newRegistry(cfg, rdb.NewKeyspace(cfg.Namespace, false), nil)
	require.NoError(t, err)
	p := reg.pools[0]
	live := newBreaker(r.Client, rdb.NewKeyspace(cfg.Namespace, false), p, slog.New(slog.DiscardHandler))
	dead := newBreaker(r.Client, rdb.NewKeyspace(cfg.Namespace, false), p, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	stateKey, _, _, probesKey := rdb.NewKeyspace(cfg.Namespace, false).BreakerKeys("p")
	require.NoError(t, r.Client.HSet(ctx, stateKey, "state", string(BreakerHalfOpen), "probes_ok", 0).Err())
	liveJob, deadJob, other := rdb.Member{ID: "live", Queue: "q"}, rdb.Member{ID: "dead", Queue: "q"}, rdb.Member{ID: "other", Queue: "q"}
	v, err := live.admit(ctx, liveJob)
	require.NoError(t, err)
	require.Equal(t, rdb.VerdictProbe, v)
	// The dead probe's lease is taken after start: it cannot expire
	// before start + breakerProbeTTL, however long the calls below take.
	start := time.Now()
	v, err = dead.admit(ctx, deadJob)
	require.NoError(t, err)
	require.Equal(t, rdb.VerdictProbe, v)
	v, err = live.admit(ctx, other)
	require.NoError(t, err)
	require.Equal(t, rdb.VerdictWait, v, "both places taken")

	// Only the live process keeps renewing.
	for {
		require.NoError(t, live.sync(ctx))
		v, err = live.admit(ctx, other)
		require.NoError(t, err)
		if v == rdb.VerdictProbe {
			break
		}
		require.Less(t, time.Since(start), 3*breakerProbeTTL, "the dead probe's place never freed")
		timer := time.NewTimer(breakerTick) // the live process's tick
		<-timer.C
	}
	require.GreaterOrEqual(t, time.Since(start), breakerProbeTTL-breakerTick, "freed no earlier than its lease")
	members, err := r.Client.ZRange(ctx, probesKey, 0, -1).Result()
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"live@q", "other@q"}, members, "the live probe kept its place")
}

// TestBreakerProbeOutlivingItsTrialKeepsItsPlace: with two probes, one
// fails (the breaker reopens) while the other still runs; in the next
// half-open state the one still running holds a place, so only one more
// job may probe: never more than `probes` probe jobs at once. When the
// survivor then succeeds, its outcome counts in the state it ends in.
func TestBreakerProbeOutlivingItsTrialKeepsItsPlace(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := Config{Namespace: r.Namespace(t), Pools: []PoolConfig{{Name: "p", Size: 4, JobTypes: []string{"x"}, Scope: ScopeProcess,
		Breaker: &BreakerConfig{Probes: 2, CoolDown: time.Second}}}}.WithDefaults()
	reg, err := newRegistry(cfg, rdb.NewKeyspace(cfg.Namespace, false), nil)
	require.NoError(t, err)
	b := newBreaker(r.Client, rdb.NewKeyspace(cfg.Namespace, false), reg.pools[0], slog.New(slog.DiscardHandler))
	ctx := context.Background()
	stateKey, _, _, _ := rdb.NewKeyspace(cfg.Namespace, false).BreakerKeys("p")
	admit := func(id string) rdb.Verdict {
		v, err := b.admit(ctx, rdb.Member{ID: id, Queue: "q"})
		require.NoError(t, err)
		return v
	}
	done := func(id string, outcome rdb.ProbeOutcome) { b.probeDone(ctx, rdb.Member{ID: id, Queue: "q"}, outcome) }
	require.NoError(t, r.Client.HSet(ctx, stateKey, "state", string(BreakerHalfOpen), "probes_ok", 0).Err())
	require.Equal(t, []rdb.Verdict{rdb.VerdictProbe, rdb.VerdictProbe}, []rdb.Verdict{admit("a"), admit("slow")})
	done("a", rdb.ProbeFail)
	require.Equal(t, BreakerOpen, BreakerStatus(r.Client.HGet(ctx, stateKey, "state").Val()))

	// The cool-down ends while slow@q still runs.
	require.NoError(t, r.Client.HSet(ctx, stateKey, "until", 1).Err())
	require.Equal(t, []rdb.Verdict{rdb.VerdictProbe, rdb.VerdictWait}, []rdb.Verdict{admit("c"), admit("d")}, "slow@q still holds one of the two places")
	done("slow", rdb.ProbeOK)
	done("c", rdb.ProbeOK)
	require.Equal(t, BreakerClosed, BreakerStatus(r.Client.HGet(ctx, stateKey, "state").Val()))
}
