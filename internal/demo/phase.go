package demo

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/database"
)

// drainLimit bounds how long a phase waits, after its last report, for
// the orders still waiting; an order still waiting then counts as timed
// out once it is older than the order timeout.
const drainLimit = 5 * time.Second

// phase is one run of the story's load on one setup: steady order and
// search traffic, a warm-up, the month-end flood, and the wait for it.
type phase struct {
	view *liveView
	rec  *recorder

	enqueueOrder  func(ctx context.Context, p handlers.OrderPayload) (id string, err error)
	enqueueSearch func(ctx context.Context, p handlers.SearchPayload) error
	// flood enqueues the month-end and returns how many reports it holds.
	flood func(ctx context.Context) (int, error)
	// progress says how far the reports are and whether all have finished.
	progress func(ctx context.Context) (line string, finished bool, err error)
	// held returns the most connections each row's jobs held at once.
	held func() map[string]int
	db   *sql.DB
	// stage, when set, is the dashboard's view of the phase, set at every
	// refresh: its title, and shared, the shared pool's size (0: none).
	stage  *stage
	title  string
	shared int
	// minDuration: once the reports are done, the traffic goes on until
	// the phase has run this long (0: it stops at once), so that a person
	// watching the dashboard sees the phase and its end.
	minDuration time.Duration
}

// phaseTimes is how long a phase's month-end took.
type phaseTimes struct {
	monthEnd, enqueue time.Duration
}

// run drives the phase until every report has finished and the orders
// waiting then have ended (or drainLimit passed), drawing the live view.
func (p *phase) run(ctx context.Context, o Options) (phaseTimes, error) {
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var traffic sync.WaitGroup
	traffic.Add(2)
	go func() { defer traffic.Done(); p.orders(trafficCtx, o.OrdersPerSecond) }()
	go func() { defer traffic.Done(); p.searches(trafficCtx, o.SearchesPerSecond) }()
	stop := func() { stopTraffic(); traffic.Wait() }
	defer stop()

	var times phaseTimes
	start := time.Now()
	var floodAt, floodEnd, trafficEnd time.Time
	tick := time.NewTicker(o.Refresh)
	defer tick.Stop()
	for {
		now := time.Now()
		if floodAt.IsZero() && now.Sub(start) >= o.Warmup {
			p.rec.startFlood()
			floodAt = time.Now()
			n, err := p.flood(ctx)
			if err != nil {
				return times, err
			}
			times.enqueue = time.Since(floodAt)
			p.view.note("[%s] month-end: enqueued %d reports in %s", p.view.phase, n, times.enqueue.Round(time.Millisecond))
			now = time.Now()
		}
		status := fmt.Sprintf("warm-up %s: order and search traffic only, month-end in %s", tenths(now.Sub(start)), tenths(o.Warmup-now.Sub(start)))
		reports := "not enqueued yet"
		final := false
		if !floodAt.IsZero() {
			line, finished, err := p.progress(ctx)
			if err != nil {
				return times, err
			}
			reports = line
			status = fmt.Sprintf("month-end running %s", tenths(now.Sub(floodAt)))
			if finished && floodEnd.IsZero() {
				p.rec.endFlood()
				floodEnd = time.Now()
				times.monthEnd = floodEnd.Sub(floodAt)
			}
			if !floodEnd.IsZero() && trafficEnd.IsZero() && time.Since(start) >= p.minDuration {
				stop()
				trafficEnd = time.Now()
			}
			switch {
			case floodEnd.IsZero():
			case trafficEnd.IsZero():
				status = fmt.Sprintf("month-end done in %s; the traffic goes on until the phase has run %s, for the dashboard", tenths(times.monthEnd), p.minDuration)
			default:
				waiting, _ := p.rec.waiting()
				status = fmt.Sprintf("month-end done in %s; traffic stopped, %d orders still waiting", tenths(times.monthEnd), waiting)
				final = waiting == 0 || time.Since(trafficEnd) >= drainLimit
			}
		}
		st := p.db.Stats()
		if p.stage != nil {
			p.stage.show(p.title, status, p.rec.peek(), p.shared, st.InUse, st.MaxOpenConnections, o.OrdersPerSecond, o.OrderTimeout)
		}
		if p.view.due(now, final) {
			p.view.draw(now, status, p.rec.snapshot(), p.held(), st.InUse, st.MaxOpenConnections, reports)
		}
		if final {
			return times, nil
		}
		select {
		case <-ctx.Done():
			return times, ctx.Err()
		case <-tick.C:
		}
	}
}

// every calls fn perSecond times a second until ctx ends.
func every(ctx context.Context, perSecond int, fn func()) {
	tick := time.NewTicker(time.Second / time.Duration(perSecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			fn()
		}
	}
}

// orders enqueues perSecond orders a second; both phases draw the same
// orders.
func (p *phase) orders(ctx context.Context, perSecond int) {
	rng := rand.New(rand.NewPCG(1, 1))
	every(ctx, perSecond, func() {
		order := handlers.OrderPayload{
			Region: database.Regions[rng.IntN(len(database.Regions))], Category: database.Categories[rng.IntN(len(database.Categories))],
			CustomerID: 1 + rng.IntN(2000), AmountCents: 500 + rng.Int64N(9500),
		}
		// The demo's traffic is best effort; the summary counts what ran.
		_ = p.rec.enqueueOrder(func() (string, error) { return p.enqueueOrder(ctx, order) })
	})
}

// searches enqueues perSecond search updates a second.
func (p *phase) searches(ctx context.Context, perSecond int) {
	rng := rand.New(rand.NewPCG(2, 2))
	every(ctx, perSecond, func() {
		id := 1 + rng.Int64N(500)
		product := handlers.SearchPayload{ProductID: id, Title: fmt.Sprintf("product %d", id), Category: database.Categories[id%int64(len(database.Categories))]}
		_ = p.enqueueSearch(ctx, product)
	})
}

func tenths(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }

// idle waits until no job of rec's rows is inside the handlers, or limit
// passes.
func idle(ctx context.Context, rec *recorder, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		if rec.inside() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}
