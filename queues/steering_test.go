package queues_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

func TestSteeringConfigProblems(t *testing.T) {
	t.Parallel()
	tiers := []string{"regulatory", "close", "adhoc"}
	base := func(mod func(*queues.PoolConfig)) queues.Config {
		pc := queues.PoolConfig{Name: "batch", Size: 4, JobTypes: []string{"report:run"}, Tiers: tiers}
		mod(&pc)
		return queues.Config{Tiers: testPolicy(t), Pools: []queues.PoolConfig{pc}}
	}
	cases := []struct {
		name string
		mod  func(*queues.PoolConfig)
		want []string // every problem, in order
	}{
		{"valid", func(p *queues.PoolConfig) {
			p.Reserved = map[string]int{"regulatory": 1, "close": 1}
			p.MaxWait = map[string]time.Duration{"adhoc": 10 * time.Minute, "close": time.Hour}
		}, nil},
		{"reserved on a process-scoped pool", func(p *queues.PoolConfig) {
			p.Scope = queues.ScopeProcess
			p.Reserved = map[string]int{"regulatory": 1}
		}, []string{`pool "batch": reserved needs scope: cluster (the cluster-wide gate shares the slots among the tiers)`}},
		{"max_wait on a process-scoped pool", func(p *queues.PoolConfig) {
			p.Scope = queues.ScopeProcess
			p.MaxWait = map[string]time.Duration{"adhoc": time.Minute}
		}, []string{`pool "batch": max_wait needs scope: cluster (the cluster-wide gate shares the slots among the tiers)`}},
		{"reserved: unknown tier, zero, too many", func(p *queues.PoolConfig) {
			p.Reserved = map[string]int{"close": 4, "nightly": 0}
		}, []string{
			`pool "batch": reserved: tier "nightly" is not one of the pool's tiers (["regulatory" "close" "adhoc"])`,
			`pool "batch": reserved: tier "nightly" must be >= 1, got 0`,
			`pool "batch": reserved: 4 slots reserved in all, but the pool's size is 4: at least one slot must stay open to every tier`,
		}},
		{"reserved for the lowest tier", func(p *queues.PoolConfig) {
			p.Reserved = map[string]int{"adhoc": 1}
		}, []string{`pool "batch": reserved: tier "adhoc" is the pool's lowest tier: a slot reserved for it and the tiers above it is open to every job, so it reserves nothing`}},
		{"without tiers", func(p *queues.PoolConfig) {
			p.Tiers = nil
			p.Reserved = map[string]int{"regulatory": 1}
			p.MaxWait = map[string]time.Duration{"adhoc": time.Minute}
		}, []string{
			`pool "batch": reserved needs tiers`,
			`pool "batch": max_wait needs tiers`,
		}},
		{"max_wait: weighted, too short, highest tier", func(p *queues.PoolConfig) {
			p.QueueOrder = queues.QueueOrderWeighted
			p.Weights = map[string]int{"regulatory": 3, "close": 2, "adhoc": 1}
			p.MaxWait = map[string]time.Duration{"adhoc": 500 * time.Millisecond, "regulatory": time.Minute}
		}, []string{
			`pool "batch": max_wait needs queue_order: strict (weighted order already serves every tier)`,
			`pool "batch": max_wait: tier "adhoc" must be at least 1s, got 500ms`,
			`pool "batch": max_wait: tier "regulatory" is the pool's highest tier: nothing is served before it anyway`,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := base(tc.mod).Validate()
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			var ce *queues.ConfigError
			require.ErrorAs(t, err, &ce)
			for _, w := range tc.want {
				require.Contains(t, ce.Problems, w, "all problems: %s", strings.Join(ce.Problems, "\n"))
			}
		})
	}
}

