package queues

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// The runner's side of runs: a job of a run (its headers name it) tells
// the run's record when it starts and when it ends, and a cancelled run's
// running jobs see their handlers' contexts cancelled (runWatch).

// runCheckEvery is how often a process that runs jobs of runs checks
// whether one of those runs was cancelled.
const runCheckEvery = 250 * time.Millisecond

// runDueEvery is how often a worker enqueues the completion steps of runs
// whose steps are due and were not enqueued (their process died between).
const runDueEvery = 2 * time.Second

// errRunRedis marks a job of a run that did not start because Redis failed
// while it told its run's record. No retry is used up.
var errRunRedis = errors.New("could not reach Redis for its run's record")

// runJob is one attempt of a job that belongs to a run.
type runJob struct {
	run     string
	job     rdb.RunJob
	started bool // the record says it runs (start answered "run")
	cut     bool // its handler's context was cancelled with its run
	mu      sync.Mutex
	cancel  context.CancelFunc
}

// runJobOf returns the attempt's run job, nil for a job of no run.
func (r *runner) runJobOf(ctx context.Context, p *Pool, t *asynq.Task) *runJob {
	run := t.Headers()[rdb.RunHeader]
	if run == "" {
		return nil
	}
	id, _ := asynq.GetTaskID(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	return &runJob{run: run, job: rdb.RunJob{ID: id, Tier: p.TierOf(queue), Queue: queue}}
}

// startRun records that the job starts. It returns a non-nil error when
// the job must not run: ErrRunCancelled (Permanent: archived, not
// retried), nil-with-skip for a job the record says succeeded already, or
// Redis's error (the job goes back to its queue).
func (r *runner) startRun(ctx context.Context, rj *runJob) (skip bool, err error) {
	var verdict string
	err = r.whileRedisDown(ctx, func() (err error) {
		verdict, err = r.c.runs.Start(ctx, rj.run, rj.job)
		return err
	}, func(error) bool { return true })
	if err != nil {
		return false, fmt.Errorf("%w: %w", errRunRedis, err)
	}
	switch verdict {
	case rdb.RunCancelled:
		return false, Permanent(ErrRunCancelled)
	case rdb.RunSucceeded:
		return true, nil // ended already (a worker killed before asynq heard): not run again
	case rdb.RunFailed, rdb.RunRefused:
		return false, Permanent(errors.New("failed for good already, in a worker that stopped before asynq heard of it"))
	case "run":
		rj.started = true
	}
	return false, nil
}

// endRun records how the job came back: err is what asynq is told.
func (r *runner) endRun(ctx context.Context, rj *runJob, err error, stopping bool) {
	if rj == nil || !rj.started || errors.Is(err, ErrFenced) {
		return
	}
	state, reason := rdb.RunQueued, ""
	switch outcomeOf(ctx, err, stopping) {
	case OutcomeSucceeded:
		state = rdb.RunSucceeded
	case OutcomeCancelled:
		state = rdb.RunCancelled
	case OutcomeArchived:
		state, reason = rdb.RunFailed, err.Error()
	case OutcomeFenced:
		return
	}
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var due string
	werr := r.whileRedisDown(bg, func() (err error) {
		_, due, err = r.c.runs.End(bg, rj.run, rj.job, state, reason)
		return err
	}, func(error) bool { return true })
	if werr != nil {
		r.log.Warn("run: a job's end not recorded", "run", rj.run, "job_id", rj.job.ID, "state", state, "error", werr)
		return
	}
	r.c.fireIfDue(bg, rj.run, due)
}

// runWatch holds the running jobs of runs in this process, to cancel their
// handlers' contexts when their run is cancelled.
type runWatch struct {
	mu   sync.Mutex
	jobs map[string]map[*runJob]struct{} // by run
}

// watch derives the handler's context of rj: cancelled when rj's run is.
// The returned func forgets rj.
func (w *runWatch) watch(ctx context.Context, rj *runJob) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	rj.mu.Lock()
	rj.cancel = cancel
	rj.mu.Unlock()
	w.mu.Lock()
	if w.jobs == nil {
		w.jobs = map[string]map[*runJob]struct{}{}
	}
	if w.jobs[rj.run] == nil {
		w.jobs[rj.run] = map[*runJob]struct{}{}
	}
	w.jobs[rj.run][rj] = struct{}{}
	w.mu.Unlock()
	return ctx, func() {
		w.mu.Lock()
		delete(w.jobs[rj.run], rj)
		if len(w.jobs[rj.run]) == 0 {
			delete(w.jobs, rj.run)
		}
		w.mu.Unlock()
		cancel()
	}
}

func (w *runWatch) runs() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.jobs))
	for id := range w.jobs {
		out = append(out, id)
	}
	return out
}

// cut cancels the handlers of run id's jobs running here.
func (w *runWatch) cut(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for rj := range w.jobs[id] {
		rj.mu.Lock()
		rj.cut = true
		if rj.cancel != nil {
			rj.cancel()
		}
		rj.mu.Unlock()
	}
}

func (rj *runJob) wasCut() bool {
	rj.mu.Lock()
	defer rj.mu.Unlock()
	return rj.cut
}

// runLoop checks, while jobs of runs run here, whether their runs were
// cancelled, and enqueues the completion steps left due by a process that
// died.
func (r *runner) runLoop(ctx context.Context) {
	check := time.NewTicker(runCheckEvery)
	defer check.Stop()
	lastDue := time.Time{}
	stale := map[string]runStale{}
	lastCheck := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
		}
		if ids := r.runWatch.runs(); len(ids) > 0 {
			cancelled, err := r.c.runs.Cancelled(ctx, ids)
			if err == nil {
				for i, id := range ids {
					if cancelled[i] {
						r.runWatch.cut(id)
					}
				}
			}
		}
		if time.Since(lastDue) >= runDueEvery {
			lastDue = time.Now()
			r.c.fireDue(ctx)
		}
		if time.Since(lastCheck) >= runReconcileEvery {
			lastCheck = time.Now()
			r.c.reconcileRuns(ctx, stale, lastCheck)
		}
	}
}
