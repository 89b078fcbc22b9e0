package queues_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

func policy(t *testing.T, tiers ...string) *priority.Policy {
	t.Helper()
	p, err := priority.New(priority.Config{Tiers: tiers, Default: tiers[len(tiers)-1]})
	require.NoError(t, err)
	return p
}

// TestReconfigureTierOrder: while a job runs in a cluster-scoped pool of
// 1, five jobs of each of two tiers wait. Reconfigured with the tiers
// swapped, the pool's server is rebuilt (asynq fixes queue priorities);
// the running job finishes although it runs past the shutdown timeout
// (the old server waits for it), and the waiting jobs start
// lower-tier-now-first, each exactly once, in FIFO order within each tier.
func TestReconfigureTierOrder(t *testing.T) {
	h := newHarness(t, queues.PoolConfig{Name: "batch", Size: 1, JobTypes: []string{"report:run"},
		Tiers: []string{"regulatory", "adhoc"}, PollInterval: 10 * time.Millisecond})
	h.cfg.Tiers = policy(t, "regulatory", "adhoc")
	h.cfg.ShutdownTimeout = 500 * time.Millisecond
	runner := h.run(h.obs.mux(t, "report:run"))
	h.enqueue("report:run", job{Seq: 0, Tier: "regulatory", Work: 1500 * time.Millisecond})
	testwait.For(t, 10*time.Second, "the first job to start", func() bool {
		_, starts, _ := h.obs.snapshot()
		return len(starts) == 1
	})
	for i := 1; i <= 10; i++ {
		tier := "regulatory"
		if i%2 == 0 {
			tier = "adhoc"
		}
		h.enqueue("report:run", job{Seq: i, Tier: tier, Work: 5 * time.Millisecond})
	}

	swapped := h.cfg
	swapped.Tiers = policy(t, "adhoc", "regulatory")
	changes, err := runner.Reconfigure(context.Background(), swapped)
	require.NoError(t, err)
	require.Equal(t, []queues.PoolChange{{Pool: "batch", Changed: []string{"tier order"}, Rebuilt: []string{"tier order"}}}, changes)
	require.Equal(t, []string{"adhoc", "regulatory"}, runner.Pools()[0].Tiers())

	h.obs.waitDone(t, "batch", 11, 20*time.Second)
	_, starts, _ := h.obs.snapshot()
	var seqs []int
	for _, s := range starts {
		seqs = append(seqs, s.Job.Seq)
	}
	require.Equal(t, []int{0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9}, seqs, "adhoc first now, FIFO in each tier, each job once (the first one not cut short)")
}

// TestReconfigureSize: a cluster-scoped pool of 1 with a backlog,
// reconfigured to 3 without a rebuild: the jobs running at once, counted
// inside the handlers, reach 3 and never pass it. An invalid config is
// then refused with every problem, and the pool goes on at 3.
func TestReconfigureSize(t *testing.T) {
	h := newHarness(t, queues.PoolConfig{Name: "batch", Size: 1, MaxSize: 3, JobTypes: []string{"report:run"}, PollInterval: 10 * time.Millisecond})
	runner := h.run(h.obs.mux(t, "report:run"))
	const total = 60
	for i := range total {
		h.enqueue("report:run", job{Seq: i, Work: 50 * time.Millisecond})
	}
	testwait.For(t, 10*time.Second, "5 jobs to start", func() bool {
		_, starts, _ := h.obs.snapshot()
		return len(starts) >= 5
	})
	peak, _, _ := h.obs.snapshot()
	require.Equal(t, 1, peak["batch"])

	bigger := h.cfg
	bigger.Pools = slices.Clone(h.cfg.Pools)
	bigger.Pools[0].Size = 3
	changes, err := runner.Reconfigure(context.Background(), bigger)
	require.NoError(t, err)
	require.Equal(t, []queues.PoolChange{{Pool: "batch", Changed: []string{"size"}}}, changes, "no rebuild")
	testwait.For(t, 5*time.Second, "3 jobs running at once", func() bool {
		peak, _, _ := h.obs.snapshot()
		return peak["batch"] == 3
	})

	bad := bigger
	bad.Namespace = "elsewhere"
	bad.Pools = slices.Clone(bigger.Pools)
	bad.Pools[0].Size = 0
	bad.Pools[0].JobTypes = []string{"report:run", "report:other"}
	_, err = runner.Reconfigure(context.Background(), bad)
	var ce *queues.ConfigError
	require.ErrorAs(t, err, &ce)
	for _, want := range []string{
		`pool "batch": size must be >= 1, got 0`,
		`job type "report:other" has no handler`,
		`namespace: "` + h.cfg.Namespace + `" to "elsewhere": cannot change while the client runs (restart it)`,
		`pool "batch": job_types ["report:run"] to ["report:run" "report:other"]`,
	} {
		require.Contains(t, err.Error(), want)
	}
	require.Equal(t, 3, runner.Pools()[0].Size(), "the running configuration stays")
	h.obs.waitDone(t, "batch", total, 30*time.Second)
	peak, starts, _ := h.obs.snapshot()
	require.Equal(t, 3, peak["batch"], "never above the size in effect")
	seen := map[int]bool{}
	for _, s := range starts {
		require.False(t, seen[s.Job.Seq], "job %d started twice", s.Job.Seq)
		seen[s.Job.Seq] = true
	}
	require.Len(t, seen, total)
}

