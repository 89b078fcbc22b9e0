package queues

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// Observer is told when a pool's job starts and when it ends, for metrics
// (package metrics implements it for Prometheus). The runner calls it on
// the job's own goroutine: it must be quick and must not block, and it must
// be safe for concurrent use. It never changes what happens to a job.
type Observer interface {
	// JobStarted is called when a job starts running: after it got its
	// cluster-wide slot, inside the pool's bulkhead, just before the
	// handler.
	JobStarted(JobStart)
	// JobFinished is called when the pool is done with a job, whether it
	// ran or not (JobEnd.Outcome says which).
	JobFinished(JobEnd)
}

// JobStart describes a job that starts running.
type JobStart struct {
	Pool, Tier, JobType, JobID string
	// Retried is how many times the job ran before (asynq's retry count).
	Retried int
	// Wait is how long the job waited from the moment it was ready to run
	// (its enqueue, or the end of its ProcessIn delay) to this start,
	// measured against the clock of the process that enqueued it. It is
	// known (WaitKnown) only for a job's first attempt of a job enqueued by
	// a Client (which stamps the time in the job's headers): a retry's
	// wait would count its backoff, and jobs enqueued by other tools carry
	// no stamp.
	Wait      time.Duration
	WaitKnown bool
}

// JobOutcome says how a pool was done with a job.
type JobOutcome string

// Job outcomes.
const (
	// OutcomeSucceeded: the handler returned nil.
	OutcomeSucceeded JobOutcome = "succeeded"
	// OutcomeRetried: the job failed and will be retried.
	OutcomeRetried JobOutcome = "retried"
	// OutcomeArchived: the job failed for good (a permanent failure, or
	// max_retry used up) and asynq archives it with its reason.
	OutcomeArchived JobOutcome = "archived"
	// OutcomeRequeued: the job did not run to its end through no fault of
	// its own: it gave up waiting for a cluster-wide slot, Redis failed
	// while it asked for one, or the worker stopped under it. It goes back
	// to its queue without using up a retry.
	OutcomeRequeued JobOutcome = "requeued"
	// OutcomeFenced: another worker process took the job over while this
	// one did not answer (stalled, or cut off from Redis); it runs there,
	// and nothing of this run is recorded (ErrFenced).
	OutcomeFenced JobOutcome = "fenced"
	// OutcomeCancelled: the job's run was cancelled (Client.CancelRun):
	// it did not start, or its handler's context was cancelled under it.
	// asynq archives it with ErrRunCancelled; it is not retried.
	OutcomeCancelled JobOutcome = "cancelled"
)

// JobOutcomes lists every JobOutcome, for exporters that want every series
// from the start.
var JobOutcomes = []JobOutcome{OutcomeSucceeded, OutcomeRetried, OutcomeArchived, OutcomeRequeued, OutcomeFenced, OutcomeCancelled}

// JobEnd describes a job the pool is done with.
type JobEnd struct {
	Pool, Tier, JobType, JobID string
	Outcome                    JobOutcome
	// Started says whether the handler ran (false when the job gave up
	// waiting for a slot, or was refused before it ran); Run is how long
	// it ran, zero when it did not.
	Started bool
	Run     time.Duration
	// Err is the handler's error, nil when it succeeded.
	Err error
}

// readyAtHeader (rdb.ReadyAtHeader) carries, in a job's asynq headers, when the job is ready to
// run: its enqueue time plus its ProcessIn delay, in Unix nanoseconds.
const readyAtHeader = rdb.ReadyAtHeader

// readyAt returns when a job was first ready to run, from the header the
// Client stamps, or the zero time when it has none or is a retry (a retry
// was ready again later, when asynq moved it back to its queue).
func readyAt(t *asynq.Task, retried int) time.Time {
	if v, ok := t.Headers()[readyAtHeader]; ok && retried == 0 {
		if ns, err := strconv.ParseInt(v, 10, 64); err == nil {
			return time.Unix(0, ns)
		}
	}
	return time.Time{}
}

// jobHeaders are the headers the Client stamps on a job it enqueues at now,
// with its trace headers (key, value pairs; nil for none). The door writes
// the same headers without a map (appendTaskMessage):
// TestDoorWritesAsynqJobs checks that both carry the same ones.
func jobHeaders(now time.Time, o EnqueueOptions, trace []string) map[string]string {
	h := make(map[string]string, 1+len(trace)/2)
	h[readyAtHeader] = strconv.FormatInt(jobReadyAt(now, o), 10)
	if o.run != "" {
		h[rdb.RunHeader] = o.run
	}
	for i := 0; i+1 < len(trace); i += 2 {
		h[trace[i]] = trace[i+1]
	}
	return h
}

