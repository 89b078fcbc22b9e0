// Command worker runs the pools of a config file, each as its own asynq
// server, until SIGINT or SIGTERM; then it stops them gracefully. A second
// signal exits at once.
//
// SIGHUP reloads the config file and the priorities file it names without
// stopping the worker: new tier order, report tiers, pool sizes and the
// other pool settings take effect, queued jobs stay where they are. A pool
// whose tiers, tier order, queue_order, weights, poll_interval or
// concurrency (size for scope: process, max_size for scope: cluster)
// change gets a new asynq server while the other pools run: a
// cluster-scoped pool's old server stops once its running jobs end; a
// process-scoped pool's drains first (its running jobs get
// shutdown_timeout). An invalid file, or one that changes what the worker
// was started on (redis, namespace, database, http.listen, reports, schedules,
// shutdown_timeout, the pools that exist, their job_types or scope, a
// breaker added or removed), is refused: every problem is logged and the
// running configuration stays (see docs/STEERING.md). Of the http
// section, only the listen address is fixed: the token file is read again
// and a new token is in effect at once (the listener also rereads the
// file on its own every few seconds).
//
//	worker -config configs/worker.yaml [-log-format text|json] [-log-level info] [-http 127.0.0.1:8080]
//
// With -http (or http.listen in the config) it serves metrics, health
// probes, the status JSON and a dashboard (package internal/web).
//
// Exit codes: 0 after a clean stop, 1 when Redis or the database cannot be
// reached, or the HTTP port is in use (or on a second signal), 2 for a bad
// flag or an invalid config.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/schedule"
	"github.com/lci-labs/compartment/internal/telemetry"
	"github.com/lci-labs/compartment/internal/web"
	"github.com/lci-labs/compartment/metrics"
	"github.com/lci-labs/compartment/queues"
)

func main() {
	// SIGHUP reloads the config (run); SIGINT and SIGTERM stop the worker
	// (cli.Main).
	reload := make(chan os.Signal, 1)
	signal.Notify(reload, syscall.SIGHUP)
	cli.Main(func(ctx context.Context, env cli.Env) int {
		env.Reload = reload
		return run(ctx, env)
	})
}

// testClockOffsetEnv shifts the clock the schedules fire by, for the
// process-level tests only (internal/reliability): it lets a test bring a
// fire time seconds away instead of waiting for it.
const testClockOffsetEnv = "COMPARTMENT_TEST_CLOCK_OFFSET"

// stopGrace is how long past the shutdown timeout the worker waits for the
// pools to stop before it gives up on them.
const stopGrace = 5 * time.Second

