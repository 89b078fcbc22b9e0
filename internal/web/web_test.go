package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/testleak"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/internal/web"
	"github.com/lci-labs/compartment/metrics"
)

func TestMain(m *testing.M) { testleak.VerifyMain(m) }

const testToken = "0123456789abcdef0123"

// stack is a worker with its listener, on the test's Redis and database,
// whose reports hold their slot after writing their file until released.
type stack struct {
	t       *testing.T
	redis   *testredis.Redis
	cfg     *app.Config
	worker  *app.Worker
	enq     *app.Enqueuer
	srv     *web.ForWorker
	hist    *web.History
	url     string
	logs    apptest.SyncBuffer // the worker's and the listener's log
	held    atomic.Int64       // reports written and held
	release chan struct{}      // a send lets one held report finish; closed: all
	once    sync.Once
}

// newStack builds the stack with token (empty: read-only); the pools are
// not started.
func newStack(t *testing.T, token string) *stack {
	t.Helper()
	return newStackWith(t, nil, func(cfg *app.Config) { cfg.HTTP.Listen, cfg.HTTP.Token = "127.0.0.1:0", token })
}

// newStackWith builds the stack on the test config (apptest.Config) edited
// by edit and, once loaded, adjusted by adjust (each if not nil); the pools
// are not started.
func newStackWith(t *testing.T, edit func(path string), adjust func(*app.Config)) *stack {
	t.Helper()
	r := testredis.New(t)
	path := apptest.Config(t, r, "")
	// Few orders: these tests read the dashboard, not the reports' sums,
	// and seeding is most of a stack's start under -race.
	apptest.ReplaceInConfig(t, path, "seed_orders: 3000", "seed_orders: 200")
	if edit == nil {
		// By default the batch pool has a door and a breaker, as
		// configs/worker.yaml's has, so the page shows both (the breaker
		// does not trip here).
		edit = func(path string) {
			apptest.ReplaceInConfig(t, path, "    max_retry: 2\n", "    max_retry: 2\n    max_backlog: 100\n    tier_limits: {adhoc: 10}\n    breaker: {min_calls: 50, window: 1m}\n")
		}
	}
	edit(path)
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)
	if adjust != nil {
		adjust(cfg)
	}
	s := &stack{t: t, redis: r, cfg: cfg, release: make(chan struct{})}
	m := metrics.New()
	s.hist = &web.History{Next: m, Every: 200 * time.Millisecond}
	log := slog.New(slog.NewTextHandler(&s.logs, nil))
	s.worker, err = app.NewWorker(context.Background(), cfg, app.WorkerOptions{Logger: log, Observer: s.hist, OnBreakerChange: m.BreakerChanged,
		OnReportDone: func(handlers.ReportPayload, reports.Result) {
			s.held.Add(1)
			<-s.release
		}})
	require.NoError(t, err)
	s.srv, err = web.StartForWorker(context.Background(), s.worker, m, s.hist, nil, log)
	require.NoError(t, err)
	s.enq, err = app.NewEnqueuerFor(cfg, s.worker.Redis)
	require.NoError(t, err)
	s.url = strings.TrimSuffix(s.srv.URL(), "/")
	t.Cleanup(func() {
		s.releaseAll()
		require.NoError(t, s.srv.Stop(context.Background()))
		s.enq.Close()
		s.worker.Close()
	})
	return s
}

func (s *stack) releaseAll() { s.once.Do(func() { close(s.release) }) }

// releaseOne lets one held report finish (waiting for one to be held).
func (s *stack) releaseOne() {
	select {
	case s.release <- struct{}{}:
	case <-time.After(30 * time.Second):
		s.t.Fatal("no report was held to release")
	}
}

func (s *stack) start() { require.NoError(s.t, s.worker.Start(context.Background())) }

func (s *stack) get(path string) (int, string) {
	s.t.Helper()
	resp, err := http.Get(s.url + path)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return resp.StatusCode, string(b)
}