// TestReservedSlotsNeverTakenByLowerTiers: a pool of 4 across three
// processes, one slot reserved for regulatory and one for close (and the
// tiers above): seen inside the handlers at every start, the jobs below
// regulatory never hold more than 3 slots and adhoc never more than 2,
// while jobs of every tier arrive at random; nothing is lost.
func TestReservedSlotsNeverTakenByLowerTiers(t *testing.T) {
	c := newClusterPool(t, queues.PoolConfig{Size: 4, Tiers: []string{"regulatory", "close", "adhoc"}, PollInterval: 10 * time.Millisecond,
		Reserved: map[string]int{"regulatory": 1, "close": 1}})
	var violations []string
	adhocFull := 0 // starts that left adhoc at its share: the reservation was tested
	c.obs.onStart = func(j clusterJob, in map[string]int) {
		below := in["close"] + in["adhoc"]
		if (below > 3 || in["adhoc"] > 2) && len(violations) < 5 {
			violations = append(violations, fmt.Sprintf("job %d (%s) started with %v running", j.Seq, j.Tier, in))
		}
		if in["adhoc"] == 2 {
			adhocFull++
		}
	}
	jobs := 160
	if c.r.Mini != nil {
		jobs = 100
	}
	rng := rand.New(rand.NewPCG(7, 8))
	// Half the jobs wait before the processes start, adhoc mostly; the
	// rest arrive while they run.
	tierOf := func(i int) string {
		switch x := rng.IntN(10); {
		case x < 2:
			return "regulatory"
		case x < 4:
			return "close"
		default:
			return "adhoc"
		}
	}
	for i := range jobs / 2 {
		c.enqueue(clusterJob{Seq: i, Tier: tierOf(i), Work: time.Duration(5+rng.IntN(20)) * time.Millisecond})
	}
	c.start(3)
	for i := jobs / 2; i < jobs; i++ {
		c.enqueue(clusterJob{Seq: i, Tier: tierOf(i), Work: time.Duration(5+rng.IntN(20)) * time.Millisecond})
		if i%10 == 0 {
			// Let the pool drain to adhoc alone now and then.
			c.waitDone(i-10, time.Minute)
		}
	}
	c.waitDone(jobs, 2*time.Minute)
	c.obs.mu.Lock()
	defer c.obs.mu.Unlock()
	require.Empty(t, violations, "a lower tier took a reserved slot")
	require.Positive(t, adhocFull, "adhoc never reached its share: the test did not exercise the reservation")
	require.Zero(t, c.obs.violations, "more than 4 jobs ran at once")
	seen := map[int]bool{}
	for _, s := range c.obs.starts {
		require.False(t, seen[s.Seq], "job %d started twice", s.Seq)
		seen[s.Seq] = true
	}
	require.Len(t, seen, jobs)
	t.Logf("%d jobs on 3 processes: adhoc at its share of 2 slots at %d starts, 0 reserved slots taken by a lower tier, peak %d", jobs, adhocFull, c.obs.peak)
}

// TestReservedSlotStartsArrivingJobAtTheNextPoll: the pool's two slots,
// one reserved for regulatory, are busy with long adhoc reports (one
// running, more pending); a regulatory report arriving starts within
// asynq's poll (up to 1.5 poll intervals, its jitter), not when an adhoc
// report ends. Without the reservation it would wait seconds; with one
// process but without the reserved lane (runner.newLane) it did, about one
// run in three: an adhoc job dequeued in the instant before its queue was
// paused held the process's last free worker.
func TestReservedSlotStartsArrivingJobAtTheNextPoll(t *testing.T) {
	for _, procs := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d processes", procs), func(t *testing.T) { testReservedSlotLatency(t, procs) })
	}
}

