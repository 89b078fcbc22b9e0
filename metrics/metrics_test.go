package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testleak"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/metrics"
	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

func TestMain(m *testing.M) { testleak.VerifyMain(m) }

// seen is what the handlers saw, counted inside them.
type seen struct {
	mu       sync.Mutex
	outcomes map[string]int // pool/tier/outcome
	first    map[string]int // pool/tier: first attempts started
	attempts map[string]int // pool/tier: every attempt
	running  map[string]*atomic.Int64
	peak     map[string]int64
}

func (s *seen) add(m map[string]int, k string) {
	s.mu.Lock()
	m[k]++
	s.mu.Unlock()
}

func (s *seen) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, v := range s.outcomes {
		if !strings.HasSuffix(k, "/retried") {
			n += v
		}
	}
	return n
}

// scrape reads the metrics as Prometheus would.
func scrape(t *testing.T, url string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err)
	return fams, string(body)
}

// value returns the metric of family name whose labels are labels
// (name=value pairs), and whether it exists.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (*dto.Metric, bool) {
	f, ok := fams[name]
	if !ok {
		return nil, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range f.Metric {
		if len(m.Label) != len(want) {
			continue
		}
		for _, l := range m.Label {
			if want[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		return m, true
	}
	return nil, false
}

// A flood through two pools, scraped while it runs: the counts by outcome
// equal what the handlers returned, no scrape ever shows more slots in use
// than a pool's size, and the wait histogram counts exactly the jobs that
// started.
func TestMetricsDuringAFlood(t *testing.T) {
	r := testredis.New(t)
	policy, err := priority.New(priority.Config{Tiers: []string{"regulatory", "adhoc"}, Default: "adhoc"})
	require.NoError(t, err)
	sizes := map[string]int{"fast": 3, "batch": 2}
	cfg := queues.Config{
		Namespace: r.Namespace(t), Tiers: policy, ShutdownTimeout: 5 * time.Second,
		Logger:               slog.New(slog.DiscardHandler),
		RetryDelay:           func(int, error) time.Duration { return 0 },
		DelayedCheckInterval: 100 * time.Millisecond,
		Pools: []queues.PoolConfig{
			{Name: "fast", Size: sizes["fast"], JobTypes: []string{"fast:run"}, PollInterval: 10 * time.Millisecond, MaxRetry: 1},
			{Name: "batch", Size: sizes["batch"], JobTypes: []string{"batch:run"}, Tiers: []string{"regulatory", "adhoc"},
				PollInterval: 10 * time.Millisecond, MaxRetry: queues.NoRetry},
		},
	}
	s := &seen{outcomes: map[string]int{}, first: map[string]int{}, attempts: map[string]int{},
		running: map[string]*atomic.Int64{"fast": {}, "batch": {}}, peak: map[string]int64{}}
	tierOf := func(ctx context.Context) string {
		q, _ := asynq.GetQueueName(ctx)
		if i := strings.LastIndex(q, ":batch:"); i >= 0 {
			return q[i+len(":batch:"):]
		}
		return ""
	}
	handler := func(pool string) func(ctx context.Context, t *asynq.Task) error {
		return func(ctx context.Context, task *asynq.Task) error {
			tier := tierOf(ctx)
			key := pool + "/" + tier
			n := s.running[pool].Add(1)
			defer s.running[pool].Add(-1)
			s.mu.Lock()
			s.peak[pool] = max(s.peak[pool], n)
			s.mu.Unlock()
			retried, _ := asynq.GetRetryCount(ctx)
			if retried == 0 {
				s.add(s.first, key)
			}
			s.add(s.attempts, key)
			time.Sleep(2 * time.Millisecond) // a little work, so slots fill up
			switch {
			case string(task.Payload()) == "fail-once" && retried == 0:
				s.add(s.outcomes, key+"/retried")
				return errors.New("flaky: fails its first attempt")
			case string(task.Payload()) == "fail":
				s.add(s.outcomes, key+"/archived")
				return queues.Permanent(errors.New("broken for good"))
			}
			s.add(s.outcomes, key+"/succeeded")
			return nil
		}
	}
	h := queues.NewHandlers()
	h.HandleFunc("fast:run", handler("fast"))
	h.HandleFunc("batch:run", handler("batch"))

	m := metrics.New()
	run := cfg
	run.Handlers, run.Observer = h, m
	c, err := queues.NewClient(r.Client, run)
	require.NoError(t, err)
	require.NoError(t, m.Watch(c))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	require.NoError(t, c.Start(context.Background()))
	defer func() { require.NoError(t, c.Stop(context.Background())) }()

	// The flood: 150 fast jobs (every 10th fails once), 60 batch jobs over
	// two tiers (every 6th fails for good).
	var reqs []queues.Request
	for i := range 150 {
		payload := "ok"
		if i%10 == 0 {
			payload = "fail-once"
		}
		reqs = append(reqs, queues.Request{JobType: "fast:run", Payload: []byte(payload)})
	}
	for i := range 60 {
		payload, tier := "ok", "adhoc"
		if i%6 == 0 {
			payload = "fail"
		}
		if i%2 == 0 {
			tier = "regulatory"
		}
		reqs = append(reqs, queues.Request{JobType: "batch:run", Payload: []byte(payload), Options: queues.EnqueueOptions{Tier: tier}})
	}
	_, err = c.EnqueueMany(context.Background(), reqs)
	require.NoError(t, err)

	scrapes := 0
	var last map[string]*dto.MetricFamily
	var lastText string
	testwait.For(t, 60*time.Second, "every job to finish, scraping all along", func() bool {
		fams, text := scrape(t, srv.URL)
		scrapes++
		up, ok := value(fams, "compartment_redis_up")
		require.True(t, ok)
		require.Equal(t, 1.0, up.GetGauge().GetValue(), "the scrape read Redis")
		for pool, size := range sizes {
			local, ok := value(fams, "compartment_pool_slots_in_use", "pool", pool)
			require.True(t, ok)
			require.LessOrEqual(t, local.GetGauge().GetValue(), float64(size), "pool %s in this process", pool)
			cluster, ok := value(fams, "compartment_pool_cluster_slots_in_use", "pool", pool)
			require.True(t, ok)
			require.LessOrEqual(t, cluster.GetGauge().GetValue(), float64(size), "pool %s across processes", pool)
			sz, _ := value(fams, "compartment_pool_size", "pool", pool)
			require.Equal(t, float64(size), sz.GetGauge().GetValue())
		}
		last, lastText = fams, text
		return s.total() == len(reqs)
	})
	t.Logf("%d scrapes during the flood; peaks inside the handlers: fast %d/3, batch %d/2", scrapes, s.peak["fast"], s.peak["batch"])
	require.Greater(t, scrapes, 1)

	// The observer counts a job once asynq has its verdict, just after
	// the handler returned: wait for the last ones.
	counted := func(fams map[string]*dto.MetricFamily) int {
		n := 0
		for _, mt := range fams["compartment_jobs_total"].GetMetric() {
			n += int(mt.GetCounter().GetValue())
		}
		return n
	}
	wantCounted := len(reqs) + s.outcomes["fast//retried"]
	testwait.For(t, 5*time.Second, "the observer to count every job", func() bool {
		last, lastText = scrape(t, srv.URL)
		return counted(last) == wantCounted
	})

	for _, pt := range []struct{ pool, tier string }{{"fast", ""}, {"batch", "regulatory"}, {"batch", "adhoc"}} {
		key := pt.pool + "/" + pt.tier
		for _, o := range queues.JobOutcomes {
			mt, ok := value(last, "compartment_jobs_total", "pool", pt.pool, "tier", pt.tier, "outcome", string(o))
			require.True(t, ok, "series %s %s", key, o)
			require.Equal(t, float64(s.outcomes[key+"/"+string(o)]), mt.GetCounter().GetValue(), "jobs %s %s", key, o)
		}
		wait, ok := value(last, "compartment_job_wait_seconds", "pool", pt.pool, "tier", pt.tier)
		require.True(t, ok)
		require.Equal(t, uint64(s.first[key]), wait.GetHistogram().GetSampleCount(), "wait histogram count = jobs started, %s", key)
		run, _ := value(last, "compartment_job_run_seconds", "pool", pt.pool, "tier", pt.tier)
		require.Equal(t, uint64(s.attempts[key]), run.GetHistogram().GetSampleCount(), "run histogram count = attempts, %s", key)
	}
	require.Equal(t, 15, s.outcomes["fast//retried"], "the flaky jobs failed once each")
	require.Equal(t, 10, s.outcomes["batch/regulatory/archived"]+s.outcomes["batch/adhoc/archived"])

	// The queues as Redis has them: nothing pending, the archived jobs kept.
	for _, tier := range []string{"regulatory", "adhoc"} {
		p, _ := value(last, "compartment_queue_pending", "pool", "batch", "tier", tier)
		require.Equal(t, 0.0, p.GetGauge().GetValue())
		a, _ := value(last, "compartment_queue_archived", "pool", "batch", "tier", tier)
		require.Equal(t, float64(s.outcomes["batch/"+tier+"/archived"]), a.GetGauge().GetValue())
	}
	promtoolCheck(t, lastText)
}

// promtoolCheck runs `promtool check metrics` on a scrape when promtool is
// installed (Debian package prometheus; CI installs it). The scrape is also
// written where METRICS_SCRAPE_FILE says, for a CI step to check.
func promtoolCheck(t *testing.T, text string) {
	t.Helper()
	if path := os.Getenv("METRICS_SCRAPE_FILE"); path != "" {
		require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed (apt-get install prometheus): the lint of the scrape is skipped; the rest of the test ran")
		return
	}
	file := filepath.Join(t.TempDir(), "scrape.txt")
	require.NoError(t, os.WriteFile(file, []byte(text), 0o644))
	cmd := exec.Command("sh", "-c", fmt.Sprintf("%q check metrics < %q", promtool, file))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool check metrics:\n%s", out)
	t.Logf("promtool check metrics: ok")
}

// When Redis fails, a scrape still answers, with compartment_redis_up 0
// and the process's own numbers.
func TestScrapeWhenRedisIsDown(t *testing.T) {
	r := testredis.New(t)
	if r.Mini == nil {
		t.Skip("needs the embedded Redis, which the test can stop; it runs when TEST_REDIS_URL is unset")
	}
	c, err := queues.NewClient(r.Client, queues.Config{
		Namespace: r.Namespace(t),
		Pools:     []queues.PoolConfig{{Name: "fast", Size: 2, JobTypes: []string{"fast:run"}}},
	})
	require.NoError(t, err)
	m := metrics.New()
	require.NoError(t, m.Watch(c))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	fams, _ := scrape(t, srv.URL)
	up, _ := value(fams, "compartment_redis_up")
	require.Equal(t, 1.0, up.GetGauge().GetValue())
	r.Mini.SetError("LOADING the test took Redis away")
	defer r.Mini.SetError("")
	fams, _ = scrape(t, srv.URL)
	up, _ = value(fams, "compartment_redis_up")
	require.Equal(t, 0.0, up.GetGauge().GetValue())
	size, ok := value(fams, "compartment_pool_size", "pool", "fast")
	require.True(t, ok)
	require.Equal(t, 2.0, size.GetGauge().GetValue())
	_, ok = value(fams, "compartment_queue_pending", "pool", "fast", "tier", "")
	require.False(t, ok, "no queue numbers without Redis")
}

// The door's limits and refusals are in the scrape: the refusals counted
// from Redis, so another producer's count too.
func TestDoorMetrics(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	tiers, err := priority.New(priority.Config{Tiers: []string{"regulatory", "adhoc"}, Default: "adhoc"})
	require.NoError(t, err)
	cfg := queues.Config{
		Namespace: r.Namespace(t), Tiers: tiers,
		Pools: []queues.PoolConfig{{Name: "batch", Size: 1, JobTypes: []string{"report"}, Tiers: []string{"regulatory", "adhoc"},
			MaxBacklog: 3, TierLimits: map[string]int{"adhoc": 1}}},
	}
	c, err := queues.NewClient(r.Client, cfg)
	require.NoError(t, err)
	producer, err := queues.NewClient(r.Client, cfg) // another service
	require.NoError(t, err)
	ctx := context.Background()
	enqueue := func(c *queues.Client, tier string) error {
		_, err := c.Enqueue(ctx, "report", nil, queues.EnqueueOptions{Tier: tier})
		return err
	}
	require.NoError(t, enqueue(producer, "adhoc"))
	require.ErrorIs(t, enqueue(producer, "adhoc"), queues.ErrBacklogFull)
	require.ErrorIs(t, enqueue(c, "adhoc"), queues.ErrBacklogFull)
	require.NoError(t, enqueue(c, "regulatory"))
	require.NoError(t, enqueue(c, "regulatory"))
	require.ErrorIs(t, enqueue(c, "regulatory"), queues.ErrBacklogFull)

	m := metrics.New()
	require.NoError(t, m.Watch(c))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	fams, _ := scrape(t, srv.URL)
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"compartment_queue_backlog_limit", []string{"pool", "batch", "tier", "adhoc"}, 1},
		{"compartment_queue_backlog_limit", []string{"pool", "batch", "tier", "regulatory"}, 3},
		{"compartment_door_refused_total", []string{"pool", "batch", "tier", "adhoc", "reason", "backlog"}, 2},
		{"compartment_door_refused_total", []string{"pool", "batch", "tier", "regulatory", "reason", "backlog"}, 1},
		{"compartment_door_refused_total", []string{"pool", "batch", "tier", "adhoc", "reason", "rate"}, 0},
		{"compartment_door_waiting_requests", []string{"pool", "batch"}, 0},
	} {
		got, ok := value(fams, want.name, want.labels...)
		require.True(t, ok, "%s %v", want.name, want.labels)
		v := got.GetGauge().GetValue()
		if got.Counter != nil {
			v = got.GetCounter().GetValue()
		}
		require.Equal(t, want.value, v, "%s %v", want.name, want.labels)
	}
}

