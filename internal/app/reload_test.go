package app_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// startRecorder records, from inside the batch pool's handler, each
// report's name and tier as it starts.
type startRecorder struct {
	mu     sync.Mutex
	starts []string // "report tier"
	// hold, when set, keeps the first report inside its handler until it
	// is closed: what the test does meanwhile cannot race its end.
	hold chan struct{}
}

func (s *startRecorder) middleware(p *queues.Pool, next asynq.Handler) asynq.Handler {
	if p.Name() != "batch" {
		return next
	}
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		rp, _ := handlers.Report.Decode(t.Payload())
		queue, _ := asynq.GetQueueName(ctx)
		s.mu.Lock()
		s.starts = append(s.starts, rp.Report+" "+queue[strings.LastIndex(queue, ":")+1:])
		first := len(s.starts) == 1
		s.mu.Unlock()
		if first && s.hold != nil {
			select {
			case <-s.hold:
			case <-ctx.Done():
			}
		}
		return next.ProcessTask(ctx, t)
	})
}

func (s *startRecorder) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.starts...)
}

// priorities writes a priorities file with tiers in the given order, and
// trial-balance in tier tb, beside the config.
func writePriorities(t *testing.T, path string, tiers, tb string) {
	t.Helper()
	body := "tiers: [" + tiers + "]\ndefault: adhoc\nreports:\n  vat-return: regulatory\n  withholding-tax: regulatory\n  trial-balance: " + tb +
		"\n  refunds-analysis: adhoc\n  top-customers: adhoc\n"
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
}

// TestWorkerReload: a running worker takes a new tier order and a new
// report mapping from a reload, without losing or repeating a queued
// report; a reload that changes what it was started on is refused with
// every problem named, and the worker goes on as it was.
func TestWorkerReload(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	path := apptest.Config(t, r, "report_min_duration: 300ms\n")
	prio := filepath.Join(filepath.Dir(path), "priorities.yaml")
	writePriorities(t, prio, "regulatory, close, management, adhoc", "close")
	apptest.ReplaceInConfig(t, path, "priorities: "+apptest.RepoPath("configs/priorities.yaml"), "priorities: priorities.yaml")
	apptest.ReplaceInConfig(t, path, "    size: 2\n    job_types: [report:run, report:bundle]", "    size: 1\n    job_types: [report:run, report:bundle]")
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)
	// The first report runs until the reload is done, so that the reports
	// queued meanwhile start under the new order however slow the reload.
	rec := &startRecorder{hold: make(chan struct{})}
	ctx := context.Background()
	w, err := app.NewWorker(ctx, cfg, app.WorkerOptions{Logger: slog.New(slog.DiscardHandler), Middleware: []queues.Middleware{rec.middleware}})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	require.NoError(t, w.Start(ctx))
	enq, err := w.NewEnqueuer()
	require.NoError(t, err)

	_, _, err = enq.EnqueueReport(ctx, "vat-return", "2026-10", "")
	require.NoError(t, err)
	testwait.For(t, 10*time.Second, "the first report to start", func() bool { return len(rec.list()) == 1 })
	for _, name := range []string{"withholding-tax", "refunds-analysis", "top-customers"} {
		_, _, err = enq.EnqueueReport(ctx, name, "2026-10", "")
		require.NoError(t, err)
	}

	// Reload: adhoc is now the highest tier, and trial-balance is adhoc.
	writePriorities(t, prio, "adhoc, management, close, regulatory", "adhoc")
	next, err := app.Load(path, nil)
	require.NoError(t, err)
	changes, err := w.Reload(ctx, next)
	require.NoError(t, err)
	require.Equal(t, []queues.PoolChange{{Pool: "batch", Changed: []string{"tier order"}, Rebuilt: []string{"tier order"}}}, changes)
	job, _, err := enq.EnqueueReport(ctx, "trial-balance", "2026-10", "")
	require.NoError(t, err)
	require.Equal(t, "adhoc", job.Tier, "the report mapping reloaded")
	close(rec.hold)

	testwait.For(t, 30*time.Second, "every report to start", func() bool { return len(rec.list()) == 5 })
	got := rec.list()
	require.Equal(t, "vat-return regulatory", got[0])
	require.ElementsMatch(t, []string{"refunds-analysis adhoc", "top-customers adhoc", "trial-balance adhoc"}, got[1:4], "adhoc first now: %q", got)
	require.Equal(t, "withholding-tax regulatory", got[4], "each report once, regulatory last: %q", got)

	// Refused: what the worker was started on, and a share too small.
	fixed := filepath.Join(filepath.Dir(path), "fixed.yaml")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	body := strings.Replace(string(data), "shutdown_timeout: 5s", "shutdown_timeout: 6s", 1)
	body = strings.Replace(body, "output_dir: ", "output_dir: /elsewhere", 1)
	body = strings.Replace(body, "    size: 1\n    job_types: [report:run, report:bundle]", "    size: 1\n    max_size: 4\n    job_types: [report:run, report:bundle]", 1)
	require.NoError(t, os.WriteFile(fixed, []byte(body), 0o600))
	bad, err := app.Load(fixed, nil)
	require.NoError(t, err)
	_, err = w.Reload(ctx, bad)
	var ce *queues.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, []string{
		"output_dir: cannot change while the worker runs (restart it)",
		`pool "batch": may now run 4 jobs at once in a worker (max_size, or size for scope: process), but its database share was opened for 1: restart the worker for more`,
	}, ce.Problems)
	require.Same(t, next, w.Current(), "the running configuration stays")

	bad.OutputDir, bad.Pools = next.OutputDir, next.Pools
	bad.Engine.Pools = next.Engine.Pools
	_, err = w.Reload(ctx, bad)
	require.ErrorContains(t, err, "shutdown_timeout: 5s to 6s: cannot change while the client runs (restart it)")
	require.Same(t, next, w.Current())

	// The same file again changes nothing and rebuilds nothing.
	again, err := app.Load(path, nil)
	require.NoError(t, err)
	changes, err = w.Reload(ctx, again)
	require.NoError(t, err)
	require.Empty(t, changes)
}

