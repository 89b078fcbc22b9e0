package bench

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/queues"
)

// adaptiveParams are the section's load: orders at a steady rate, and a
// batch pool of 4 kept busy with reports that hold the report database
// for hold each, across three worker processes; after warm the report
// database slows by slowdown (database.SetSlowdown, sized for the pool's
// 4), for slow, then recovers for recover.
type adaptiveParams struct {
	orderRate           int
	hold                time.Duration
	warm, slow, recover time.Duration
	window              time.Duration
	slowdown            float64
	processes           int
}

// batchMax is the batch pool's max_size, and the load the report
// database's model is sized for.
const batchMax = 4

// adaptiveRun is one configuration's run.
type adaptiveRun struct {
	orders [3]latencies // before, during, after the slowdown (by enqueue time)
	// reports ended in the run's window, and in the slowdown; report
	// times (start to end, by start time) in the slowdown.
	reports, reportsSlow int
	reportSlow           latencies
	took                 time.Duration
	// busySlow is the mean of reports running at once in the slowdown
	// (the report connections held).
	busySlow float64
	// fell and back are how long after the slowdown the limit first fell
	// below batchMax and after the recovery it was back (0: never);
	// lowest is its lowest value in the slowdown.
	fell, back time.Duration
	lowest     int
	// ran counts each report's runs; lost the jobs enqueued but never
	// done; over the starts above the limit in effect.
	twice, lost, over int
	orderErrors       int
	rounds            int
	slowFor           time.Duration // the slowdowns' total length
}

func runAdaptive(ctx context.Context, o *Options) (*Table, error) {
	p := adaptiveParams{
		orderRate: 50,
		hold:      o.d(300*time.Millisecond, 150*time.Millisecond),
		warm:      o.d(6*time.Second, 1500*time.Millisecond),
		slow:      o.d(20*time.Second, 3*time.Second),
		recover:   o.d(20*time.Second, 3*time.Second),
		window:    o.d(time.Second, 300*time.Millisecond),
		slowdown:  5,
		processes: 3,
	}
	dbCfg := database.Config{SQLitePath: filepath.Join(o.TempDir, "adaptive.db"), MaxConnections: 20, SeedOrders: 2000, SeedMonths: 2, SeedUntil: "2026-11"}
	dbCfg.SetDefaults()
	db, err := database.Open(ctx, dbCfg, map[string]int{"order": 8, "batch": batchMax})
	if err != nil {
		return nil, err
	}
	defer db.Close()

	// Rounds in the order static, adaptive, adaptive, static, so that a
	// machine that gets busier or quieter over the run favours neither.
	var static, adaptive adaptiveRun
	rounds := o.n(2, 1)
	for i := range 2 * rounds {
		isStatic := i%4 == 0 || i%4 == 3
		var cfg *queues.AdaptiveConfig
		if !isStatic {
			cfg = &queues.AdaptiveConfig{Min: 1, Window: p.window}
		}
		r, err := adaptiveVariant(ctx, o, p, db, cfg)
		if err != nil {
			return nil, fmt.Errorf("round %d: %w", i+1, err)
		}
		if isStatic {
			static.merge(r)
		} else {
			adaptive.merge(r)
		}
	}

	t := &Table{Header: []string{"cap", "order p99 before", "during", "after", "during / before", "reports/s (run)", "reports/s (slowdown)", "report p50 (slowdown)", "reports at once (slowdown)", "limit: lowest, fell after, back after"}}
	for _, c := range []struct {
		name string
		r    adaptiveRun
	}{{"static 4", static}, {"adaptive 1..4", adaptive}} {
		r := c.r
		limit := "4 throughout"
		if c.name != "static 4" {
			limit = fmt.Sprintf("%d, %s, %s", r.lowest, dur(r.fell), dur(r.back))
		}
		t.row(c.name, ms(r.orders[0].pct(.99)), ms(r.orders[1].pct(.99)), ms(r.orders[2].pct(.99)),
			fmt.Sprintf("%.2fx", pctRatio(r.orders[1], r.orders[0])),
			fmt.Sprintf("%.2f", float64(r.reports)/r.took.Seconds()), fmt.Sprintf("%.2f", float64(r.reportsSlow)/r.slowFor.Seconds()),
			ms(r.reportSlow.pct(.5)), fmt.Sprintf("%.2f", r.busySlow), limit)
	}
	thr := float64(adaptive.reports) / float64(max(1, static.reports))
	t.note("report throughput over the whole run, adaptive / static: %.2fx; order p99 during / before the slowdown: adaptive %.2fx, static %.2fx",
		thr, pctRatio(adaptive.orders[1], adaptive.orders[0]), pctRatio(static.orders[1], static.orders[0]))
	t.note("%d rounds of each cap (static, adaptive, adaptive, static, ...), latencies and counts pooled over them; the limit's times are the worst round's", rounds)
	t.note("workload: %d worker processes; orders at %d/s (each inserts a row through its pool's share); the batch pool (max_size %d, adaptive: min 1, window %s) kept busy with reports each holding the report database %s; after %s the report database loses %.0fx its capacity (database.SetSlowdown(%d, %.0f): at %d reports at once each takes %.0fx longer, fewer run faster) for %s, then recovers for %s; SQLite",
		p.processes, p.orderRate, batchMax, p.window, p.hold, p.warm, p.slowdown, batchMax, p.slowdown, batchMax, p.slowdown, p.slow, p.recover)
	t.note("orders do not use the report server the model slows, so the static cap's orders are not hurt either: the adaptive cap's gain here is the reports it stops piling onto a struggling database (reports at once, and their time) for the same throughput")
	t.note("nothing lost (each job enqueued done), no report run twice, no start above the limit in effect (checked inside the handlers): static %d/%d/%d, adaptive %d/%d/%d (lost/twice/over); order errors static %d, adaptive %d",
		static.lost, static.twice, static.over, adaptive.lost, adaptive.twice, adaptive.over, static.orderErrors, adaptive.orderErrors)
	t.target("adaptive order p99 during the slowdown <= 1.2x its p99 before", pctRatio(adaptive.orders[1], adaptive.orders[0]) <= 1.2)
	t.target("adaptive report throughput over the whole run >= 0.9x the static cap's", thr >= 0.9)
	t.target("the limit falls within 30 s of the slowdown and is back within 60 s of the recovery",
		adaptive.fell > 0 && adaptive.fell <= 30*time.Second && adaptive.back > 0 && adaptive.back <= 60*time.Second)
	ok := true
	for _, r := range []adaptiveRun{static, adaptive} {
		ok = ok && r.lost == 0 && r.twice == 0 && r.over == 0
	}
	t.property("nothing lost, no report run twice, the cap never exceeded inside the handlers", ok)
	return t, nil
}

