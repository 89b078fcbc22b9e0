package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/queues"
)

// rateWindow is the window of the live view's done/s column and of its
// recent order latency.
const rateWindow = time.Second

// ErrOrderTimedOut is matched by the failure of an order job that was not
// done within its request timeout (Options.OrderTimeout) of being enqueued:
// the customer's request gave up. It also matches asynq.SkipRetry: a
// request that gave up is not retried.
var ErrOrderTimedOut = errors.New("order request timed out")

// recorder observes every job from inside the handlers of one phase: how
// many jobs of each row of the live view run at once, how many finished,
// and every order's latency from enqueue to the end of its job.
type recorder struct {
	orderTimeout time.Duration
	// tierOf names the tier of a report's queue; nil records no starts.
	tierOf func(queue string) string

	// pendMu is held across an order's enqueue, so that its job cannot
	// look up its enqueue time before it is recorded.
	pendMu  sync.Mutex
	pending map[string]time.Time // order job ID -> enqueued at

	mu       sync.Mutex
	rows     map[string]*rowStats
	floodAt  time.Time // zero until the month-end (the slowdown in the third act) starts
	floodEnd time.Time // zero until every report has finished (the database recovered)
	// orders: before, during and after the month-end (the slowdown). The
	// phases count the first two; the third act all three.
	orders        [3]orderTally
	enqueued      int        // orders enqueued
	recent        []orderEnd // orders that ended within rateWindow
	starts        []ReportStart
	reportsDone   map[string]int // by tier ("" without tiers)
	reportsFailed map[string]int // failed for good, by tier
	// watch names the row whose every start is kept in watched (the
	// third act's batch pool; "" for none).
	watch   string
	watched []rowStart
}

// rowStart is a job of the watched row starting: when, and how many of
// the row's jobs were inside the handlers then, itself included.
type rowStart struct {
	at     time.Time
	inside int
}

// rowStats is one row of the live view: a pool, or one kind of job inside
// the shared pool.
type rowStats struct {
	inside   int         // jobs in the handler now
	peak     int         // most at once, whole phase
	interval int         // most at once since the view last took it
	jobs     int         // jobs that ended
	ends     []time.Time // ends within rateWindow
	lastEnd  time.Time   // the latest end
}

type orderTally struct {
	lat      []time.Duration
	timedOut int
	errors   int
}

type orderEnd struct {
	at  time.Time
	lat time.Duration
}

func newRecorder(orderTimeout time.Duration, tierOf func(queue string) string) *recorder {
	return &recorder{
		orderTimeout: orderTimeout, tierOf: tierOf, pending: map[string]time.Time{}, rows: map[string]*rowStats{},
		reportsDone: map[string]int{}, reportsFailed: map[string]int{},
	}
}

func (r *recorder) row(name string) *rowStats {
	s, ok := r.rows[name]
	if !ok {
		s = &rowStats{}
		r.rows[name] = s
	}
	return s
}

// enqueueOrder records the enqueue time of the order that enqueue adds.
func (r *recorder) enqueueOrder(enqueue func() (id string, err error)) error {
	r.pendMu.Lock()
	defer r.pendMu.Unlock()
	at := time.Now()
	id, err := enqueue()
	if err == nil {
		r.pending[id] = at
		r.mu.Lock()
		r.enqueued++
		r.mu.Unlock()
	}
	return err
}

// waiting returns how many orders were enqueued and have not ended, and
// how long the oldest of them has waited.
func (r *recorder) waiting() (n int, oldest time.Duration) {
	r.pendMu.Lock()
	defer r.pendMu.Unlock()
	now := time.Now()
	for _, at := range r.pending {
		oldest = max(oldest, now.Sub(at))
	}
	return len(r.pending), oldest
}

// startFlood marks the start of the month-end.
func (r *recorder) startFlood() {
	r.mu.Lock()
	r.floodAt = time.Now()
	r.mu.Unlock()
}

// endFlood marks the end of the month-end: every report has finished.
func (r *recorder) endFlood() {
	r.mu.Lock()
	r.floodEnd = time.Now()
	r.mu.Unlock()
}

// wrap observes next, counting each job in the rows rowsOf names (see
// observe).
func (r *recorder) wrap(rowsOf func(jobType string) []string, next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		q, _ := asynq.GetQueueName(ctx)
		retried, _ := asynq.GetRetryCount(ctx)
		maxRetry, _ := asynq.GetMaxRetry(ctx)
		return r.observe(ctx, job{id: id, queue: q, lastTry: retried >= maxRetry}, rowsOf(t.Type()), t, next)
	})
}

