package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/web"
	"github.com/lci-labs/compartment/queues"
)

// The third act, SLOWDOWN: on the walls, with the order and search traffic
// running and the month-end's reports waiting in the batch pool, the
// report database becomes SlowdownFactor times slower
// (database.SetSlowdown: a server sized for the batch pool's max_size
// reports at full speed loses four fifths of its speed), then recovers.
// The batch pool is adaptive (docs/DEPENDENCIES.md): its limit falls
// because its reports take longer and climbs back once they do not.
// Nothing here moves the limit: the act slows the database, keeps reports
// waiting, and reads the limit from Redis, as an operator would.

// SlowdownFactor is how many times slower the third act makes the report
// database: at the load it was sized for, every report takes this many
// times longer.
const SlowdownFactor = 5.0

// Bounds of the third act.
const (
	// SlowdownFallLimit: if the batch pool's limit has not fallen this
	// long after the database slowed, the database recovers anyway and
	// the act says the limit did not fall.
	SlowdownFallLimit = 60 * time.Second
	// SlowdownBackLimit: after the database recovered, the act keeps
	// reports waiting in the batch pool until the limit is back at
	// max_size, or this long at most; then it lets the pool empty.
	SlowdownBackLimit = 30 * time.Second
	// slowdownReady bounds the warm-up's wait for the act's first reports
	// to set the limit's baseline before the database slows.
	slowdownReady = 30 * time.Second
	// limitGrace covers a report whose slot was granted just before the
	// limit fell but whose handler records its start just after: the two
	// are separate steps, and the limit's log is stamped by Redis's clock.
	limitGrace = 250 * time.Millisecond
)

// SlowdownAct is what the third act did.
type SlowdownAct struct {
	// Pool is the adaptive pool the reports run in; Min and Max bound
	// its limit (adaptive.min, max_size).
	Pool     string
	Min, Max int
	// Window and Tolerance are its adaptive settings.
	Window    time.Duration
	Tolerance float64
	// Factor is how many times slower the database became; Capacity the
	// reports it runs at full speed when healthy (the pool's max_size).
	Factor   float64
	Capacity int
	// Warmup is how long the act ran before the database slowed, SlowFor
	// how long it was slow, Took the whole act.
	Warmup, SlowFor, Took time.Duration
	// Orders enqueued before the slowdown, during it and after the
	// recovery; Latency is from enqueue to the end of the order's job.
	OrderBefore, OrderDuring, OrderAfter Orders
	// OrdersEnqueued orders were enqueued in the act, OrdersCompleted of
	// them ended without an error.
	OrdersEnqueued, OrdersCompleted int
	// StartLimit is the limit when the act began, Lowest its lowest during
	// the act, EndLimit when it ended.
	StartLimit, Lowest, EndLimit int
	// FellBeforeSlowdown says the limit fell, or was below Max, before
	// the database slowed, while the reports ran at full speed.
	FellBeforeSlowdown bool
	// FellAfter is how long after the slowdown the limit first fell below
	// Max, BackAfter how long after the recovery it was back at Max; each
	// is -1 when it did not happen.
	FellAfter, BackAfter time.Duration
	// Changes are the limit's changes during the act, oldest first; Notes
	// the log's entries about an operator's size (From and To 0), if one
	// resized the pool meanwhile.
	Changes, Notes []LimitChange
	// Starts counts the pool's job starts, MostAtOnce the most of its
	// jobs inside the handlers at once, and OverLimit the starts that
	// found more of its jobs inside (itself included) than the limit
	// allowed then (allowing limitGrace), all counted inside the handlers.
	Starts, MostAtOnce, OverLimit int
	// The act's reports: enqueued, done, failed for good.
	ReportsTotal, ReportsDone, ReportsFailed int
}

// LimitChange is one change of the adaptive limit, from the pool's log.
type LimitChange struct {
	// At is the time since the database slowed (negative: before).
	At       time.Duration
	From, To int
	Reason   string
}

// Fell reports whether the limit fell below Max while the database was
// slow.
func (a SlowdownAct) Fell() bool { return a.FellAfter >= 0 }

// Back reports whether the limit was back at Max after the recovery.
func (a SlowdownAct) Back() bool { return a.BackAfter >= 0 }