// A pool's reservations and maximum waits are in the scrape, so an alert
// can compare the oldest wait with the limit.
func TestSteeringMetrics(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	tiers, err := priority.New(priority.Config{Tiers: []string{"regulatory", "close", "adhoc"}, Default: "adhoc"})
	require.NoError(t, err)
	c, err := queues.NewClient(r.Client, queues.Config{Namespace: r.Namespace(t), Tiers: tiers,
		Pools: []queues.PoolConfig{{Name: "batch", Size: 4, JobTypes: []string{"report"}, Tiers: []string{"regulatory", "close", "adhoc"},
			Reserved: map[string]int{"regulatory": 1}, MaxWait: map[string]time.Duration{"adhoc": 90 * time.Second}}}})
	require.NoError(t, err)
	m := metrics.New()
	require.NoError(t, m.Watch(c))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	fams, _ := scrape(t, srv.URL)
	got, ok := value(fams, "compartment_queue_reserved_slots", "pool", "batch", "tier", "regulatory")
	require.True(t, ok)
	require.Equal(t, 1.0, got.GetGauge().GetValue())
	got, ok = value(fams, "compartment_queue_max_wait_seconds", "pool", "batch", "tier", "adhoc")
	require.True(t, ok)
	require.Equal(t, 90.0, got.GetGauge().GetValue())
	_, ok = value(fams, "compartment_queue_max_wait_seconds", "pool", "batch", "tier", "close")
	require.False(t, ok, "only tiers with a limit")
}

