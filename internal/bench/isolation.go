package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/queues"
)

// isolationParams are the story, scaled down: orders at a steady rate, then
// a flood of 50 reports that each hold a connection.
type isolationParams struct {
	orderRate   int
	warmup      time.Duration
	reports     int
	hold        time.Duration
	connTimeout time.Duration
}

// isolationResult is one configuration's run.
type isolationResult struct {
	before, during        latencies
	orderErrors           int64
	ordersDuringPerSecond float64
	reportsPerSecond      float64
	floodTook             time.Duration
}

// orderTracker measures order latency from enqueue to done, split at the
// start of the flood.
type orderTracker struct {
	mu         sync.Mutex
	enqueuedAt map[string]time.Time
	floodAt    time.Time
	floodEnd   time.Time
	before     latencies
	during     latencies
	errors     atomic.Int64
}

func (t *orderTracker) done(id string, err error) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.enqueuedAt[id]
	if !ok {
		return
	}
	delete(t.enqueuedAt, id)
	if err != nil {
		t.errors.Add(1)
		return
	}
	switch {
	case t.floodAt.IsZero() || at.Before(t.floodAt):
		t.before = append(t.before, now.Sub(at))
	case t.floodEnd.IsZero() || at.Before(t.floodEnd):
		t.during = append(t.during, now.Sub(at))
	}
}

func runIsolation(ctx context.Context, o *Options) (*Table, error) {
	// A smoke run still floods with more reports than the shared server's
	// 20 workers, so it shows the outage too: with fewer, orders always
	// find a free worker and nothing happens.
	p := isolationParams{
		orderRate:   50,
		warmup:      o.d(4*time.Second, time.Second),
		reports:     o.n(50, 24),
		hold:        o.d(2*time.Second, 400*time.Millisecond),
		connTimeout: time.Second,
	}
	dbCfg := database.Config{SQLitePath: filepath.Join(o.TempDir, "isolation.db"), MaxConnections: 20, SeedOrders: 2000, SeedMonths: 2, SeedUntil: "2026-11"}
	dbCfg.SetDefaults()
	db, err := database.Open(ctx, dbCfg, map[string]int{"order": 8, "search": 8, "batch": 4})
	if err != nil {
		return nil, err
	}
	defer db.Close()

	shared, err := isolationShared(ctx, o, p, db)
	if err != nil {
		return nil, fmt.Errorf("shared: %w", err)
	}
	parted, err := isolationPartitioned(ctx, o, p, db)
	if err != nil {
		return nil, fmt.Errorf("partitioned: %w", err)
	}

	t := &Table{Header: []string{"configuration", "phase", "orders", "p50", "p95", "p99", "max", "order errors", "orders/s", "reports/s"}}
	for _, c := range []struct {
		name string
		r    isolationResult
	}{{"shared (1 server, C=20)", shared}, {"partitioned (8/8/4)", parted}} {
		t.row(c.name, "before flood", len(c.r.before), ms(c.r.before.pct(.5)), ms(c.r.before.pct(.95)), ms(c.r.before.pct(.99)), ms(c.r.before.pct(1)), "-", "-", "-")
		t.row("", "during flood", len(c.r.during), ms(c.r.during.pct(.5)), ms(c.r.during.pct(.95)), ms(c.r.during.pct(.99)), ms(c.r.during.pct(1)),
			c.r.orderErrors, fmt.Sprintf("%.1f", c.r.ordersDuringPerSecond), fmt.Sprintf("%.2f", c.r.reportsPerSecond))
	}
	sharedRatio := float64(shared.during.pct(.99)) / float64(max(1, shared.before.pct(.99)))
	partRatio := float64(parted.during.pct(.99)) / float64(max(1, parted.before.pct(.99)))
	t.note("order p99 during flood / before flood: shared %.2fx, partitioned %.2fx (partitioned / shared: %s)", sharedRatio, partRatio, ratio(partRatio, sharedRatio))
	t.note("workload: orders at %d/s (each inserts one row), after %s a flood of %d reports each holding a connection %s; connection wait timeout %s; SQLite, 20 connections",
		p.orderRate, p.warmup, p.reports, p.hold, p.connTimeout)
	t.target("partitioned order p99 during / before flood <= 1.2", partRatio <= 1.2)
	return t, nil
}