// OrdersTimedOut is how many orders of the act waited past the order
// timeout (still waiting at the end included).
func (a SlowdownAct) OrdersTimedOut() int {
	return a.OrderBefore.TimedOut + a.OrderDuring.TimedOut + a.OrderAfter.TimedOut
}

// OrdersFailed is how many orders enqueued in the act did not complete
// for another reason than their timeout: their job failed, or never ended.
func (a SlowdownAct) OrdersFailed() int {
	return max(0, a.OrdersEnqueued-a.OrdersCompleted-a.OrdersTimedOut())
}

// Held reports whether the act showed what it should: the limit stayed at
// Max while the reports ran at full speed, fell below it while the
// database was slow, and was back at it after the recovery; no job started
// beyond the limit; no order failed and every report completed. An order
// that waited past its timeout is counted and shown, not held against the
// act, as in AFTER: the slowdown touches no order query and orders run in
// a pool of their own, so what makes one that late is most often the
// machine itself, busy with other work.
func (a SlowdownAct) Held() bool {
	return !a.FellBeforeSlowdown && a.Fell() && a.Back() && a.OverLimit == 0 && a.MostAtOnce <= a.Max &&
		a.OrdersFailed() == 0 && a.ReportsFailed == 0 && a.ReportsDone == a.ReportsTotal
}

// slowdownSetup is what the act needs of the config.
type slowdownSetup struct {
	pool     string // the report pool
	adaptive queues.AdaptiveConfig
}

// slowdownFor checks that cfg can play the third act: its report pool is
// adaptive, and its reports hold their connection a while
// (report_min_duration), which is what the report database model
// stretches.
func slowdownFor(cfg *app.Config) (*slowdownSetup, error) {
	const skip = "or skip the act (-skip-slowdown)"
	for _, p := range cfg.Engine.Pools {
		if !slices.Contains(p.JobTypes, handlers.TypeReport) {
			continue
		}
		if p.Adaptive == nil {
			return nil, fmt.Errorf("the third act (the database slows) needs the report pool %q to be adaptive, as configs/demo.yaml's is (max_size and adaptive: {min: 1}; docs/DEPENDENCIES.md): add it to the config, %s", p.Name, skip)
		}
		if cfg.ReportMinDuration <= 0 {
			return nil, fmt.Errorf("the third act (the database slows) needs report_min_duration above 0, as in configs/demo.yaml: the slow report database stretches the time a report holds its connection, which is that; set it, %s", skip)
		}
		return &slowdownSetup{pool: p.Name, adaptive: *p.Adaptive}, nil
	}
	return nil, errors.New("the third act (the database slows) needs a pool for " + handlers.TypeReport + ", " + skip)
}

// limitLog gathers the adaptive limit's changes from the pool's log in
// Redis, read at every refresh: the log keeps the latest ones only, so
// each read adds what is new.
type limitLog struct {
	since   time.Time // changes before it are not the act's
	changes []queues.AdaptiveChange
	// notes are the log's entries about an operator's size (From and To
	// 0): no change of the limit, so the checks leave them out.
	notes []queues.AdaptiveChange
}

// add merges log (newest first) into l.
func (l *limitLog) add(log []queues.AdaptiveChange) {
	for _, ch := range slices.Backward(log) {
		list := &l.changes
		if ch.From == 0 || ch.To == 0 {
			list = &l.notes
		}
		var last time.Time
		if n := len(*list); n > 0 {
			last = (*list)[n-1].At
		}
		if ch.At.Before(l.since) || ch.At.Before(last) || slices.Contains(*list, ch) {
			continue
		}
		*list = append(*list, ch)
	}
}

// allowed returns the most the limit allowed in [at-limitGrace, at], the
// limit being start before the first change.
func (l *limitLog) allowed(start int, at time.Time) int {
	limit, most := start, 0
	for _, ch := range l.changes {
		if ch.At.After(at) {
			break
		}
		if ch.At.Before(at.Add(-limitGrace)) {
			limit = ch.To
			continue
		}
		most = max(most, limit)
		limit = ch.To
	}
	return max(most, limit)
}