// A pool's circuit breaker state is in the scrape, as every process sees it
// in Redis.
func TestBreakerMetrics(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	c, err := queues.NewClient(r.Client, queues.Config{
		Namespace: r.Namespace(t),
		Pools:     []queues.PoolConfig{{Name: "db", Size: 1, JobTypes: []string{"db:run"}, Breaker: &queues.BreakerConfig{}}},
	})
	require.NoError(t, err)
	m := metrics.New()
	require.NoError(t, m.Watch(c))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	state := func(s queues.BreakerStatus) float64 {
		fams, _ := scrape(t, srv.URL)
		got, ok := value(fams, "compartment_breaker_state", "pool", "db", "state", string(s))
		require.True(t, ok, string(s))
		return got.GetGauge().GetValue()
	}
	require.Equal(t, 1.0, state(queues.BreakerClosed))
	require.Equal(t, 0.0, state(queues.BreakerOpen))
	_, err = c.ForceBreaker(context.Background(), "db", queues.BreakerForceOpen)
	require.NoError(t, err)
	require.Equal(t, 1.0, state(queues.BreakerOpen))
	require.Equal(t, 0.0, state(queues.BreakerClosed))
}

// A resized pool's size gauge is the size in effect, and so is what
// "full" compares with.
func TestResizedPoolSize(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	c, err := queues.NewClient(r.Client, queues.Config{
		Namespace: r.Namespace(t),
		Pools:     []queues.PoolConfig{{Name: "batch", Size: 2, MaxSize: 5, JobTypes: []string{"report:run"}}},
	})
	require.NoError(t, err)
	m := metrics.New()
	require.NoError(t, m.Watch(c))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	require.NoError(t, c.Resize(context.Background(), "batch", 5))
	fams, _ := scrape(t, srv.URL)
	size, ok := value(fams, "compartment_pool_size", "pool", "batch")
	require.True(t, ok)
	require.Equal(t, 5.0, size.GetGauge().GetValue())
	require.NoError(t, c.ResetSize(context.Background(), "batch"))
	fams, _ = scrape(t, srv.URL)
	size, _ = value(fams, "compartment_pool_size", "pool", "batch")
	require.Equal(t, 2.0, size.GetGauge().GetValue())
}