// job is what observe needs to know of a job besides its task.
type job struct {
	id, queue string
	lastTry   bool // a failure now is for good
}

// observe runs j with next, counting it in rows. An order job runs with
// its request's deadline, its enqueue time plus the order timeout; past it,
// the job fails for good with ErrOrderTimedOut.
func (r *recorder) observe(ctx context.Context, j job, rows []string, t *asynq.Task, next asynq.Handler) error {
	id := j.id
	isOrder := t.Type() == handlers.TypeOrder
	var enqueuedAt time.Time
	tracked := false
	if isOrder {
		r.pendMu.Lock()
		enqueuedAt, tracked = r.pending[id]
		r.pendMu.Unlock()
		if tracked {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, enqueuedAt.Add(r.orderTimeout))
			defer cancel()
		}
	}

	r.mu.Lock()
	for _, name := range rows {
		s := r.row(name)
		s.inside++
		s.peak = max(s.peak, s.inside)
		s.interval = max(s.interval, s.inside)
		if name == r.watch {
			r.watched = append(r.watched, rowStart{at: time.Now(), inside: s.inside})
		}
	}
	tier := ""
	if t.Type() == handlers.TypeReport && r.tierOf != nil {
		tier = r.tierOf(j.queue)
		var rp handlers.ReportPayload
		_ = json.Unmarshal(t.Payload(), &rp)
		r.starts = append(r.starts, ReportStart{Report: rp.Report, Period: rp.Period, Tier: tier, At: time.Since(r.floodAt)})
	}
	r.mu.Unlock()

	err := next.ProcessTask(ctx, t)

	end := time.Now()
	timedOut := tracked && err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
	if tracked {
		r.pendMu.Lock()
		_, tracked = r.pending[id] // a retried job is counted once, at its first end
		delete(r.pending, id)
		r.pendMu.Unlock()
	}

	r.mu.Lock()
	for _, name := range rows {
		s := r.row(name)
		s.inside--
		s.jobs++
		s.ends = append(prune(s.ends, end), end)
		s.lastEnd = end
	}
	switch t.Type() {
	case handlers.TypeReport:
		switch {
		case err == nil:
			r.reportsDone[tier]++
		case j.lastTry || errors.Is(err, asynq.SkipRetry):
			r.reportsFailed[tier]++
		}
	case handlers.TypeOrder:
		if tracked {
			r.noteOrder(enqueuedAt, end, err, timedOut)
		}
	}
	r.mu.Unlock()

	if timedOut {
		return queues.Permanent(fmt.Errorf("%w: it waited %s, longer than the %s a request waits (%v)",
			ErrOrderTimedOut, end.Sub(enqueuedAt).Round(time.Millisecond), r.orderTimeout, err))
	}
	return err
}

// noteOrder counts one order in the tally of when it was enqueued: before,
// during or after the month-end. r.mu is held.
func (r *recorder) noteOrder(enqueuedAt, end time.Time, err error, timedOut bool) {
	i := r.part(enqueuedAt)
	lat := end.Sub(enqueuedAt)
	r.orders[i].lat = append(r.orders[i].lat, lat)
	switch {
	case timedOut:
		r.orders[i].timedOut++
	case err != nil:
		r.orders[i].errors++
	}
	kept := r.recent[:0]
	for _, e := range r.recent {
		if end.Sub(e.at) < rateWindow {
			kept = append(kept, e)
		}
	}
	r.recent = append(kept, orderEnd{at: end, lat: lat})
}

// part says which tally an order enqueued at belongs to: 0 before the
// month-end, 1 during it, 2 after it. r.mu is held.
func (r *recorder) part(enqueuedAt time.Time) int {
	switch {
	case r.floodAt.IsZero() || enqueuedAt.Before(r.floodAt):
		return 0
	case r.floodEnd.IsZero() || enqueuedAt.Before(r.floodEnd):
		return 1
	default:
		return 2
	}
}

// prune drops the times older than rateWindow before now.
func prune(ts []time.Time, now time.Time) []time.Time {
	i := 0
	for i < len(ts) && now.Sub(ts[i]) >= rateWindow {
		i++
	}
	return ts[i:]
}

// rowSnapshot is one row of the live view.
type rowSnapshot struct {
	active, peak, perSecond int
}