// feeder enqueues the month-end's reports for the act, in their order,
// a few at a time: the act keeps max_size of them waiting in the batch
// pool until the limit is back at its most, so that the pool is always
// full (the limit climbs only then), and then lets the pool empty, so that
// the act does not wait for a whole month-end after the story is told.
// When every report has been enqueued it starts the month-end over.
//
// Its first reports go in a fraction of a report's hold apart (stagger):
// every report holds its connection the same report_min_duration, so
// reports that start together end together, for the whole month-end, and
// the limit only learns of a slowdown when reports end; staggered, one
// ends every hold ÷ max_size, as in a month-end whose reports take
// different times.
type feeder struct {
	enq     *app.Enqueuer
	entries []reportEntry

	wg      sync.WaitGroup // the staggered start
	mu      sync.Mutex
	next    int  // the next entry to enqueue
	total   int  // reports enqueued (not counting duplicates of queued ones)
	rounds  int  // times the month-end was started over, plus one
	feeding bool // the staggered start is under way
	err     error
}

// stagger enqueues n reports spacing apart, then n more, in the
// background until ctx ends; wait waits for it.
func (f *feeder) stagger(ctx context.Context, n int, spacing time.Duration) {
	f.mu.Lock()
	f.feeding = true
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		var err error
		for i := 0; i < n && err == nil; i++ {
			if i > 0 {
				t := time.NewTimer(spacing)
				select {
				case <-ctx.Done():
					err = ctx.Err()
				case <-t.C:
				}
				t.Stop()
			}
			if err == nil {
				err = f.add(ctx, 1)
			}
		}
		if err == nil {
			err = f.add(ctx, n)
		}
		f.mu.Lock()
		f.feeding = false
		f.err = cmp.Or(f.err, err)
		f.mu.Unlock()
	}()
}

func (f *feeder) wait() { f.wg.Wait() }

// add enqueues the next n reports. A report whose job is still queued or
// running is skipped (one job per report and period); after the last
// entry it starts the month-end over.
func (f *feeder) add(ctx context.Context, n int) error {
	for tries := 0; n > 0 && tries < 2*len(f.entries); tries++ {
		f.mu.Lock()
		if f.next == len(f.entries) {
			f.next = 0
			f.rounds++
		}
		e := f.entries[f.next]
		f.next++
		f.mu.Unlock()
		_, outcome, err := f.enq.EnqueueReport(ctx, e.report, e.period, e.tier)
		if err != nil {
			return err
		}
		if outcome != queues.Duplicate {
			n--
			f.mu.Lock()
			f.total++
			f.mu.Unlock()
		}
	}
	return nil
}

// state returns the reports enqueued so far, how many times the
// month-end was begun, whether the staggered start is under way, and its
// error.
func (f *feeder) state() (total, rounds int, feeding bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total, f.rounds + 1, f.feeding, f.err
}