// The breaker's changes of state, counted by the process that made them
// through Config.OnBreakerChange: a trip-and-recover run in a worker
// counts closed -> open -> half-open -> closed once each; every possible
// transition's series is there at zero from the start; a change an
// operator forces counts in the forcing client's metrics.
func TestBreakerTransitionsMetric(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	ns := r.Namespace(t)
	m := metrics.New()
	var calls atomic.Int32
	h := queues.NewHandlers()
	h.Handle("db:run", asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		if calls.Add(1) <= 2 { // the dependency fails the first two calls
			return errors.New("database unreachable")
		}
		return nil
	}))
	cfg := queues.Config{
		Namespace: ns, Logger: slog.New(slog.DiscardHandler), Handlers: h,
		Pools: []queues.PoolConfig{{Name: "db", Size: 1, JobTypes: []string{"db:run"}, Scope: queues.ScopeProcess, PollInterval: 10 * time.Millisecond,
			Breaker: &queues.BreakerConfig{MinCalls: 2, Window: 10 * time.Second, CoolDown: time.Second, Probes: 1}}},
		RetryDelay:           func(int, error) time.Duration { return 10 * time.Millisecond },
		DelayedCheckInterval: 50 * time.Millisecond,
		Observer:             m, OnBreakerChange: m.BreakerChanged,
	}
	c, err := queues.NewClient(r.Client, cfg)
	require.NoError(t, err)
	require.NoError(t, m.Watch(c))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	transitions := func() map[string]float64 {
		fams, _ := scrape(t, srv.URL)
		out := map[string]float64{}
		if f, ok := fams["compartment_breaker_transitions_total"]; ok {
			for _, mt := range f.Metric {
				l := map[string]string{}
				for _, p := range mt.Label {
					l[p.GetName()] = p.GetValue()
				}
				require.Equal(t, "db", l["pool"])
				out[l["from"]+" -> "+l["to"]] = mt.GetCounter().GetValue()
			}
		}
		return out
	}
	require.Equal(t, map[string]float64{"closed -> open": 0, "open -> half-open": 0, "half-open -> closed": 0, "half-open -> open": 0, "open -> closed": 0},
		transitions(), "every series from the start")

	for i := range 4 {
		_, err := c.Enqueue(context.Background(), "db:run", nil, queues.EnqueueOptions{ID: fmt.Sprint(i)})
		require.NoError(t, err)
	}
	require.NoError(t, c.Start(context.Background()))
	defer func() { require.NoError(t, c.Stop(context.Background())) }()
	testwait.For(t, 30*time.Second, "the breaker to trip and recover", func() bool {
		return transitions()["half-open -> closed"] == 1
	})
	require.Equal(t, map[string]float64{"closed -> open": 1, "open -> half-open": 1, "half-open -> closed": 1, "half-open -> open": 0, "open -> closed": 0},
		transitions())

	// An operator opens and resets it from this client: this process made
	// those changes, so its metrics count them.
	_, err = c.ForceBreaker(context.Background(), "db", queues.BreakerForceOpen)
	require.NoError(t, err)
	_, err = c.ForceBreaker(context.Background(), "db", queues.BreakerReset)
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"closed -> open": 2, "open -> half-open": 1, "half-open -> closed": 1, "half-open -> open": 0, "open -> closed": 1},
		transitions())
}