// liveSnapshot is what the live view shows of the handlers.
type liveSnapshot struct {
	rows             map[string]rowSnapshot
	recent           Latency // orders that ended within rateWindow
	timedOut, errors int     // orders so far
	waiting          int
	oldest           time.Duration
}

// snapshot reads the live numbers and starts a new interval for the peaks.
func (r *recorder) snapshot() liveSnapshot { return r.read(true) }

// peek reads the live numbers as snapshot does, leaving the peaks'
// interval running (for the dashboard's scene, read more often than the
// view is drawn).
func (r *recorder) peek() liveSnapshot { return r.read(false) }

func (r *recorder) read(newInterval bool) liveSnapshot {
	waiting, oldest := r.waiting()
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	s := liveSnapshot{rows: map[string]rowSnapshot{}, waiting: waiting, oldest: oldest}
	for name, st := range r.rows {
		st.ends = prune(st.ends, now)
		s.rows[name] = rowSnapshot{active: st.inside, peak: st.interval, perSecond: len(st.ends)}
		if newInterval {
			st.interval = st.inside
		}
	}
	var lat []time.Duration
	for _, e := range r.recent {
		if now.Sub(e.at) < rateWindow {
			lat = append(lat, e.lat)
		}
	}
	s.recent = summarize(lat)
	for _, o := range r.orders {
		s.timedOut += o.timedOut
		s.errors += o.errors
	}
	return s
}

// reportCounts returns how many reports of tier ("" without tiers) are
// done and failed for good, and how many of row's jobs are inside the
// handler now.
func (r *recorder) reportCounts(tier, row string) (done, failed, running int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.rows[row]; ok {
		running = s.inside
	}
	return r.reportsDone[tier], r.reportsFailed[tier], running
}

// Orders summarises the orders enqueued in one part of a phase.
type Orders struct {
	Latency
	// TimedOut orders were not done within the order timeout of being
	// enqueued; Errors failed otherwise. Both are in Latency too.
	TimedOut, Errors int
}

// orderResults returns the orders enqueued before and during the
// month-end. An order still waiting when the phase ends counts as timed
// out once it has waited longer than the order timeout.
func (r *recorder) orderResults() (before, during Orders) {
	o := r.orderParts()
	return o[0], o[1]
}

// orderParts returns the orders enqueued before, during and after the
// month-end (the slowdown), counted as orderResults counts them.
func (r *recorder) orderParts() [3]Orders {
	r.pendMu.Lock()
	now := time.Now()
	var late []time.Time
	for _, at := range r.pending {
		if now.Sub(at) > r.orderTimeout {
			late = append(late, at)
		}
	}
	r.pendMu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	tallies := r.orders
	for i := range tallies {
		tallies[i].lat = slices.Clone(tallies[i].lat)
	}
	for _, at := range late {
		i := r.part(at)
		tallies[i].lat = append(tallies[i].lat, now.Sub(at))
		tallies[i].timedOut++
	}
	var out [3]Orders
	for i, t := range tallies {
		out[i] = Orders{Latency: summarize(t.lat), TimedOut: t.timedOut, Errors: t.errors}
	}
	return out
}

// orderCount returns how many orders were enqueued, and how many of them
// ended without an error (not timed out, not failed).
func (r *recorder) orderCount() (enqueued, completed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.orders {
		completed += len(t.lat) - t.timedOut - t.errors
	}
	return r.enqueued, completed
}

// inside returns how many jobs are inside the handlers now, every row
// together.
func (r *recorder) inside() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.rows {
		n += s.inside
	}
	return n
}

// lastEnd returns when the latest job of row ended (zero: none yet).
func (r *recorder) lastEnd(row string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.rows[row]; ok {
		return s.lastEnd
	}
	return time.Time{}
}

// watchedStarts returns the starts of the watched row, in order.
func (r *recorder) watchedStarts() []rowStart {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.watched)
}

// peaks returns the most jobs each row ran at once and how many ended.
func (r *recorder) peaks() (peak, jobs map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	peak, jobs = map[string]int{}, map[string]int{}
	for name, s := range r.rows {
		peak[name], jobs[name] = s.peak, s.jobs
	}
	return peak, jobs
}

// reportStarts returns the report starts in the order they were seen.
func (r *recorder) reportStarts() []ReportStart {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.starts)
}

// tierOfQueue returns the tier part of a tiered queue name
// (namespace:pool:tier).
func tierOfQueue(q string) string { return q[strings.LastIndex(q, ":")+1:] }