// isolationShared is the story's before: one asynq server for every queue,
// concurrency 20, and reports taking connections from the shared pool
// freely.
func isolationShared(ctx context.Context, o *Options, p isolationParams, db *database.DB) (isolationResult, error) {
	ns, clean := namespace(o, "shared")
	defer clean()
	orderQ, batchQ := ns+":order", ns+":batch"
	tr := &orderTracker{enqueuedAt: map[string]time.Time{}}
	mux := asynq.NewServeMux()
	mux.HandleFunc(handlers.TypeOrder, func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		cctx, cancel := context.WithTimeout(ctx, p.connTimeout)
		defer cancel()
		conn, err := db.SQL().Conn(cctx)
		if err == nil {
			_, err = database.InsertOrder(ctx, conn, time.Now(), "north", "books", 1, 100)
			conn.Close()
		}
		tr.done(id, err)
		return err
	})
	reportsDone := newCounter(p.reports)
	mux.HandleFunc(handlers.TypeReport, func(ctx context.Context, t *asynq.Task) error {
		conn, err := db.SQL().Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		holdConn(ctx, conn, p.hold)
		reportsDone.add()
		return nil
	})
	srv := asynq.NewServerFromRedisClient(o.Redis, asynq.Config{
		Concurrency: 20, Queues: map[string]int{orderQ: 1, batchQ: 1}, TaskCheckInterval: 20 * time.Millisecond, Logger: quietLogger(),
	})
	if err := srv.Start(mux); err != nil {
		return isolationResult{}, err
	}
	defer srv.Shutdown()
	return floodRun(ctx, o, p, tr, reportsDone,
		func(ctx context.Context, c *asynq.Client) (string, error) {
			info, err := c.EnqueueContext(ctx, asynq.NewTask(handlers.TypeOrder, nil), asynq.Queue(orderQ), asynq.MaxRetry(0))
			if err != nil {
				return "", err
			}
			return info.ID, nil
		},
		func(ctx context.Context, c *asynq.Client) error {
			_, err := c.EnqueueContext(ctx, asynq.NewTask(handlers.TypeReport, nil), asynq.Queue(batchQ), asynq.MaxRetry(0))
			return err
		})
}

// isolationPartitioned is the same workload on the runner: pools order 8,
// search 8, batch 4, each drawing connections inside its share.
func isolationPartitioned(ctx context.Context, o *Options, p isolationParams, db *database.DB) (isolationResult, error) {
	ns, clean := namespace(o, "parted")
	defer clean()
	cfg := queues.Config{Namespace: ns, Logger: slog.New(slog.DiscardHandler), Pools: []queues.PoolConfig{
		{Name: "order", Size: 8, JobTypes: []string{handlers.TypeOrder}, PollInterval: 20 * time.Millisecond, MaxRetry: queues.NoRetry},
		{Name: "search", Size: 8, JobTypes: []string{handlers.TypeSearch}, PollInterval: 20 * time.Millisecond, MaxRetry: queues.NoRetry},
		{Name: "batch", Size: 4, JobTypes: []string{handlers.TypeReport}, PollInterval: 20 * time.Millisecond, MaxRetry: queues.NoRetry},
	}}
	tr := &orderTracker{enqueuedAt: map[string]time.Time{}}
	reportsDone := newCounter(p.reports)
	mux := queues.NewHandlers()
	mux.HandleFunc(handlers.TypeOrder, func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		cctx, cancel := context.WithTimeout(ctx, p.connTimeout)
		defer cancel()
		err := db.Conn(cctx, "order", func(ctx context.Context, conn *sql.Conn) error {
			_, err := database.InsertOrder(ctx, conn, time.Now(), "north", "books", 1, 100)
			return err
		})
		tr.done(id, err)
		return err
	})
	mux.HandleFunc(handlers.TypeSearch, func(context.Context, *asynq.Task) error { return nil })
	mux.HandleFunc(handlers.TypeReport, func(ctx context.Context, t *asynq.Task) error {
		err := db.Conn(ctx, "batch", func(ctx context.Context, conn *sql.Conn) error {
			holdConn(ctx, conn, p.hold)
			return nil
		})
		if err == nil {
			reportsDone.add()
		}
		return err
	})
	client, err := startClient(ctx, o, cfg, mux)
	if err != nil {
		return isolationResult{}, err
	}
	defer stopClient(client)
	return floodRun(ctx, o, p, tr, reportsDone,
		func(ctx context.Context, _ *asynq.Client) (string, error) {
			info, err := client.Enqueue(ctx, handlers.TypeOrder, nil, queues.EnqueueOptions{})
			if err != nil {
				return "", err
			}
			return info.ID, nil
		},
		func(ctx context.Context, _ *asynq.Client) error {
			_, err := client.Enqueue(ctx, handlers.TypeReport, nil, queues.EnqueueOptions{})
			return err
		})
}