// merge adds round r to a's totals: latencies and counts pooled, the
// limit's worst times and lowest value kept.
func (a *adaptiveRun) merge(r adaptiveRun) {
	first := a.took == 0
	for i := range a.orders {
		a.orders[i] = append(a.orders[i], r.orders[i]...)
	}
	a.reportSlow = append(a.reportSlow, r.reportSlow...)
	a.rounds++
	a.busySlow += (r.busySlow - a.busySlow) / float64(a.rounds)
	a.reports += r.reports
	a.reportsSlow += r.reportsSlow
	a.took += r.took
	a.slowFor += r.slowFor
	if first || r.lowest < a.lowest {
		a.lowest = r.lowest
	}
	if first || r.fell == 0 || (a.fell != 0 && r.fell > a.fell) {
		a.fell = r.fell
	}
	if first || r.back == 0 || (a.back != 0 && r.back > a.back) {
		a.back = r.back
	}
	a.twice += r.twice
	a.lost += r.lost
	a.over += r.over
	a.orderErrors += r.orderErrors
}

func pctRatio(a, b latencies) float64 {
	return float64(a.pct(.99)) / float64(max(1, b.pct(.99)))
}

func dur(d time.Duration) string {
	if d == 0 {
		return "never"
	}
	return d.Round(100 * time.Millisecond).String()
}

// adaptiveWatch is what the handlers and the limit's sampler see.
type adaptiveWatch struct {
	mu sync.Mutex
	// phase boundaries: the slowdown's start and the recovery.
	slowAt, recoverAt, endAt time.Time
	orderAt                  map[string]time.Time // enqueued, not done
	orders                   [3]latencies
	orderErrors              int
	running                  int
	starts                   []limitSample // each report start: when, and reports running
	ran                      map[string]int
	reportsEnqueued          int
	reportsDone              int
	reportsInRun             int
	reportsSlow              int
	reportSlow               latencies
	busyArea                 time.Duration // ∫ running dt over the slowdown
	lastChange               time.Time
	limits                   []limitSample // the size in effect, sampled
}

type limitSample struct {
	at time.Time
	n  int
}