// run runs the worker until ctx ends, then stops it gracefully.
func run(ctx context.Context, env cli.Env) int {
	stderr := env.Stderr
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	configPath := cli.ConfigFlag(fs, app.DefaultConfigPath, app.DefaultConfigSummary)
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	httpAddr := fs.String("http", "", "serve metrics, probes and the dashboard on `host:port` (overrides http.listen)")
	if code, ok := cli.Parse(fs, env.Args, env.Stdout, stderr, "usage: worker [-config FILE] [flags]\n\nRuns the pools of FILE until SIGINT or SIGTERM.\n"); !ok {
		return code
	}
	log, err := cli.NewLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "worker:", err)
		return cli.ExitUsage
	}
	cfg, err := app.Load(*configPath, env.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, cli.Message("worker", err))
		return cli.ExitCode(err)
	}
	tracing, err := telemetry.Setup(ctx, "compartment-worker", env.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, "worker:", err)
		return cli.ExitUsage
	}
	defer func() {
		if err := tracing.Shutdown(); err != nil {
			log.Warn("tracing: spans not sent at exit", "error", err)
		}
	}()
	tracing.Announce(log)
	if *httpAddr != "" {
		if err := app.CheckListen(*httpAddr); err != nil {
			fmt.Fprintln(stderr, "worker: -http:", err)
			return cli.ExitUsage
		}
		cfg.HTTP.Listen = *httpAddr
	}

	if cfg.RedisURLFromEnv {
		log.Info("redis: using REDIS_URL from the environment", "url", app.RedactURL(cfg.Redis.URL))
	} else if len(cfg.RedisFromEnv) > 0 {
		log.Info("redis: using settings from the environment", "variables", cfg.RedisFromEnv, "redis", cfg.Redis.Addr())
	}
	if cfg.Redis.Embedded {
		log.Warn("redis: running an embedded in-memory Redis; everything queued is lost when this process exits", "addr", cfg.Redis.EmbeddedAddr)
	}
	if need, have, over := cfg.Overbooked(); over {
		log.Warn("database: pools may hold more connections than the pool has (allow_overbooking); jobs will wait for connections", "need", need, "max_connections", have)
	}
	opts := app.WorkerOptions{Logger: log}
	if v := env.Getenv(testClockOffsetEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(stderr, "worker: %s=%q: %v\n", testClockOffsetEnv, v, err)
			return cli.ExitUsage
		}
		opts.Clock = schedule.OffsetClock(d)
		log.Warn("schedule: TEST-ONLY clock offset in effect: schedules fire by a shifted clock; never set this outside tests", "env", testClockOffsetEnv, "offset", d.String())
	}
	var m *metrics.Metrics
	var hist *web.History
	if cfg.HTTP.Listen != "" {
		m = metrics.New()
		hist = &web.History{Next: m} // the dashboard's timeline hears the waits, then the metrics
		opts.Observer = hist
		opts.OnBreakerChange = m.BreakerChanged
		opts.OnRecover = m.Recovered
	}
	w, err := app.NewWorker(ctx, cfg, opts)
	if err != nil {
		fmt.Fprintln(stderr, cli.Message("worker", err))
		return cli.ExitCode(err)
	}
	defer w.Close()
	log.Info("connected", "redis", w.Redis.Addr, "database", w.DB.Describe(), "max_connections", cfg.Database.MaxConnections)
	if m != nil {
		srv, err := web.StartForWorker(ctx, w, m, hist, nil, log)
		if err != nil {
			fmt.Fprintln(stderr, cli.Message("worker", err))
			return cli.ExitFailure
		}
		defer srv.Stop(context.Background())
		web.Announce(log, srv.Listening(), cfg.HTTP.Token != "")
	}
	if err := w.Start(ctx); err != nil {
		fmt.Fprintln(stderr, cli.Message("worker", err))
		return cli.ExitFailure
	}
	log.Info("worker running; stop with Ctrl-C or SIGTERM, reload the config with SIGHUP", "pools", len(w.Client.Pools()))
	env.Serving()
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case <-env.Reload:
			reloadConfig(ctx, w, *configPath, *httpAddr, env.Getenv, log)
		}
	}
	log.Info("signal received; stopping gracefully (a second signal stops at once)", "shutdown_timeout", cfg.Engine.ShutdownTimeout.String())
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.Engine.ShutdownTimeout+stopGrace)
	defer cancel()
	if err := w.Stop(stopCtx); err != nil {
		log.Error("pools did not stop in time", "error", err)
		return cli.ExitFailure
	}
	return cli.ExitOK
}

// reloadConfig reads the config file again and puts it in place (see
// app.Worker.Reload). A config that is invalid, or changes what cannot
// change while the worker runs, is refused: each problem is logged on its
// own line, and the running configuration stays.
func reloadConfig(ctx context.Context, w *app.Worker, path, httpAddr string, getenv func(string) string, log *slog.Logger) {
	log.Info("reload: reading the config again (SIGHUP)", "config", path)
	cfg, err := app.Load(path, getenv)
	if err == nil && httpAddr != "" {
		cfg.HTTP.Listen = httpAddr
	}
	var changes []queues.PoolChange
	oldToken := w.Current().HTTP.Token
	if err == nil {
		changes, err = w.Reload(ctx, cfg)
	}
	var ce *queues.ConfigError
	switch {
	case errors.As(err, &ce):
		log.Error("reload refused; the running configuration stays", "config", path, "problems", len(ce.Problems))
		for _, p := range ce.Problems {
			log.Error("reload refused: "+p, "config", path)
		}
	case err != nil:
		log.Error("reload failed", "config", path, "error", err)
	default:
		var rebuilt []string
		for _, ch := range changes {
			if len(ch.Rebuilt) > 0 {
				rebuilt = append(rebuilt, ch.Pool)
			}
		}
		log.Info("reload: config in effect", "config", path, "pools_changed", len(changes), "pools_rebuilt", rebuilt)
		switch token := cfg.HTTP.Token; {
		case token == oldToken || cfg.HTTP.Listen == "":
		case token == "":
			log.Warn("reload: no http.token_file any more: the dashboard is read-only, its actions are refused")
		default:
			log.Info("reload: the http token changed: the new one is in effect, the old one is refused", "token_file", cfg.HTTP.TokenFile)
		}
		for _, ch := range changes {
			if !slices.Contains(ch.Changed, "size") {
				continue
			}
			if size, err := w.Client.PoolSize(ctx, ch.Pool); err == nil && size.Resized {
				log.Warn("reload: the pool's new configured size is not in effect: an operator's resize holds until `enqueue resize -reset`",
					"pool", ch.Pool, "configured", size.Configured, "in_effect", size.Effective)
			}
		}
	}
}