// runSlowdown runs the third act on the running worker w: the month-end
// of plans again, with the traffic, a warm-up at full speed, the report
// database slowed, then recovered.
func runSlowdown(ctx context.Context, o Options, w *app.Worker, rec *recorder, plans []*reports.Plan, st *stage, setup *slowdownSetup) (SlowdownAct, error) {
	cfg := o.Config
	pool := setup.pool
	before, err := w.Client.PoolSize(ctx, pool)
	if err != nil {
		return SlowdownAct{}, err
	}
	if before.Adaptive == nil {
		return SlowdownAct{}, fmt.Errorf("pool %q has no adaptive limit", pool)
	}
	size := before
	res := SlowdownAct{
		Pool: pool, Min: size.Adaptive.Min, Max: size.Adaptive.Max,
		Window:    cmp.Or(setup.adaptive.Window, queues.DefaultAdaptiveWindow),
		Tolerance: cmp.Or(setup.adaptive.Tolerance, queues.DefaultAdaptiveTolerance),
		Factor:    SlowdownFactor, Capacity: size.Adaptive.Max,
		StartLimit: size.Adaptive.Limit, Lowest: size.Adaptive.Limit, FellAfter: -1, BackAfter: -1,
	}
	const name = "SLOWDOWN"
	setupText := fmt.Sprintf("the report database %gx slower, then healthy again", res.Factor)
	var rows []viewRow
	for _, p := range w.Client.Pools() {
		rows = append(rows, viewRow{key: p.Name(), label: p.Name(), size: p.MaxSize()})
	}
	view := &liveView{w: o.Out, terminal: o.Terminal, phase: name, rows: rows, refresh: o.Refresh}
	view.note("\n=== %s: %s ===\n"+
		"The walls of AFTER, the same traffic, and the month-end again. The %s pool is adaptive: its limit moves between %d and %d with its jobs' latency\n"+
		"against their baseline, decided every %s (tolerance %gx). The report database runs %d reports at full speed and shares itself among more;\n"+
		"%gx slower, it runs %.2g. The limit's baseline so far: %s (the reports' time; the bundles, which take no database share, do not count).",
		name, setupText, pool, res.Min, res.Max, res.Window, res.Tolerance, res.Capacity,
		res.Factor, float64(res.Capacity)/res.Factor, round(before.Adaptive.Baseline))

	enq, err := app.NewEnqueuerFor(cfg, w.Redis)
	if err != nil {
		return res, err
	}
	defer enq.Close()
	db := w.DB
	db.SetSlowdown(res.Capacity, 1)
	defer db.SetSlowdown(0, 1)

	traffic := &phase{
		rec: rec,
		enqueueOrder: func(ctx context.Context, p handlers.OrderPayload) (string, error) {
			info, err := queues.Enqueue(ctx, enq.Client, handlers.Order, p, queues.EnqueueOptions{})
			return info.ID, err
		},
		enqueueSearch: func(ctx context.Context, p handlers.SearchPayload) error {
			_, err := queues.Enqueue(ctx, enq.Client, handlers.Search, p, queues.EnqueueOptions{})
			return err
		},
	}
	// The traffic and the feeder stop with the act.
	actCtx, stopAct := context.WithCancel(ctx)
	trafficCtx, stopTraffic := context.WithCancel(actCtx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); traffic.orders(trafficCtx, o.OrdersPerSecond) }()
	go func() { defer wg.Done(); traffic.searches(trafficCtx, o.SearchesPerSecond) }()
	stop := func() { stopTraffic(); wg.Wait() }
	defer stop()

	start := time.Now()
	log := &limitLog{since: start.Add(-time.Second)}
	feed := &feeder{enq: enq, entries: monthEnd(cfg, plans)}
	spacing := cfg.ReportMinDuration / time.Duration(res.Max)
	feed.stagger(actCtx, res.Max, spacing)
	defer func() { stopAct(); feed.wait() }()
	view.note("[%s] month-end: its reports are enqueued so that %d wait in the %s pool (the first %d of them %s apart), until the limit is back at %d after the slowdown",
		name, res.Max, pool, res.Max, spacing, res.Max)
	feeding := true // the act keeps reports waiting

	var slowAt, recoverAt, trafficEnd time.Time
	rel := func(t time.Time) time.Duration {
		if slowAt.IsZero() {
			return t.Sub(start)
		}
		return t.Sub(slowAt)
	}
	tick := time.NewTicker(o.Refresh)
	defer tick.Stop()
	for {
		now := time.Now()
		size, err := w.Client.PoolSize(ctx, pool)
		if err != nil {
			return res, err
		}
		a := size.Adaptive
		log.add(a.Log)
		limit := size.Effective
		res.Lowest = min(res.Lowest, limit)
		for _, ch := range log.changes {
			res.Lowest = min(res.Lowest, ch.To)
		}
		total, rounds, staggering, ferr := feed.state()
		if ferr != nil {
			return res, ferr
		}
		done, failed, running := rec.reportCounts("", pool)
		ended := done + failed
		waiting := max(0, total-ended-running)
		if feeding && !staggering && waiting < res.Max {
			if err := feed.add(ctx, res.Max-waiting); err != nil {
				return res, err
			}
			total, rounds, _, _ = feed.state()
			waiting = max(0, total-ended-running)
		}

		var status string
		final := false
		switch {
		case slowAt.IsZero():
			// Ready once the act's own reports have set the baseline.
			ready := a.Baseline > 0
			if now.Sub(start) >= o.Warmup && (ready || now.Sub(start) >= o.Warmup+slowdownReady) {
				// The database slows as a report ends: the reports being
				// staggered, the others are then a quarter, a half and
				// three quarters through, and the nearest its end,
				// stretched, soon tells the limit. (Slowed a moment before
				// a report's end, that report would end nearly on time
				// and tell it nothing.)
				if err := nextEnd(ctx, rec, pool, cfg.ReportMinDuration); err != nil {
					return res, err
				}
				res.FellBeforeSlowdown = limit < res.Max
				db.SetSlowdown(res.Capacity, res.Factor)
				rec.startFlood()
				slowAt = time.Now()
				res.Warmup = slowAt.Sub(start)
				view.note("[%s] %s: the report database is now %gx slower (the jobs' baseline: %s)", name, signed(res.Warmup), res.Factor, round(a.Baseline))
				status = "the report database has just slowed"
				break
			}
			status = fmt.Sprintf("warm-up %s: the month-end's reports at full speed", tenths(now.Sub(start)))
			if now.Sub(start) < o.Warmup {
				status += fmt.Sprintf("; the report database slows in %s", tenths(o.Warmup-now.Sub(start)))
			} else {
				status += "; the database slows once the first reports have ended and set the baseline"
			}
		case recoverAt.IsZero():
			slow := now.Sub(slowAt)
			if res.FellAfter < 0 {
				if at, ok := firstChange(log.changes, slowAt, func(ch queues.AdaptiveChange) bool { return ch.To < res.Max }); ok {
					res.FellAfter = max(0, at.Sub(slowAt))
				}
			}
			if slow >= o.SlowFor && (res.FellAfter >= 0 || slow >= SlowdownFallLimit) {
				db.SetSlowdown(res.Capacity, 1)
				rec.endFlood()
				recoverAt = time.Now()
				res.SlowFor = recoverAt.Sub(slowAt)
				view.note("[%s] %s: the report database is healthy again", name, signed(res.SlowFor))
				status = "the report database has just recovered"
				break
			}
			status = fmt.Sprintf("the report database %gx slower for %s", res.Factor, tenths(slow))
			if slow < o.SlowFor {
				status += fmt.Sprintf("; it recovers in %s", tenths(o.SlowFor-slow))
			} else {
				status += "; it recovers once the limit has fallen"
			}
		case trafficEnd.IsZero():
			if res.BackAfter < 0 && limit == res.Max {
				res.BackAfter = 0
				if at, ok := firstChange(log.changes, recoverAt, func(ch queues.AdaptiveChange) bool { return ch.To == res.Max }); ok {
					res.BackAfter = max(0, at.Sub(recoverAt))
				}
			}
			since := now.Sub(recoverAt)
			status = fmt.Sprintf("the report database healthy again for %s", tenths(since))
			if res.BackAfter < 0 {
				status += fmt.Sprintf("; the limit climbs back to %d", res.Max)
			} else {
				status += fmt.Sprintf("; the limit back at %d %s after the recovery; the reports still queued run", res.Max, tenths(res.BackAfter))
			}
			if feeding && (res.BackAfter >= 0 || since >= SlowdownBackLimit) {
				feeding = false
			}
			if !feeding && ended >= total {
				stop()
				trafficEnd = time.Now()
			}
		default:
			waiting, _ := rec.waiting()
			status = fmt.Sprintf("the reports done; traffic stopped, %d orders still waiting", waiting)
			final = waiting == 0 || time.Since(trafficEnd) >= drainLimit
		}
		reportsLine := fmt.Sprintf("%d/%d done, %d running, %d waiting", done, total, running, waiting)
		if rounds > 1 {
			reportsLine += fmt.Sprintf(" (the month-end's reports, round %d)", rounds)
		}
		if failed > 0 {
			reportsLine += fmt.Sprintf(", %d failed", failed)
		}
		dbLine := fmt.Sprintf("report database: healthy, %d reports at full speed", res.Capacity)
		if f := db.Slowdown(); f > 1 {
			dbLine = fmt.Sprintf("report database: %gx slower, %.2g reports at full speed instead of %d", f, float64(res.Capacity)/f, res.Capacity)
		}
		limitLine := fmt.Sprintf("%s limit: %d of %d %s (adaptive, min %d); lowest so far %d; baseline %s", pool, limit, res.Max, bar(limit, res.Max), res.Min, res.Lowest, round(a.Baseline))
		if n := len(log.changes); n > 0 {
			ch := log.changes[n-1]
			limitLine += fmt.Sprintf("\n    last change at %s: %d -> %d, %s", signed(rel(ch.At)), ch.From, ch.To, ch.Reason)
		}
		sqlStats := db.SQL().Stats()
		if st != nil {
			st.show(name+": "+setupText, status, rec.peek(), 0, sqlStats.InUse, sqlStats.MaxOpenConnections, o.OrdersPerSecond, o.OrderTimeout,
				web.Gauge{Key: gaugeLimit, Label: pool + " pool's adaptive limit", Value: float64(limit), Max: float64(res.Max), Alert: limit < res.Max},
				web.Gauge{Key: gaugeSlowdown, Label: "report database slowdown (x)", Value: db.Slowdown(), Alert: db.Slowdown() > 1})
		}
		if view.due(now, final) {
			view.draw(now, status, rec.snapshot(), db.PeakConnections(), sqlStats.InUse, sqlStats.MaxOpenConnections, reportsLine, "  "+dbLine, "  "+limitLine)
		}
		if final {
			res.EndLimit = limit
			res.ReportsTotal = total
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-tick.C:
		}
	}
	res.Took = time.Since(start)

	// The results, counted inside the handlers.
	parts := rec.orderParts()
	res.OrderBefore, res.OrderDuring, res.OrderAfter = parts[0], parts[1], parts[2]
	res.OrdersEnqueued, res.OrdersCompleted = rec.orderCount()
	res.ReportsDone, res.ReportsFailed, _ = rec.reportCounts("", pool)
	for _, ch := range log.changes {
		res.Changes = append(res.Changes, LimitChange{At: ch.At.Sub(slowAt), From: ch.From, To: ch.To, Reason: ch.Reason})
		if ch.At.Before(slowAt) && ch.To < ch.From {
			res.FellBeforeSlowdown = true
		}
	}
	for _, ch := range log.notes {
		res.Notes = append(res.Notes, LimitChange{At: ch.At.Sub(slowAt), Reason: ch.Reason})
	}
	res.Starts, res.MostAtOnce, res.OverLimit = overLimit(rec.watchedStarts(), log, res.StartLimit, res.Max)
	for _, l := range res.Timeline(name) {
		view.note("%s", l)
	}
	return res, nil
}