// holdConn keeps conn busy for d: a short query, then the rest of d with
// the connection held, as a long report query would.
func holdConn(ctx context.Context, conn *sql.Conn, d time.Duration) {
	var n int
	_ = conn.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders`).Scan(&n)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// floodRun drives the workload: orders at a steady rate throughout; after
// the warm-up, the report flood; it ends when every report is done.
func floodRun(ctx context.Context, o *Options, p isolationParams, tr *orderTracker, reportsDone *counter,
	enqueueOrder func(context.Context, *asynq.Client) (string, error), enqueueReport func(context.Context, *asynq.Client) error) (isolationResult, error) {
	c := asynq.NewClientFromRedisClient(o.Redis)
	defer c.Close()
	trafficCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var enqueueErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(p.orderRate))
		defer tick.Stop()
		for {
			select {
			case <-trafficCtx.Done():
				return
			case <-tick.C:
			}
			at := time.Now()
			tr.mu.Lock() // hold the lock so the handler cannot finish before the time is recorded
			id, err := enqueueOrder(trafficCtx, c)
			if err == nil {
				tr.enqueuedAt[id] = at
			}
			tr.mu.Unlock()
			// An enqueue the end of the traffic cut short is no failure:
			// asynq's error for it does not always wrap context.Canceled
			// ("redis eval error: context canceled").
			if err != nil && !errors.Is(err, context.Canceled) && trafficCtx.Err() == nil {
				enqueueErr.Store(err)
			}
		}
	}()
	defer func() { stop(); wg.Wait() }()

	select {
	case <-ctx.Done():
		return isolationResult{}, ctx.Err()
	case <-time.After(p.warmup):
	}
	tr.mu.Lock()
	tr.floodAt = time.Now()
	tr.mu.Unlock()
	for range p.reports {
		if err := enqueueReport(ctx, c); err != nil {
			return isolationResult{}, err
		}
	}
	if err := reportsDone.wait(ctx, 10*time.Minute); err != nil {
		return isolationResult{}, err
	}
	tr.mu.Lock()
	tr.floodEnd = time.Now()
	took := tr.floodEnd.Sub(tr.floodAt)
	tr.mu.Unlock()
	// Let the orders enqueued during the flood finish.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		tr.mu.Lock()
		left := 0
		for _, at := range tr.enqueuedAt {
			if at.Before(tr.floodEnd) {
				left++
			}
		}
		tr.mu.Unlock()
		if left == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	wg.Wait()
	if v := enqueueErr.Load(); v != nil {
		return isolationResult{}, v.(error)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return isolationResult{
		before: tr.before, during: tr.during, orderErrors: tr.errors.Load(),
		ordersDuringPerSecond: float64(len(tr.during)) / took.Seconds(),
		reportsPerSecond:      float64(p.reports) / took.Seconds(), floodTook: took,
	}, nil
}
