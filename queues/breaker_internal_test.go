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
		require.NoError(t, r.Client.HSet(ctx, stateKey, "state", BreakerOpen, "until", 1, "probes_ok", 0).Err())
		require.NoError(t, r.Client.Set(ctx, paused, breakerPauseValue, 0).Err())
		// A real half-open state comes at least MinBreakerCoolDown after
		// the trip: no process still trusts a view of the breaker closed.
		for _, b := range breakers {
			b.mu.Lock()
			b.syncedAt = b.syncedAt.Add(-MinBreakerCoolDown)
			b.mu.Unlock()
		}
		var mu sync.Mutex
		var granted []string
		var wg sync.WaitGroup
		for i, b := range breakers {
			for j := range perProc {
				wg.Go(func() {
					member := fmt.Sprintf("t%d-p%d-j%d@q", trial, i, j)
					v, err := b.admit(ctx, member)
					require.NoError(t, err)
					if v == "probe" {
						mu.Lock()
						granted = append(granted, member)
						mu.Unlock()
					} else {
						require.Equal(t, "wait", v)
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
		breakers[0].probeDone(ctx, granted[0], "none")
		require.Empty(t, r.Client.Get(ctx, paused).Val())
		v1, err := breakers[1].admit(ctx, "extra1@q")
		require.NoError(t, err)
		v2, err := breakers[2].admit(ctx, "extra2@q")
		require.NoError(t, err)
		require.Equal(t, []string{"probe", "wait"}, []string{v1, v2})
		for _, m := range append(granted[1:], "extra1@q") {
			breakers[1].probeDone(ctx, m, "ok")
		}
		st := r.Client.HGet(ctx, stateKey, "state").Val()
		require.Equal(t, BreakerClosed, st)
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
	require.NoError(t, r.Client.HSet(ctx, stateKey, "state", BreakerHalfOpen, "probes_ok", 0).Err())
	v, err := live.admit(ctx, "live@q")
	require.NoError(t, err)
	require.Equal(t, "probe", v)
	v, err = dead.admit(ctx, "dead@q")
	require.NoError(t, err)
	require.Equal(t, "probe", v)
	v, err = live.admit(ctx, "other@q")
	require.NoError(t, err)
	require.Equal(t, "wait", v, "both places taken")

	// Only the live process keeps renewing.
	start := time.Now()
	for {
		require.NoError(t, live.sync(ctx))
		v, err = live.admit(ctx, "other@q")
		require.NoError(t, err)
		if v == "probe" {
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
	admit := func(member string) string {
		v, err := b.admit(ctx, member)
		require.NoError(t, err)
		return v
	}
	require.NoError(t, r.Client.HSet(ctx, stateKey, "state", BreakerHalfOpen, "probes_ok", 0).Err())
	require.Equal(t, []string{"probe", "probe"}, []string{admit("a@q"), admit("slow@q")})
	b.probeDone(ctx, "a@q", "fail")
	require.Equal(t, BreakerOpen, r.Client.HGet(ctx, stateKey, "state").Val())

	// The cool-down ends while slow@q still runs.
	require.NoError(t, r.Client.HSet(ctx, stateKey, "until", 1).Err())
	require.Equal(t, []string{"probe", "wait"}, []string{admit("c@q"), admit("d@q")}, "slow@q still holds one of the two places")
	b.probeDone(ctx, "slow@q", "ok")
	b.probeDone(ctx, "c@q", "ok")
	require.Equal(t, BreakerClosed, r.Client.HGet(ctx, stateKey, "state").Val())
}