// overLimit counts starts, the most jobs inside at once at a start, and
// the starts that found more jobs inside (themselves included) than the
// limit allowed then (limitLog.allowed, never above max).
func overLimit(starts []rowStart, log *limitLog, startLimit, maxSize int) (n, most, over int) {
	for _, s := range starts {
		n++
		most = max(most, s.inside)
		if s.inside > min(maxSize, log.allowed(startLimit, s.at)) {
			over++
		}
	}
	return n, most, over
}

// nextEnd waits until a job of row ends, or limit passes.
func nextEnd(ctx context.Context, rec *recorder, row string, limit time.Duration) error {
	last := rec.lastEnd(row)
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for rec.lastEnd(row).Equal(last) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// firstChange returns the time of the first change at or after since
// that ok accepts.
func firstChange(changes []queues.AdaptiveChange, since time.Time, ok func(queues.AdaptiveChange) bool) (time.Time, bool) {
	for _, ch := range changes {
		if !ch.At.Before(since) && ok(ch) {
			return ch.At, true
		}
	}
	return time.Time{}, false
}

// Timeline returns the limit's timeline as the act prints it: the
// database's slowdown and recovery, and every change of the limit, with
// its reason.
func (a SlowdownAct) Timeline(phase string) []string {
	type event struct {
		at   time.Duration
		line string
	}
	events := []event{{0, fmt.Sprintf("the report database: %gx slower", a.Factor)}}
	if a.SlowFor > 0 {
		events = append(events, event{a.SlowFor, "the report database: healthy again"})
	}
	for _, ch := range a.Changes {
		events = append(events, event{ch.At, fmt.Sprintf("%d -> %d  %s", ch.From, ch.To, ch.Reason)})
	}
	for _, n := range a.Notes {
		events = append(events, event{n.At, "        " + n.Reason})
	}
	slices.SortStableFunc(events, func(x, y event) int { return cmp.Compare(x.at, y.at) })
	out := []string{fmt.Sprintf("[%s] the %s pool's limit (from its log in Redis; times from the slowdown):", phase, a.Pool)}
	for _, e := range events {
		out = append(out, fmt.Sprintf("  %8s  %s", signed(e.at), e.line))
	}
	if len(a.Changes) == 0 {
		out = append(out, "  (the limit did not change)")
	}
	return out
}

// signed formats d with its sign, in tenths of a second.
func signed(d time.Duration) string {
	s := tenths(d).String()
	if !strings.HasPrefix(s, "-") {
		s = "+" + s
	}
	return s
}