// jobReadyAt is the ready-at header's value (Unix ns) of a job enqueued
// at now.
func jobReadyAt(now time.Time, o EnqueueOptions) int64 {
	return now.Add(max(0, o.ProcessIn)).UnixNano()
}

// watch follows one job for the pool's observer; nil without an observer
// (its methods then do nothing).
type watch struct {
	obs     Observer
	clock   func() time.Time
	end     JobEnd
	retried int
	headers map[string]string
	started time.Time
	ended   time.Time // when the handler returned (zero: not yet, or it never ran)
}

// watchJob starts following a job for the observer, or returns nil.
func (r *runner) watchJob(ctx context.Context, p *Pool, t *asynq.Task) *watch {
	obs := r.c.cfg.Observer
	if obs == nil {
		return nil
	}
	id, _ := asynq.GetTaskID(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	return &watch{
		obs: obs, clock: r.c.cfg.Clock, retried: retried, headers: t.Headers(),
		end: JobEnd{Pool: p.Name(), Tier: p.TierOf(queue), JobType: t.Type(), JobID: id},
	}
}

// start reports the job starting now.
func (w *watch) start() {
	if w == nil {
		return
	}
	w.started = w.clock()
	s := JobStart{Pool: w.end.Pool, Tier: w.end.Tier, JobType: w.end.JobType, JobID: w.end.JobID, Retried: w.retried}
	if v, ok := w.headers[readyAtHeader]; ok && w.retried == 0 {
		if ns, err := strconv.ParseInt(v, 10, 64); err == nil {
			s.Wait, s.WaitKnown = max(0, w.started.Sub(time.Unix(0, ns))), true
		}
	}
	w.obs.JobStarted(s)
}

// returned notes that the handler returned: the job's run time ends here,
// not when its outcome goes back to asynq (which may wait for Redis).
func (w *watch) returned() {
	if w == nil {
		return
	}
	w.ended = w.clock()
}

// finish reports the job's end: err is what the pool's handler returns to
// asynq, stopping says whether the client is stopping.
func (w *watch) finish(ctx context.Context, err error, stopping bool) {
	if w == nil {
		return
	}
	e := w.end
	e.Err = err
	if !w.started.IsZero() {
		end := w.ended
		if end.IsZero() {
			end = w.clock()
		}
		e.Started, e.Run = true, end.Sub(w.started)
	}
	e.Outcome = outcomeOf(ctx, err, stopping)
	w.obs.JobFinished(e)
}

// outcomeOf says what asynq does with a job whose handler returned err.
func outcomeOf(ctx context.Context, err error, stopping bool) JobOutcome {
	switch {
	case errors.Is(err, ErrFenced):
		return OutcomeFenced
	case stopping && errors.Is(ctx.Err(), context.Canceled):
		// asynq cancels a job still running when the shutdown timeout
		// ends and puts it back at the head of its queue, whatever the
		// handler then returns.
		return OutcomeRequeued
	case err == nil:
		return OutcomeSucceeded
	case errors.Is(err, errGateWait) || errors.Is(err, errGateRedis) || errors.Is(err, errRunRedis):
		return OutcomeRequeued
	case errors.Is(err, ErrRunCancelled):
		return OutcomeCancelled
	case errors.Is(err, asynq.SkipRetry):
		return OutcomeArchived
	}
	retried, _ := asynq.GetRetryCount(ctx)
	if maxRetry, ok := asynq.GetMaxRetry(ctx); ok && retried >= maxRetry {
		return OutcomeArchived
	}
	return OutcomeRetried
}

// isStopping reports whether Stop was called. It does not take r.mu: a
// reconfiguration holds it while a pool drains, and the jobs ending
// meanwhile ask this.
func (r *runner) isStopping() bool { return r.stopFlag.Load() }

// Running reports whether the client runs its pools: Start succeeded for
// every pool and Stop was not called. A client without Handlers never
// runs.
func (c *Client) Running() bool {
	if c.run == nil {
		return false
	}
	c.run.mu.Lock()
	defer c.run.mu.Unlock()
	return c.run.started && !c.run.stopping
}
