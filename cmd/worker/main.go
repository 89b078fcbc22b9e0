// Command worker runs the pools of a config file, each as its own asynq
// server, until SIGINT or SIGTERM; then it stops them gracefully.
//
//	worker -config configs/worker.yaml [-log-format text|json] [-log-level info]
//
// Exit codes: 0 after a clean stop, 1 when Redis or the database cannot be
// reached, 2 for a bad flag or an invalid config.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/queues"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, stop, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run runs the worker until ctx ends. stopSignals, called once shutdown
// begins, restores default signal handling, so a second Ctrl-C kills the
// process at once.
func run(ctx context.Context, stopSignals func(), args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	configPath := fs.String("config", "configs/worker.yaml", "config `file`")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if code, ok := cli.Parse(fs, args, stdout, stderr, "usage: worker -config FILE [flags]\n\nRuns the pools of FILE until SIGINT or SIGTERM.\n"); !ok {
		return code
	}
	log, err := cli.NewLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "worker:", err)
		return cli.ExitUsage
	}
	cfg, err := app.Load(*configPath, getenv)
	if err != nil {
		fmt.Fprintln(stderr, cli.Message("worker", err))
		return cli.ExitCode(err)
	}

	if cfg.RedisURLFromEnv {
		log.Info("redis: using REDIS_URL from the environment", "url", queues.RedactURL(cfg.Redis.URL))
	}
	if cfg.Redis.Embedded {
		log.Warn("redis: running an embedded in-memory Redis; everything queued is lost when this process exits", "addr", cfg.Redis.EmbeddedAddr)
	}
	if need, have, over := cfg.Overbooked(); over {
		log.Warn("database: pools may hold more connections than the pool has (allow_overbooking); jobs will wait for connections", "need", need, "max_connections", have)
	}
	w, err := app.NewWorker(ctx, cfg, app.WorkerOptions{Logger: log})
	if err != nil {
		fmt.Fprintln(stderr, cli.Message("worker", err))
		return cli.ExitCode(err)
	}
	defer w.Close()
	log.Info("connected", "redis", w.Redis.Addr, "database", w.DB.Describe(), "max_connections", cfg.Database.MaxConnections)
	if err := w.Start(ctx); err != nil {
		fmt.Fprintln(stderr, cli.Message("worker", err))
		return cli.ExitFailure
	}
	log.Info("worker running; stop with Ctrl-C or SIGTERM", "pools", len(w.Pools.Pools()))
	<-ctx.Done()
	stopSignals()
	log.Info("signal received; stopping gracefully (a second signal stops at once)", "shutdown_timeout", cfg.ShutdownTimeout)
	w.Shutdown()
	return cli.ExitOK
}