func testReservedSlotLatency(t *testing.T, procs int) {
	const poll = 100 * time.Millisecond
	c := newClusterPool(t, queues.PoolConfig{Size: 2, Tiers: []string{"regulatory", "adhoc"}, PollInterval: poll,
		Reserved: map[string]int{"regulatory": 1}})
	startedAt := map[int]time.Time{}
	adhocOver := 0
	c.obs.onStart = func(j clusterJob, in map[string]int) {
		startedAt[j.Seq] = time.Now()
		if in["adhoc"] > 1 {
			adhocOver++
		}
	}
	for i := range 4 {
		c.enqueue(clusterJob{Seq: i, Tier: "adhoc", Work: 3 * time.Second})
	}
	c.start(procs)
	testwait.For(t, 10*time.Second, "an adhoc report to start", func() bool {
		c.obs.mu.Lock()
		defer c.obs.mu.Unlock()
		return len(c.obs.starts) == 1
	})
	// asynq's jitter, the scripts and the race detector on a shared
	// machine: well under the 3 s an adhoc report takes (with 400 ms of
	// allowance a loaded machine read 553 and 690 ms).
	bound := poll*3/2 + time.Second
	var lat []time.Duration
	for i := range 5 {
		seq := 100 + i
		at := time.Now()
		c.enqueue(clusterJob{Seq: seq, Tier: "regulatory", Work: 10 * time.Millisecond})
		testwait.For(t, 10*time.Second, "the regulatory report to start", func() bool {
			c.obs.mu.Lock()
			defer c.obs.mu.Unlock()
			_, ok := startedAt[seq]
			return ok
		})
		c.obs.mu.Lock()
		lat = append(lat, startedAt[seq].Sub(at))
		c.obs.mu.Unlock()
		c.waitDone(i+1, 10*time.Second)
	}
	c.obs.mu.Lock()
	defer c.obs.mu.Unlock()
	require.Zero(t, adhocOver, "adhoc took the reserved slot")
	t.Logf("regulatory start latency into a pool busy with 3 s adhoc reports (poll %s, %d processes): %v", poll, procs, lat)
	for _, l := range lat {
		require.Less(t, l, bound, "a regulatory report waited for an adhoc one to end")
	}
}

// TestMaxWaitServesAStarvedTier: under a stream of regulatory reports that
// keeps a pool of 2 busy, an adhoc report with a maximum wait of 1 s
// starts within the stated bound (max wait + one report's run time + a
// poll interval, plus scheduling noise), ahead of regulatory reports that
// were waiting; without a maximum wait it starts after every one of them
// (strict order unchanged).
func TestMaxWaitServesAStarvedTier(t *testing.T) {
	const (
		work    = 100 * time.Millisecond
		maxWait = time.Second
		stream  = 50 // 2.5 s of work for 2 slots: longer than the wait
	)
	for _, guard := range []bool{true, false} {
		t.Run(fmt.Sprintf("guard=%v", guard), func(t *testing.T) {
			pc := queues.PoolConfig{Size: 2, Tiers: []string{"regulatory", "adhoc"}, PollInterval: 10 * time.Millisecond}
			if guard {
				pc.MaxWait = map[string]time.Duration{"adhoc": maxWait}
			}
			c := newClusterPool(t, pc)
			for i := range stream {
				c.enqueue(clusterJob{Seq: i, Tier: "regulatory", Work: work})
			}
			c.start(3)
			testwait.For(t, 10*time.Second, "the pool to fill", func() bool {
				c.obs.mu.Lock()
				defer c.obs.mu.Unlock()
				return len(c.obs.starts) >= 2
			})
			at := time.Now()
			c.enqueue(clusterJob{Seq: 1000, Tier: "adhoc", Work: work})
			c.waitDone(stream+1, time.Minute)

			c.obs.mu.Lock()
			defer c.obs.mu.Unlock()
			pos := -1
			for i, s := range c.obs.starts {
				if s.Seq == 1000 {
					pos = i
				}
			}
			require.GreaterOrEqual(t, pos, 0)
			wait := c.obs.startedAt[pos].Sub(at)
			after := len(c.obs.starts) - 1 - pos // regulatory reports started after it
			t.Logf("adhoc waited %s under a stream of %d regulatory reports of %s (max wait %v); %d regulatory reports started after it",
				wait.Round(time.Millisecond), stream, work, guard, after)
			if !guard {
				require.Zero(t, after, "without a maximum wait, strict order: adhoc starts last")
				return
			}
			bound := maxWait + work + 15*time.Millisecond + 400*time.Millisecond // + noise: race detector, shared cores
			require.Less(t, wait, bound, "the aged adhoc report was not served in time")
			require.GreaterOrEqual(t, wait, maxWait-50*time.Millisecond, "served before its maximum wait: strict order broken early")
			require.Positive(t, after, "it was served ahead of waiting regulatory reports")
		})
	}
}