// The autoscaling gauge follows the work: a process-scoped pool asks for
// its backlog over its size; a cluster-scoped pool never asks for more
// than its size in effect needs, however long its backlog, until a resize
// raises the size; a drained pool asks for none. The reader's config
// allows the batch pool 8 per process, the two workers run 2 each: the
// gauge counts by what the live workers announce. Running jobs are
// counted inside the handlers.
func TestUsefulWorkersGauge(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	ns := r.Namespace(t)
	ctx := context.Background()
	pools := func(batchMax int) []queues.PoolConfig {
		return []queues.PoolConfig{
			{Name: "orders", Size: 2, JobTypes: []string{"order:run"}, Scope: queues.ScopeProcess, PollInterval: 10 * time.Millisecond},
			{Name: "batch", Size: 2, MaxSize: batchMax, JobTypes: []string{"report:run"}, PollInterval: 10 * time.Millisecond},
		}
	}
	reader, err := queues.NewClient(r.Client, queues.Config{Namespace: ns, Pools: pools(8), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	m := metrics.New()
	require.NoError(t, m.Watch(reader))
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	useful := func() map[string]float64 {
		fams, _ := scrape(t, srv.URL)
		out := map[string]float64{}
		for _, pool := range []string{"orders", "batch"} {
			v, ok := value(fams, "compartment_pool_useful_workers", "pool", pool)
			require.True(t, ok, pool)
			out[pool] = v.GetGauge().GetValue()
		}
		return out
	}
	require.Equal(t, map[string]float64{"orders": 0, "batch": 0}, useful(), "nothing to do")

	enqueue := func(jobType string, n int) {
		for range n {
			_, err := reader.Enqueue(ctx, jobType, nil, queues.EnqueueOptions{})
			require.NoError(t, err)
		}
	}
	enqueue("order:run", 10)
	enqueue("report:run", 20)
	// No worker yet: 10 orders over 2 per process; the batch pool's size
	// of 2 over the reader's own max_size of 8.
	require.Equal(t, map[string]float64{"orders": 5, "batch": 1}, useful(), "before any worker runs")

	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	var running sync.Map // pool -> *atomic.Int64, counted inside the handlers
	counter := func(pool string) *atomic.Int64 {
		v, _ := running.LoadOrStore(pool, new(atomic.Int64))
		return v.(*atomic.Int64)
	}
	block := func(pool string) asynq.HandlerFunc {
		return func(ctx context.Context, _ *asynq.Task) error {
			counter(pool).Add(1)
			defer counter(pool).Add(-1)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}
	}
	for range 2 {
		h := queues.NewHandlers()
		h.Handle("order:run", block("orders"))
		h.Handle("report:run", block("batch"))
		w, err := queues.NewClient(r.Client, queues.Config{Namespace: ns, Pools: pools(2), Handlers: h, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		require.NoError(t, w.Start(ctx))
		defer func() { require.NoError(t, w.Stop(ctx)) }()
	}
	defer releaseAll() // before the workers stop
	testwait.For(t, 30*time.Second, "both workers running 2 orders each and the batch pool full", func() bool {
		return counter("orders").Load() == 4 && counter("batch").Load() == 2
	})
	// The batch pool's cap is reached with 18 reports waiting: one
	// process of 2 runs its whole size, so one is useful.
	testwait.For(t, 30*time.Second, "the gauge to count by the workers' own max_size", func() bool {
		return useful()["batch"] == 1 && useful()["orders"] == 5
	})
	enqueue("report:run", 20)
	require.Equal(t, 1.0, useful()["batch"], "a longer backlog behind a full cluster-wide cap asks for no more processes")

	require.NoError(t, reader.Resize(ctx, "batch", 6))
	testwait.For(t, 30*time.Second, "the workers to take what the resize allows", func() bool {
		return counter("batch").Load() == 4 // two workers of 2
	})
	require.Equal(t, map[string]float64{"orders": 5, "batch": 3}, useful(), "size 6 over 2 per process")
	require.LessOrEqual(t, counter("batch").Load(), int64(4))

	require.NoError(t, reader.ResetSize(ctx, "batch"))
	releaseAll()
	testwait.For(t, 60*time.Second, "the pools to drain", func() bool {
		u := useful()
		return u["orders"] == 0 && u["batch"] == 0
	})
}
