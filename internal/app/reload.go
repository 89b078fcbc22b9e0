package app

import (
	"context"
	"fmt"
	"reflect"
	"slices"

	"github.com/lci-labs/compartment/queues"
)

// Reload puts cfg, a config file loaded again (Load), in place of the
// running worker's, without stopping it: the priorities (tier order, each
// report's tier, the default tier) and the pools' settings. The engine
// applies the pools (queues.Client.Reconfigure: most settings at the next
// job; a pool whose asynq server must be rebuilt is drained and started
// again while the others run); the schedules enqueue their next runs with
// the new report tiers, and the enqueuers the worker made (schedules, the
// HTTP listener) route by the new pools. The HTTP listener's token is the
// one cfg read from http.token_file (or none, when cfg names no file): it
// is in effect from the listener's next request.
//
// cfg is checked in full before anything changes, and refused as a
// *queues.ConfigError listing every problem, the running configuration
// kept, when it would change what the worker was started on: redis,
// namespace, database, reports (the catalog, whose content the handlers
// hold), output_dir, report_min_duration, report_retention, schedules,
// http.listen, shutdown_timeout, delayed_check_interval, recover_after; which pools exist, their job_types and scope,
// and whether each has a breaker; or a pool's database share (a pool may run at most as many jobs
// at once as the share it was started with). Reload returns what changed,
// per pool.
func (w *Worker) Reload(ctx context.Context, cfg *Config) ([]queues.PoolChange, error) {
	if problems := w.fixedProblems(cfg); len(problems) > 0 {
		return nil, &queues.ConfigError{Source: cfg.Path, Problems: problems}
	}
	changes, err := w.Client.Reconfigure(ctx, cfg.Engine)
	if ce, ok := err.(*queues.ConfigError); ok {
		ce.Source = cfg.Path
	}
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	enqs := slices.Clone(w.enqueuers)
	w.mu.Unlock()
	for _, e := range enqs {
		if err := e.reload(ctx, cfg); err != nil {
			return changes, err
		}
	}
	w.current.Store(cfg)
	return changes, nil
}

// ReloadToken reads http.token_file of the configuration in effect again
// and, when it holds another valid token, puts that token in effect
// (Current().HTTP.Token) and changes nothing else. It reports whether the
// token changed. With no token file configured it does nothing. A file
// that is missing, unreadable, empty or holds no valid token is an error
// worded as at start (never quoting the token), and the token in effect
// stays: a file caught while it is rewritten does not lock everyone out.
// A Reload that runs meanwhile wins: it read the file itself.
func (w *Worker) ReloadToken() (bool, error) {
	old := w.current.Load()
	cfg := old
	if cfg == nil {
		cfg = w.Config
	}
	if cfg.HTTP.TokenFile == "" {
		return false, nil
	}
	token, err := readToken(relativeTo(cfg.Path, cfg.HTTP.TokenFile))
	if err != nil || token == cfg.HTTP.Token {
		return false, err
	}
	next := *cfg
	next.HTTP.Token = token
	return w.current.CompareAndSwap(old, &next), nil
}

// Current returns the configuration in effect: the one the worker started
// with, or the last one Reload (or ReloadToken) put in place.
func (w *Worker) Current() *Config {
	if c := w.current.Load(); c != nil {
		return c
	}
	return w.Config
}

// fixedProblems lists what cfg would change that the running worker was
// built on. Values are not quoted: redis and database hold secrets.
func (w *Worker) fixedProblems(cfg *Config) []string {
	old := w.Current()
	var out []string
	restart := func(key string) {
		out = append(out, key+": cannot change while the worker runs (restart it)")
	}
	for _, f := range []struct {
		key      string
		old, new any
	}{
		{"redis", old.Redis.settings(), cfg.Redis.settings()},
		{"namespace", old.Namespace, cfg.Namespace},
		{"database", old.Database, cfg.Database},
		{"reports", old.Reports, cfg.Reports},
		{"reports (the catalog's content)", old.Catalog, cfg.Catalog},
		{"output_dir", old.OutputDir, cfg.OutputDir},
		{"report_min_duration", old.ReportMinDuration, cfg.ReportMinDuration},
		{"report_retention", old.ReportRetention, cfg.ReportRetention},
		{"schedules", old.File.Schedules, cfg.File.Schedules},
		// The listener's address is bound once; its token may change.
		{"http.listen", old.HTTP.Listen, cfg.HTTP.Listen},
	} {
		if !reflect.DeepEqual(f.old, f.new) {
			restart(f.key)
		}
	}
	opened := w.Config.Shares()
	for name, n := range cfg.Shares() {
		if have, ok := opened[name]; ok && n > have {
			out = append(out, fmt.Sprintf("pool %q: may now run %d jobs at once in a worker (max_size, or size for scope: process), but its database share was opened for %d: restart the worker for more",
				name, n, have))
		}
	}
	return out
}

// NewEnqueuer builds an enqueuer on the worker's Redis that follows the
// worker's reloads; the breaker changes it forces go to the worker's
// WorkerOptions.OnBreakerChange. Close leaves the Redis open.
func (w *Worker) NewEnqueuer() (*Enqueuer, error) {
	e, err := newEnqueuerFor(w.Current(), w.Redis, w.onBreakerChange)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.enqueuers = append(w.enqueuers, e)
	w.mu.Unlock()
	return e, nil
}

// reload gives the enqueuer the pools and priorities of cfg.
func (e *Enqueuer) reload(ctx context.Context, cfg *Config) error {
	ec := cfg.Engine
	ec.Handlers = nil
	if _, err := e.Client.Reconfigure(ctx, ec); err != nil {
		return fmt.Errorf("reload the enqueuer: %w", err)
	}
	e.current.Store(cfg)
	return nil
}

// now returns the configuration in effect for the enqueuer: Config, or
// the last one a worker's reload gave it.
func (e *Enqueuer) now() *Config {
	if c := e.current.Load(); c != nil {
		return c
	}
	return e.Config
}