func (s *stack) post(path string, form url.Values, token string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+path, strings.NewReader(form.Encode()))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if token != "" {
		req.Header.Set(web.TokenHeader, token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// monthEnd enqueues the shipped month-end plan for 2026-10.
func (s *stack) monthEnd() app.PlanResult {
	s.t.Helper()
	plan, err := reports.LoadPlan(apptest.RepoPath("configs/month-end.yaml"), "2026-10", s.cfg.Catalog, s.cfg.Policy)
	require.NoError(s.t, err)
	res, err := s.enq.EnqueuePlan(context.Background(), plan)
	require.NoError(s.t, err)
	return res
}

// pausedKeys returns the value of each batch queue's pause key ("" when
// not paused).
func (s *stack) pausedKeys() []string {
	s.t.Helper()
	p, err := s.enq.Client.Pool("batch")
	require.NoError(s.t, err)
	var out []string
	for _, q := range p.Queues() {
		v, _ := s.redis.Client.Get(context.Background(), "asynq:{"+q+"}:paused").Result()
		out = append(out, v)
	}
	return out
}

// operatorPaused reports whether every batch queue holds an operator's
// pause (asynq's pause key, not the gate's mark).
func (s *stack) operatorPaused() bool {
	for _, v := range s.pausedKeys() {
		if v == "" || v == "compartment-gate" {
			return false
		}
	}
	return true
}

func (s *stack) adhocQueue() string {
	batch, err := s.enq.Client.Pool("batch")
	require.NoError(s.t, err)
	return batch.Queues()[3]
}

// brokenReport enqueues a report job whose payload no handler can read,
// waits until it has failed for good, and returns its ID.
func (s *stack) brokenReport() string {
	s.t.Helper()
	queue := s.adhocQueue()
	aq := asynq.NewClientFromRedisClient(s.redis.Client)
	info, err := aq.Enqueue(asynq.NewTask(handlers.TypeReport, []byte(`{"report":`)), asynq.Queue(queue), asynq.MaxRetry(0))
	require.NoError(s.t, err)
	testwait.For(s.t, 30*time.Second, "the broken job to be archived", func() bool {
		ti, err := s.enq.Insp.GetTaskInfo(queue, info.ID)
		return err == nil && ti.State == asynq.TaskStateArchived
	})
	return info.ID
}

// /healthz answers while the process runs; /readyz only while Redis
// answers and every pool runs.
func TestProbes(t *testing.T) {
	s := newStack(t, "")
	code, body := s.get("/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)

	code, body = s.get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "pools not started yet")
	require.Contains(t, body, "the pools are not running")

	s.start()
	code, body = s.get("/readyz")
	require.Equal(t, http.StatusOK, code, body)

	require.NoError(t, s.worker.Stop(context.Background()))
	code, _ = s.get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "pools stopped")
	code, _ = s.get("/healthz")
	require.Equal(t, http.StatusOK, code)

	if s.redis.Mini != nil {
		s.redis.Mini.SetError("LOADING the test took Redis away")
		defer s.redis.Mini.SetError("")
		code, body = s.get("/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Contains(t, body, "not ready: redis at "+s.worker.Redis.Addr+" does not answer")
	}
}

// /api/status is what `enqueue status -json` prints: the same JSON, read
// while a month-end holds the batch pool full.
func TestAPIStatusIsEnqueueStatus(t *testing.T) {
	s := newStack(t, "")
	s.start()
	s.monthEnd()
	testwait.For(t, 30*time.Second, "the batch pool to fill (2 reports held)", func() bool { return s.held.Load() == 2 })
	code, body := s.get("/api/status")
	require.Equal(t, http.StatusOK, code)
	st, err := s.enq.Status(context.Background())
	require.NoError(t, err)
	var got app.Status
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	// The same fields, the same numbers; only the oldest pending job's age
	// has grown between the two reads.
	var want bytes.Buffer
	enc := json.NewEncoder(&want)
	enc.SetIndent("", "  ")
	require.NoError(t, enc.Encode(st))
	var wantAny, gotAny any
	require.NoError(t, json.Unmarshal(want.Bytes(), &wantAny))
	require.NoError(t, json.Unmarshal([]byte(body), &gotAny))
	for i, p := range st.Pools {
		for j, q := range p.Queues {
			require.InDelta(t, q.OldestPendingSeconds, got.Pools[i].Queues[j].OldestPendingSeconds, 2, q.Queue)
			wantAny.(map[string]any)["pools"].([]any)[i].(map[string]any)["queues"].([]any)[j].(map[string]any)["oldest_pending_seconds"] = 0
			gotAny.(map[string]any)["pools"].([]any)[i].(map[string]any)["queues"].([]any)[j].(map[string]any)["oldest_pending_seconds"] = 0
		}
	}
	require.Equal(t, wantAny, gotAny)
	require.Equal(t, "batch", got.Pools[2].Name)
	require.Equal(t, 2, got.Pools[2].Active)
	require.True(t, got.Pools[2].IsFull)
}

// Actions need the token; a refused request, an unknown pool or job
// changes nothing.
func TestActions(t *testing.T) {
	t.Run("read-only", func(t *testing.T) {
		s := newStack(t, "")
		code, body := s.post("/actions/pause", url.Values{"pool": {"batch"}}, testToken)
		require.Equal(t, http.StatusForbidden, code)
		require.Equal(t, "refused: this worker is read-only (no http.token_file in its config)", body)
		require.Equal(t, []string{"", "", "", ""}, s.pausedKeys())
	})

	s := newStack(t, testToken)
	for _, token := range []string{"", "wrong-token-0123456789"} {
		code, body := s.post("/actions/pause", url.Values{"pool": {"batch"}}, token)
		require.Equal(t, http.StatusUnauthorized, code)
		require.Equal(t, "refused: missing or wrong token", body)
		require.Equal(t, []string{"", "", "", ""}, s.pausedKeys(), "nothing changed")
	}
	code, body := s.post("/actions/pause", url.Values{"pool": {"nope"}}, testToken)
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, `unknown pool "nope" (pools: ["order" "search" "batch"])`, body)
	code, body = s.post("/actions/explode", url.Values{"pool": {"batch"}}, testToken)
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, `unknown action "explode"`)
	require.Equal(t, []string{"", "", "", ""}, s.pausedKeys(), "nothing changed")

	// The token as a form field works too (a form without JavaScript).
	code, body = s.post("/actions/pause", url.Values{"pool": {"batch"}, "token": {testToken}}, "")
	require.Equal(t, http.StatusOK, code, body)
	require.True(t, s.operatorPaused())
	code, body = s.post("/actions/resume", url.Values{"pool": {"batch"}}, testToken)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, []string{"", "", "", ""}, s.pausedKeys())

	// Retry: only an archived job of one of our queues.
	s.start()
	id := s.brokenReport()
	queue := s.adhocQueue()
	code, body = s.post("/actions/retry", url.Values{"queue": {"elsewhere:q"}, "id": {id}}, testToken)
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, `unknown queue "elsewhere:q"`, body)
	code, body = s.post("/actions/retry", url.Values{"queue": {queue}, "id": {"nope"}}, testToken)
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, `no job "nope"`)
	later, err := asynq.NewClientFromRedisClient(s.redis.Client).Enqueue(asynq.NewTask(handlers.TypeReport, nil), asynq.Queue(queue), asynq.ProcessIn(time.Hour))
	require.NoError(t, err)
	code, body = s.post("/actions/retry", url.Values{"queue": {queue}, "id": {later.ID}}, testToken)
	require.Equal(t, http.StatusConflict, code)
	require.Equal(t, `job "`+later.ID+`" is scheduled, not archived: nothing to retry`, body)
	code, _ = s.post("/actions/retry", url.Values{"queue": {queue}, "id": {id}}, "")
	require.Equal(t, http.StatusUnauthorized, code)
	ti, err := s.enq.Insp.GetTaskInfo(queue, id)
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateArchived, ti.State, "a refused retry changes nothing")

	// The page lists it with its reason.
	_, page := s.get("/")
	require.Contains(t, page, id)
	require.Contains(t, page, "malformed payload", "the failure's reason is shown")
	require.NotContains(t, page, "skip retry", "without asynq's note to itself")

	code, body = s.post("/actions/retry", url.Values{"queue": {queue}, "id": {id}}, testToken)
	require.Equal(t, http.StatusOK, code, body)
	var metricsText string
	testwait.For(t, 30*time.Second, "the retried job to run and fail again", func() bool {
		_, metricsText = s.get("/metrics")
		return strings.Contains(metricsText, `compartment_jobs_total{outcome="archived",pool="batch",tier="adhoc"} 2`)
	})
	require.Contains(t, metricsText, `compartment_jobs_total{outcome="archived",pool="batch",tier="adhoc"} 2`, "it ran twice, archived twice")
}