// A rotated http.token_file (a Kubernetes Secret updates it in place) is
// picked up by a reload, with the rest of the reload, and by ReloadToken
// alone; the listen address stays refused on reload; a token file caught
// broken keeps the token in effect.
func TestReloadToken(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "dashboard.token")
	writeToken := func(token string) {
		t.Helper()
		// As a Secret does it: a new file renamed over the old one.
		tmp := tokenFile + ".new"
		require.NoError(t, os.WriteFile(tmp, []byte(token+"\n"), 0o600))
		require.NoError(t, os.Rename(tmp, tokenFile))
	}
	writeToken("first-token-0123456789")
	path := apptest.Config(t, r, "http:\n  listen: 127.0.0.1:0\n  token_file: "+tokenFile+"\n")
	apptest.ReplaceInConfig(t, path, "seed_orders: 3000", "seed_orders: 100")
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)
	ctx := context.Background()
	w, err := app.NewWorker(ctx, cfg, app.WorkerOptions{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	require.Equal(t, "first-token-0123456789", w.Current().HTTP.Token)

	t.Run("reload reads the new token and applies the rest", func(t *testing.T) {
		writeToken("second-token-0123456789")
		apptest.ReplaceInConfig(t, path, "    size: 3\n    job_types: [order:create]", "    size: 2\n    job_types: [order:create]")
		next, err := app.Load(path, nil)
		require.NoError(t, err)
		changes, err := w.Reload(ctx, next)
		require.NoError(t, err, "a rotated token file does not make the reload fail")
		require.Equal(t, []queues.PoolChange{{Pool: "order", Changed: []string{"max_size", "size"}, Rebuilt: []string{"max_size"}}}, changes)
		require.Equal(t, "second-token-0123456789", w.Current().HTTP.Token)
		p, err := w.Client.Pool("order")
		require.NoError(t, err)
		require.Equal(t, 2, p.Size(), "the rest of the reload applies")
	})

	t.Run("the listen address cannot change", func(t *testing.T) {
		next, err := app.Load(path, nil)
		require.NoError(t, err)
		next.HTTP.Listen = "127.0.0.1:9"
		_, err = w.Reload(ctx, next)
		var ce *queues.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, []string{"http.listen: cannot change while the worker runs (restart it)"}, ce.Problems)
		require.Equal(t, "127.0.0.1:0", w.Current().HTTP.Listen)
	})

	t.Run("ReloadToken alone", func(t *testing.T) {
		before := w.Current()
		changed, err := w.ReloadToken()
		require.NoError(t, err)
		require.False(t, changed, "the same token")
		require.Same(t, before, w.Current(), "nothing changed")

		writeToken("third-token-0123456789")
		changed, err = w.ReloadToken()
		require.NoError(t, err)
		require.True(t, changed)
		require.Equal(t, "third-token-0123456789", w.Current().HTTP.Token)
		require.Equal(t, before.Engine.Pools, w.Current().Engine.Pools, "only the token changed")

		for _, tc := range []struct{ name, content, want string }{
			{"empty", "", "http.token_file: " + tokenFile + " is empty"},
			{"short", "short-SECRET", "http.token_file: the token in " + tokenFile + " must be one word of at least 16 characters"},
		} {
			writeToken(tc.content)
			changed, err = w.ReloadToken()
			require.EqualError(t, err, tc.want, tc.name)
			require.False(t, changed)
			require.Equal(t, "third-token-0123456789", w.Current().HTTP.Token, "%s: the token in effect stays", tc.name)
		}
		require.NoError(t, os.Remove(tokenFile))
		_, err = w.ReloadToken()
		require.ErrorContains(t, err, "http.token_file: "+tokenFile+" does not exist")
		require.Equal(t, "third-token-0123456789", w.Current().HTTP.Token)
	})
}
