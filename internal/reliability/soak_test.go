package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lci-labs/compartment/internal/testwait"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

// soakRedis is the soak's Redis: TEST_REDIS_URL when set; otherwise a
// redis-server of its own, like every other test here: a real one, so the
// soak runs its full 10,000 jobs, in 20-35 s under -race, where the
// embedded Redis took 100-180 s for a tenth of them. The embedded Redis
// only where redis-server is not installed.
func soakRedis(t *testing.T) *testredis.Redis {
	t.Helper()
	if os.Getenv(testredis.EnvVar) != "" {
		return testredis.New(t)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return testredis.New(t)
	}
	r := startRedis(t)
	t.Logf("soak: a redis-server of its own at 127.0.0.1:%d", r.port)
	return r.testRedis()
}

// soakJob is the payload of soak jobs.
type soakJob struct {
	Seq  int    `json:"seq"`
	Kind string `json:"kind"` // ok, transient (fails its first run), permanent (always fails)
}

// soakObserver sees every run from inside the handlers.
type soakObserver struct {
	mu         sync.Mutex
	inside     map[string]int
	size       map[string]int
	violations []string
	runs       map[int]int
	successes  map[int]int
	done       int
}

func (o *soakObserver) handle(h *queues.Handlers, jobType, pool string, work time.Duration) {
	queues.AddHandler(h, queues.NewJob[soakJob](jobType), func(ctx context.Context, j soakJob) error {
		o.mu.Lock()
		o.inside[pool]++
		if o.inside[pool] > o.size[pool] {
			o.violations = append(o.violations, fmt.Sprintf("pool %s ran %d jobs at once (size %d)", pool, o.inside[pool], o.size[pool]))
		}
		o.runs[j.Seq]++
		run := o.runs[j.Seq]
		o.mu.Unlock()

		t := time.NewTimer(work)
		defer t.Stop()
		var err error
		select {
		case <-t.C:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err == nil {
			switch {
			case j.Kind == "permanent":
				err = fmt.Errorf("job %d: the ledger rejects it", j.Seq)
			case j.Kind == "transient" && run == 1:
				err = fmt.Errorf("job %d: database busy", j.Seq)
			}
		}

		o.mu.Lock()
		o.inside[pool]--
		if err == nil {
			o.successes[j.Seq]++
			o.done++
		}
		o.mu.Unlock()
		return err
	})
}

// TestSoak runs 10,000 jobs across three pools, some failing once and some
// failing for good (plus malformed payloads), through three runners in turn
// (two restarts mid-run). At the end every job is completed or archived
// with its reason, the counts reconcile exactly, and no pool ever ran more
// jobs than its size.
func TestSoak(t *testing.T) {
	skipShort(t, "the soak, 10,000 jobs, about 30 s on a real Redis")
	t.Parallel() // it counts and checks caps inside the handlers; nothing here is timed
	r := soakRedis(t)
	ns := r.Namespace(t)
	policy, err := priority.New(priority.Config{Tiers: []string{"regulatory", "close", "adhoc"}, Default: "adhoc"})
	require.NoError(t, err)
	obs := &soakObserver{inside: map[string]int{}, size: map[string]int{"order": 4, "search": 3, "batch": 2}, runs: map[int]int{}, successes: map[int]int{}}
	mux := queues.NewHandlers()
	obs.handle(mux, "order:create", "order", time.Millisecond)
	obs.handle(mux, "search:index", "search", time.Millisecond)
	obs.handle(mux, "report:run", "batch", 3*time.Millisecond)
	cfg := queues.Config{
		Namespace: ns, Tiers: policy, Handlers: mux, ShutdownTimeout: time.Second, Logger: slog.New(slog.DiscardHandler),
		RetryDelay: func(int, error) time.Duration { return 20 * time.Millisecond }, DelayedCheckInterval: 100 * time.Millisecond,
		Pools: []queues.PoolConfig{
			{Name: "order", Size: 4, JobTypes: []string{"order:create"}, PollInterval: 20 * time.Millisecond, MaxRetry: 2},
			{Name: "search", Size: 3, JobTypes: []string{"search:index"}, PollInterval: 20 * time.Millisecond, MaxRetry: 2},
			{Name: "batch", Size: 2, JobTypes: []string{"report:run"}, Tiers: []string{"regulatory", "close", "adhoc"}, PollInterval: 20 * time.Millisecond, MaxRetry: 2},
		},
	}

	// 10,000 jobs: 8% fail once, 3% fail for good, 1% are malformed. The
	// embedded Redis is far slower than a real one (a tenth of the jobs
	// took 100 s there under -race), so on it the soak is a tenth of the
	// size.
	total := 10000
	if r.Mini != nil {
		total = 1000
		t.Logf("soak: %d jobs on the embedded Redis; install redis-server or set %s for the full 10,000", total, testredis.EnvVar)
	}
	wantCompleted, wantArchived := 0, 0
	client, err := queues.NewClient(r.Client, cfg)
	require.NoError(t, err)
	g, gctx := errgroup.WithContext(context.Background())
	g.SetLimit(8)
	tiers := policy.Tiers()
	for i := range total {
		kind := "ok"
		switch i % 100 {
		case 1, 13, 25, 37, 49, 61, 73, 85:
			kind = "transient"
		case 7, 51, 93:
			kind = "permanent"
		case 99:
			kind = "malformed"
		}
		if kind == "permanent" || kind == "malformed" {
			wantArchived++
		} else {
			wantCompleted++
		}
		jobType, tier := "order:create", ""
		switch i % 10 {
		case 5, 6, 7:
			jobType = "search:index"
		case 8, 9:
			jobType, tier = "report:run", tiers[i%3]
		}
		payload, _ := json.Marshal(soakJob{Seq: i, Kind: kind})
		if kind == "malformed" {
			payload = []byte(`{"seq": "not a number"}`)
		}
		g.Go(func() error {
			_, err := client.Enqueue(gctx, jobType, payload, queues.EnqueueOptions{Tier: tier, Retention: time.Hour})
			return err
		})
	}
	require.NoError(t, g.Wait())

	newRunner := func() *queues.Client {
		rn, err := queues.NewClient(r.Client, cfg)
		require.NoError(t, err)
		require.NoError(t, rn.Start(context.Background()))
		return rn
	}
	doneCount := func() int { obs.mu.Lock(); defer obs.mu.Unlock(); return obs.done }
	insp := asynq.NewInspectorFromRedisClient(r.Client)
	terminal := func() (completed, archived, other int) {
		for _, p := range client.Pools() {
			for _, q := range p.Queues() {
				info, err := insp.GetQueueInfo(q)
				require.NoError(t, err)
				completed += info.Completed
				archived += info.Archived
				other += info.Pending + info.Active + info.Scheduled + info.Retry
			}
		}
		return
	}

	// Two restarts: after 30% and after 65% of the jobs are done.
	for _, stopAt := range []int{total * 30 / 100, total * 65 / 100} {
		rn := newRunner()
		testwait.For(t, 3*time.Minute, fmt.Sprintf("%d jobs done", stopAt), func() bool { return doneCount() >= stopAt })
		require.NoError(t, rn.Stop(context.Background()))
	}
	rn := newRunner()
	defer func() { require.NoError(t, rn.Stop(context.Background())) }()
	// terminal reads every queue's counts: every 100 ms, not every 5 ms,
	// or the polling takes the CPU the runner needs to finish.
	testwait.For(t, 5*time.Minute, "every job to be completed or archived", every(100*time.Millisecond, func() bool {
		c, a, o := terminal()
		return o == 0 && c+a == total
	}))

	completed, archived, other := terminal()
	t.Logf("soak: %d jobs, %d completed, %d archived", total, completed, archived)
	require.Zero(t, other)
	require.Equal(t, total, completed+archived, "enqueued = completed + archived")
	require.Equal(t, wantCompleted, completed)
	require.Equal(t, wantArchived, archived)

	obs.mu.Lock()
	require.Empty(t, obs.violations, "pool caps held at every moment")
	duplicates := 0
	for seq, n := range obs.successes {
		if n > 1 {
			duplicates++
			t.Logf("job %d succeeded %d times", seq, n)
		}
	}
	obs.mu.Unlock()
	t.Logf("soak: %d jobs ran to success more than once (asynq delivers at least once)", duplicates)

	// Every archived job says why.
	reasons := map[string]int{}
	for _, p := range client.Pools() {
		for _, q := range p.Queues() {
			tasks, err := insp.ListArchivedTasks(q, asynq.PageSize(1000))
			require.NoError(t, err)
			for _, ti := range tasks {
				switch {
				case strings.Contains(ti.LastErr, "failed more times than max_retry allows (3 failures, max_retry 2): job") &&
					strings.Contains(ti.LastErr, "the ledger rejects it"):
					reasons["too many failures"]++
				case strings.Contains(ti.LastErr, "malformed payload"):
					reasons["malformed"]++
				default:
					t.Errorf("archived job %s without a known reason: %q", ti.ID, ti.LastErr)
				}
			}
		}
	}
	require.Equal(t, map[string]int{"too many failures": total * 3 / 100, "malformed": total / 100}, reasons)
}
