// Command traceworker is a test program: the worker of cmd/worker (the
// same config file, environment overrides and wiring through package app),
// whose every job appends a line to a local trace file when its handler
// starts and when it returns, inside the pool's slot. Tests that break
// Redis (a Sentinel failover) read the trace to check the pools' caps from
// inside the handlers, which Redis itself cannot be trusted to record. It
// is built and run by the tests in internal/reliability only.
//
//	traceworker -config FILE -trace FILE
//
// Trace lines: "<start|end> <unix nanoseconds> <pool> <job id>". Every
// process appends to the same file with O_APPEND, each line in one write,
// so the file's order is the order the writes happened in: a job's end line
// is written before its slot is released, and a start line after its slot
// was taken.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/queues"
)

func main() {
	cfgPath := flag.String("config", "", "worker config file")
	tracePath := flag.String("trace", "", "trace file to append to")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg, err := app.Load(*cfgPath, os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	trace, err := os.OpenFile(*tracePath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer trace.Close()
	var mu sync.Mutex
	record := func(what, pool, id string) {
		mu.Lock()
		defer mu.Unlock()
		if _, err := fmt.Fprintf(trace, "%s %d %s %s\n", what, time.Now().UnixNano(), pool, id); err != nil {
			log.Error("trace", "error", err)
		}
	}
	traced := func(p *queues.Pool, next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			record("start", p.Name(), id)
			defer record("end", p.Name(), id)
			return next.ProcessTask(ctx, t)
		})
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	w, err := app.NewWorker(ctx, cfg, app.WorkerOptions{Logger: log, Middleware: []queues.Middleware{traced}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer w.Close()
	if err := w.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	log.Info("traceworker running", "redis", w.Redis.Addr)
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.Engine.ShutdownTimeout+5*time.Second)
	defer cancel()
	if err := w.Stop(stopCtx); err != nil {
		log.Error("stop", "error", err)
		os.Exit(1)
	}
}