func (w *adaptiveWatch) phase(at time.Time) int {
	switch {
	case w.slowAt.IsZero() || at.Before(w.slowAt):
		return 0
	case w.recoverAt.IsZero() || at.Before(w.recoverAt):
		return 1
	}
	return 2
}

// account adds the running reports' time to the slowdown's area, up to now.
func (w *adaptiveWatch) account(now time.Time) {
	if !w.slowAt.IsZero() {
		from := w.lastChange
		if from.Before(w.slowAt) {
			from = w.slowAt
		}
		to := now
		if !w.recoverAt.IsZero() && to.After(w.recoverAt) {
			to = w.recoverAt
		}
		if to.After(from) {
			w.busyArea += time.Duration(w.running) * to.Sub(from)
		}
	}
	w.lastChange = now
}

func adaptiveVariant(ctx context.Context, o *Options, p adaptiveParams, db *database.DB, adaptive *queues.AdaptiveConfig) (adaptiveRun, error) {
	ns, clean := namespace(o, "adaptive")
	defer clean()
	db.SetSlowdown(batchMax, 1)
	defer db.SetSlowdown(0, 1)
	cfg := queues.Config{Namespace: ns, Logger: slog.New(slog.DiscardHandler),
		Dependencies: []queues.Dependency{{Name: "reports-db", Capacity: 20}},
		Pools: []queues.PoolConfig{
			{Name: "order", Size: 8, JobTypes: []string{handlers.TypeOrder}, PollInterval: 20 * time.Millisecond, MaxRetry: queues.NoRetry,
				Uses: map[string]int{"reports-db": 1}},
			{Name: "batch", Size: batchMax, MaxSize: batchMax, JobTypes: []string{handlers.TypeReport}, PollInterval: 20 * time.Millisecond,
				MaxRetry: queues.NoRetry, Uses: map[string]int{"reports-db": 1}, Adaptive: adaptive},
		}}
	w := &adaptiveWatch{orderAt: map[string]time.Time{}, ran: map[string]int{}}
	h := queues.NewHandlers()
	h.HandleFunc(handlers.TypeOrder, func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		err := withShare(ctx, func(ctx context.Context) error {
			return db.Conn(ctx, "order", func(ctx context.Context, conn *sql.Conn) error {
				_, err := database.InsertOrder(ctx, conn, time.Now(), "north", "books", 1, 100)
				return err
			})
		})
		now := time.Now()
		w.mu.Lock()
		if at, ok := w.orderAt[id]; ok {
			delete(w.orderAt, id)
			if err != nil {
				w.orderErrors++
			} else {
				w.orders[w.phase(at)] = append(w.orders[w.phase(at)], now.Sub(at))
			}
		}
		w.mu.Unlock()
		return err
	})
	h.HandleFunc(handlers.TypeReport, func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		began := time.Now()
		w.mu.Lock()
		w.account(began)
		w.running++
		w.ran[id]++
		w.starts = append(w.starts, limitSample{began, w.running})
		w.mu.Unlock()
		err := withShare(ctx, func(ctx context.Context) error {
			return db.Conn(ctx, "batch", func(ctx context.Context, conn *sql.Conn) error {
				end := db.BeginReport()
				defer end()
				start := time.Now()
				var n int
				if err := conn.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders`).Scan(&n); err != nil {
					return err
				}
				return db.HoldReport(ctx, start, p.hold)
			})
		})
		now := time.Now()
		w.mu.Lock()
		w.account(now)
		w.running--
		if err == nil {
			w.reportsDone++
			if w.endAt.IsZero() || now.Before(w.endAt) {
				w.reportsInRun++
			}
			if w.phase(now) == 1 {
				w.reportsSlow++
			}
			if w.phase(began) == 1 {
				w.reportSlow = append(w.reportSlow, now.Sub(began))
			}
		}
		w.mu.Unlock()
		return err
	})
	var clients []*queues.Client
	defer func() {
		for _, c := range clients {
			stopClient(c)
		}
	}()
	for range p.processes {
		c, err := startClient(ctx, o, cfg, h)
		if err != nil {
			return adaptiveRun{}, err
		}
		clients = append(clients, c)
	}
	admin := clients[0]

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	// Orders at a steady rate.
	wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(p.orderRate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("order-%d", i)
			w.mu.Lock() // so the handler cannot finish before the time is recorded
			w.orderAt[id] = time.Now()
			_, err := admin.Enqueue(runCtx, handlers.TypeOrder, nil, queues.EnqueueOptions{ID: id})
			if err != nil {
				delete(w.orderAt, id)
			}
			w.mu.Unlock()
			if err != nil && runCtx.Err() == nil {
				errs <- err
				return
			}
		}
	})
	// Reports: the backlog kept at twice the pool, so it is always busy.
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
			w.mu.Lock()
			need := 2*batchMax - (w.reportsEnqueued - w.reportsDone)
			w.mu.Unlock()
			for range need {
				w.mu.Lock()
				id := fmt.Sprintf("report-%d", w.reportsEnqueued)
				w.mu.Unlock()
				if _, err := admin.Enqueue(runCtx, handlers.TypeReport, nil, queues.EnqueueOptions{ID: id}); err != nil {
					if runCtx.Err() == nil {
						errs <- err
					}
					return
				}
				w.mu.Lock()
				w.reportsEnqueued++
				w.mu.Unlock()
			}
		}
	})
	// The size in effect, every 100 ms.
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
			s, err := admin.PoolSize(runCtx, "batch")
			if err != nil {
				continue
			}
			w.mu.Lock()
			w.limits = append(w.limits, limitSample{time.Now(), s.Effective})
			w.mu.Unlock()
		}
	})
	began := time.Now()
	wait := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errs:
			return err
		case <-t.C:
			return nil
		}
	}
	fail := func(err error) (adaptiveRun, error) { stop(); wg.Wait(); return adaptiveRun{}, err }
	if err := wait(p.warm); err != nil {
		return fail(err)
	}
	w.mu.Lock()
	w.slowAt = time.Now()
	w.mu.Unlock()
	db.SetSlowdown(batchMax, p.slowdown)
	if err := wait(p.slow); err != nil {
		return fail(err)
	}
	w.mu.Lock()
	w.recoverAt = time.Now()
	w.mu.Unlock()
	db.SetSlowdown(batchMax, 1)
	if err := wait(p.recover); err != nil {
		return fail(err)
	}
	w.mu.Lock()
	w.endAt = time.Now()
	w.mu.Unlock()
	stop()
	wg.Wait()
	// Every job enqueued must end: drain at full health.
	deadline := time.Now().Add(time.Minute)
	for {
		w.mu.Lock()
		left := len(w.orderAt) + w.reportsEnqueued - w.reportsDone
		w.mu.Unlock()
		if left == 0 || time.Now().After(deadline) {
			break
		}
		if err := wait(20 * time.Millisecond); err != nil {
			return adaptiveRun{}, err
		}
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	r := adaptiveRun{orders: w.orders, reports: w.reportsInRun, reportsSlow: w.reportsSlow, reportSlow: w.reportSlow,
		took: w.endAt.Sub(began), orderErrors: w.orderErrors, lowest: batchMax,
		busySlow: float64(w.busyArea) / float64(w.recoverAt.Sub(w.slowAt)), slowFor: w.recoverAt.Sub(w.slowAt)}
	r.lost = len(w.orderAt) + w.reportsEnqueued - w.reportsDone
	for _, n := range w.ran {
		if n > 1 {
			r.twice++
		}
	}
	for _, l := range w.limits {
		switch {
		case l.at.After(w.slowAt) && l.at.Before(w.recoverAt):
			r.lowest = min(r.lowest, l.n)
			if r.fell == 0 && l.n < batchMax {
				r.fell = l.at.Sub(w.slowAt)
			}
		case l.at.After(w.recoverAt) && r.back == 0 && l.n == batchMax:
			r.back = l.at.Sub(w.recoverAt)
		}
	}
	// A start may not see more running than the limit in effect then: the
	// most any sample within 300 ms of it says (the samples are 100 ms
	// apart; the limit changes at most once a window).
	for _, s := range w.starts {
		allowed := 0
		for _, l := range w.limits {
			if d := l.at.Sub(s.at); d > -300*time.Millisecond && d < 300*time.Millisecond {
				allowed = max(allowed, l.n)
			}
		}
		if allowed == 0 {
			allowed = batchMax
		}
		if s.n > allowed {
			r.over++
		}
	}
	return r, nil
}

// withShare runs fn holding the job's share of reports-db.
func withShare(ctx context.Context, fn func(ctx context.Context) error) error {
	dep, err := queues.DependencyOf(ctx, "reports-db")
	if err != nil {
		return err
	}
	release, err := dep.Acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	return fn(ctx)
}