// TestReconfigureTiers: a tier added to a pool is served after the rebuild;
// a tier whose queue still holds jobs cannot be taken away.
func TestReconfigureTiers(t *testing.T) {
	h := newHarness(t, queues.PoolConfig{Name: "batch", Size: 1, JobTypes: []string{"report:run"},
		Tiers: []string{"close", "adhoc"}, PollInterval: 10 * time.Millisecond})
	h.cfg.Tiers = policy(t, "regulatory", "close", "adhoc")
	runner := h.run(h.obs.mux(t, "report:run"))

	more := h.cfg
	more.Pools = slices.Clone(h.cfg.Pools)
	more.Pools[0].Tiers = []string{"regulatory", "close", "adhoc"}
	changes, err := runner.Reconfigure(context.Background(), more)
	require.NoError(t, err)
	require.Equal(t, []queues.PoolChange{{Pool: "batch", Changed: []string{"tiers"}, Rebuilt: []string{"tiers"}}}, changes)
	_, err = h.client.Reconfigure(context.Background(), more) // the enqueuing client learns the tier too
	require.NoError(t, err)
	h.enqueue("report:run", job{Seq: 1, Tier: "regulatory"})
	h.obs.waitDone(t, "batch", 1, 10*time.Second)

	// A paused pool keeps a job waiting in adhoc: adhoc cannot go.
	require.NoError(t, h.client.PausePool(context.Background(), "batch"))
	h.enqueue("report:run", job{Seq: 2, Tier: "adhoc"})
	fewer := more
	fewer.Pools = slices.Clone(more.Pools)
	fewer.Pools[0].Tiers = []string{"regulatory", "close"}
	fewer.Tiers = policy(t, "regulatory", "close")
	_, err = runner.Reconfigure(context.Background(), fewer)
	require.ErrorContains(t, err, fmt.Sprintf(`pool "batch": tier "adhoc" is removed but its queue %s:batch:adhoc still holds 1 jobs (pending 1`, h.cfg.Namespace))
	require.Equal(t, []string{"regulatory", "close", "adhoc"}, runner.Pools()[0].Tiers(), "nothing changed")
	require.NoError(t, h.client.ResumePool(context.Background(), "batch"))
	h.obs.waitDone(t, "batch", 2, 10*time.Second)
}

// TestReconfigureBreakerPool: a pool with a circuit breaker takes a new
// tier order and new breaker settings; adding or removing its breaker is
// refused.
func TestReconfigureBreakerPool(t *testing.T) {
	h := newHarness(t, queues.PoolConfig{Name: "batch", Size: 1, JobTypes: []string{"report:run"},
		Tiers: []string{"regulatory", "adhoc"}, PollInterval: 10 * time.Millisecond, Breaker: &queues.BreakerConfig{MinCalls: 5}})
	h.cfg.Tiers = policy(t, "regulatory", "adhoc")
	runner := h.run(h.obs.mux(t, "report:run"))

	next := h.cfg
	next.Tiers = policy(t, "adhoc", "regulatory")
	next.Pools = slices.Clone(h.cfg.Pools)
	next.Pools[0].Breaker = &queues.BreakerConfig{MinCalls: 7}
	changes, err := runner.Reconfigure(context.Background(), next)
	require.NoError(t, err)
	require.Equal(t, []queues.PoolChange{{Pool: "batch", Changed: []string{"tier order", "breaker"}, Rebuilt: []string{"tier order"}}}, changes)
	h.enqueue("report:run", job{Seq: 1, Tier: "adhoc"})
	h.obs.waitDone(t, "batch", 1, 10*time.Second)
	b, err := runner.Breaker(context.Background(), "batch")
	require.NoError(t, err)
	require.Equal(t, queues.BreakerClosed, b.State)

	none := next
	none.Pools = slices.Clone(next.Pools)
	none.Pools[0].Breaker = nil
	_, err = runner.Reconfigure(context.Background(), none)
	require.ErrorContains(t, err, `pool "batch": a breaker added or removed: cannot change while the client runs (restart it)`)
}