// Stats carries each tier's reservation and maximum wait, and says when the
// oldest pending job has waited past it.
func TestStatsShowSteering(t *testing.T) {
	h := newHarness(t, queues.PoolConfig{Name: "batch", Size: 2, JobTypes: []string{"report"}, Tiers: []string{"regulatory", "close", "adhoc"},
		Reserved: map[string]int{"regulatory": 1}, MaxWait: map[string]time.Duration{"adhoc": time.Second}})
	h.enqueue("report", job{Seq: 1, Tier: "adhoc"})
	byTier := func() map[string]queues.QueueStats {
		st, err := h.client.Stats(context.Background())
		require.NoError(t, err)
		m := map[string]queues.QueueStats{}
		for _, q := range st.Queues {
			m[q.Tier] = q
		}
		return m
	}
	require.False(t, byTier()["adhoc"].OverMaxWait, "just enqueued")
	testwait.For(t, 10*time.Second, "the adhoc job to wait past its limit", func() bool { return byTier()["adhoc"].OverMaxWait })
	q := byTier()
	require.Equal(t, 1, q["regulatory"].Reserved)
	require.Equal(t, time.Second, q["adhoc"].MaxWait)
	require.Zero(t, q["close"].MaxWait)
	require.False(t, q["regulatory"].OverMaxWait)
}

// TestMaxWaitServesEveryAgedJob: ten adhoc reports arriving 100 ms apart
// into a pool of 2 kept busy by a regulatory stream each start within the
// bound of their own maximum wait (max wait + one report's run time + a
// poll interval, plus scheduling noise), one after the other as each ages,
// and none before it aged, although three processes dequeue the next
// adhoc reports in the same instant as an aged one.
func TestMaxWaitServesEveryAgedJob(t *testing.T) {
	const (
		work    = 50 * time.Millisecond
		maxWait = time.Second
	)
	c := newClusterPool(t, queues.PoolConfig{Size: 2, Tiers: []string{"regulatory", "adhoc"}, PollInterval: 10 * time.Millisecond,
		MaxWait: map[string]time.Duration{"adhoc": maxWait}})
	const stream = 120 // 3 s of work for 2 slots: the last adhoc report ages at about 2 s
	for i := range stream {
		c.enqueue(clusterJob{Seq: i, Tier: "regulatory", Work: work})
	}
	c.start(3)
	at := map[int]time.Time{}
	for i := range 10 {
		at[1000+i] = time.Now()
		c.enqueue(clusterJob{Seq: 1000 + i, Tier: "adhoc", Work: work})
		time.Sleep(100 * time.Millisecond) // the arrivals are the test's input, not a wait for a condition
	}
	c.waitDone(stream+10, time.Minute)
	c.obs.mu.Lock()
	defer c.obs.mu.Unlock()
	noise := 400 * time.Millisecond // the race detector, cores shared with other tests
	if c.r.Mini != nil {
		noise = time.Second // the embedded Redis runs every script in this process
	}
	bound := maxWait + work + 15*time.Millisecond + noise
	var waits []time.Duration
	early, regAfter := 0, 0
	var late []int
	for i, s := range c.obs.starts {
		switch {
		case s.Tier == "adhoc":
			w := c.obs.startedAt[i].Sub(at[s.Seq])
			waits = append(waits, w.Round(time.Millisecond))
			if w >= bound {
				late = append(late, s.Seq)
			}
			// A few ms of slack: the stamps the guard compares are taken
			// in ms by different clocks' reads (the enqueuer's header,
			// Redis's TIME) around the test's own reading of at.
			if w < maxWait-10*time.Millisecond {
				early++
			}
		case len(waits) == 10:
			regAfter++
		}
	}
	t.Logf("adhoc waits %v (bound %s); %d started before their own limit", waits, bound, early)
	require.Empty(t, late, "adhoc reports not served in time")
	require.Zero(t, early, "an adhoc report started ahead of pending regulatory ones before it was aged")
	require.Len(t, waits, 10)
	require.Positive(t, regAfter, "the regulatory stream outlasted the adhoc reports: they were served ahead of it")
}