// laneServers counts the active asynq servers that serve exactly queues
// (a pool's reserved lane serves only the reserved tiers' queues).
func laneServers(t *testing.T, h *harness, queues ...string) int {
	t.Helper()
	servers, err := asynq.NewInspectorFromRedisClient(h.redis.Client).Servers()
	require.NoError(t, err)
	n := 0
	for _, s := range servers {
		if s.Status != "active" || len(s.Queues) != len(queues) {
			continue
		}
		all := true
		for _, q := range queues {
			if _, ok := s.Queues[q]; !ok {
				all = false
			}
		}
		if all {
			n++
		}
	}
	return n
}

// TestReconfigureReservations: a pool of 2 with one slot reserved for
// regulatory runs its adhoc jobs one at a time, beside a reserved lane
// (a server of the regulatory queue only). Reconfigured without the
// reservation, the lane is rebuilt away (the old one stops) and adhoc
// jobs take both slots; each job runs once.
func TestReconfigureReservations(t *testing.T) {
	h := newHarness(t, queues.PoolConfig{Name: "batch", Size: 2, JobTypes: []string{"report:run"},
		Tiers: []string{"regulatory", "close", "adhoc"}, Reserved: map[string]int{"regulatory": 1}, PollInterval: 10 * time.Millisecond})
	runner := h.run(h.obs.mux(t, "report:run"))
	p, err := runner.Pool("batch")
	require.NoError(t, err)
	reg, _ := p.QueueFor("regulatory")
	testwait.For(t, 10*time.Second, "the reserved lane to run", func() bool { return laneServers(t, h, reg) == 1 })
	const total = 40
	for i := range total {
		h.enqueue("report:run", job{Seq: i, Tier: "adhoc", Work: 30 * time.Millisecond})
	}
	testwait.For(t, 10*time.Second, "5 jobs to start", func() bool {
		_, starts, _ := h.obs.snapshot()
		return len(starts) >= 5
	})
	peak, _, _ := h.obs.snapshot()
	require.Equal(t, 1, peak["batch"], "adhoc never takes the reserved slot")

	open := h.cfg
	open.Pools = slices.Clone(h.cfg.Pools)
	open.Pools[0].Reserved = nil
	changes, err := runner.Reconfigure(context.Background(), open)
	require.NoError(t, err)
	require.Equal(t, []queues.PoolChange{{Pool: "batch", Changed: []string{"reserved"}, Rebuilt: []string{"reserved"}}}, changes)
	testwait.For(t, 10*time.Second, "adhoc jobs to take both slots", func() bool {
		peak, _, _ := h.obs.snapshot()
		return peak["batch"] == 2
	})
	testwait.For(t, 10*time.Second, "the reserved lane to stop", func() bool { return laneServers(t, h, reg) == 0 })
	h.obs.waitDone(t, "batch", total, 30*time.Second)
	peak, starts, _ := h.obs.snapshot()
	require.Equal(t, 2, peak["batch"], "never above the size")
	seen := map[int]bool{}
	for _, s := range starts {
		require.False(t, seen[s.Job.Seq], "job %d started twice", s.Job.Seq)
		seen[s.Job.Seq] = true
	}
	require.Len(t, seen, total)
}

type quietObserver struct{}

func (quietObserver) JobStarted(queues.JobStart) {}
func (quietObserver) JobFinished(queues.JobEnd)  {}

// TestReconfigureDrainWithObserver: a process-scoped pool with an
// observer (the worker sets one for metrics) is rebuilt while a job runs:
// the job ends during the drain and is not run a second time (its end
// once waited for the lock the drain held, past the shutdown timeout, and
// asynq put it back).
func TestReconfigureDrainWithObserver(t *testing.T) {
	h := newHarness(t, queues.PoolConfig{Name: "batch", Size: 1, JobTypes: []string{"report:run"}, Scope: queues.ScopeProcess, PollInterval: 10 * time.Millisecond})
	h.cfg.Observer = quietObserver{}
	h.cfg.ShutdownTimeout = time.Second
	runner := h.run(h.obs.mux(t, "report:run"))
	h.enqueue("report:run", job{Seq: 1, Work: 300 * time.Millisecond})
	testwait.For(t, 10*time.Second, "the job to start", func() bool {
		_, starts, _ := h.obs.snapshot()
		return len(starts) == 1
	})
	bigger := h.cfg
	bigger.Pools = slices.Clone(h.cfg.Pools)
	bigger.Pools[0].Size = 2
	_, err := runner.Reconfigure(context.Background(), bigger)
	require.NoError(t, err)
	h.obs.waitDone(t, "batch", 1, 10*time.Second)
	h.enqueue("report:run", job{Seq: 2})
	h.obs.waitDone(t, "batch", 2, 10*time.Second) // the pool runs after its rebuild
	_, starts, _ := h.obs.snapshot()
	require.Len(t, starts, 2, "each job ran once")
}
