package queues_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// runSeen records, from inside the handlers, what each job of a run did.
type runSeen struct {
	mu        sync.Mutex
	started   map[string]int // job ID -> starts
	succeeded map[string]bool
	failed    map[string]bool
	cut       map[string]bool // saw its context cancelled
	steps     []stepSeen
}

type stepSeen struct {
	JobID string
	Type  string
	Run   queues.RunSummary `json:"run"`
	Note  string            `json:"note"`
}

func newRunSeen() *runSeen {
	return &runSeen{started: map[string]int{}, succeeded: map[string]bool{}, failed: map[string]bool{}, cut: map[string]bool{}}
}

// handlers: "report" jobs fail for good when their payload says "fail",
// hold until their context ends when it says "hold", and take 5 ms
// otherwise; "notify" and "alarm" are completion steps.
func (s *runSeen) handlers() *queues.Handlers {
	h := queues.NewHandlers()
	h.HandleFunc("report", func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		s.mu.Lock()
		s.started[id]++
		s.mu.Unlock()
		switch string(t.Payload()) {
		case `"fail"`:
			s.mu.Lock()
			s.failed[id] = true
			s.mu.Unlock()
			return queues.Permanent(errors.New("the ledger does not balance"))
		case `"hold"`:
			<-ctx.Done()
			s.mu.Lock()
			s.cut[id] = true
			s.mu.Unlock()
			return ctx.Err()
		}
		time.Sleep(5 * time.Millisecond)
		s.mu.Lock()
		s.succeeded[id] = true
		s.mu.Unlock()
		return nil
	})
	step := func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		var p stepSeen
		if err := json.Unmarshal(t.Payload(), &p); err != nil {
			return err
		}
		p.JobID, p.Type = id, t.Type()
		s.mu.Lock()
		s.steps = append(s.steps, p)
		s.mu.Unlock()
		return nil
	}
	h.HandleFunc("notify", step)
	h.HandleFunc("alarm", step)
	return h
}

func (s *runSeen) count(m map[string]bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(m)
}

func runPools() []queues.PoolConfig {
	return []queues.PoolConfig{
		{Name: "batch", Size: 3, JobTypes: []string{"report"}, Tiers: []string{"regulatory", "close", "adhoc"}, MaxRetry: 2, PollInterval: 20 * time.Millisecond},
		{Name: "ops", Size: 2, JobTypes: []string{"notify", "alarm"}, PollInterval: 20 * time.Millisecond},
	}
}

func reportReqs(t *testing.T, n int, payload func(i int) string, tier func(i int) string) []queues.Request {
	reqs := make([]queues.Request, n)
	for i := range reqs {
		reqs[i] = queues.Request{JobType: "report", Payload: []byte(payload(i)), Options: queues.EnqueueOptions{ID: fmt.Sprintf("r%02d", i), Tier: tier(i)}}
	}
	return reqs
}

// A run's counts equal what the handlers saw, its completion steps run
// once each with the run's summary, and a failure's reason is kept.
func TestRunCountsAndCompletion(t *testing.T) {
	h := newHarness(t, runPools()...)
	seen := newRunSeen()
	ctx := context.Background()
	reqs := reportReqs(t, 12, func(i int) string {
		if i%5 == 4 {
			return `"fail"`
		}
		return `"ok"`
	}, func(i int) string { return []string{"regulatory", "close", "adhoc"}[i%3] })
	run, res, err := h.client.EnqueueRun(ctx, queues.RunOptions{
		ID: "oct-1", Kind: "month-end", Period: "2026-10", StartedBy: "test",
		OnComplete: &queues.RunStep{JobType: "notify", Payload: json.RawMessage(`{"note":"to finance"}`)},
		OnFailure:  &queues.RunStep{JobType: "alarm"},
	}, reqs)
	require.NoError(t, err)
	require.Len(t, res, 12)
	info, err := h.client.Run(ctx, run.ID())
	require.NoError(t, err)
	require.Equal(t, 12, info.Queued, "before any worker runs, every job is queued")
	require.Equal(t, queues.RunRunning, info.State)

	h.run(seen.handlers())
	testwait.For(t, 30*time.Second, "both steps ran", func() bool {
		seen.mu.Lock()
		defer seen.mu.Unlock()
		return len(seen.steps) >= 2
	})
	info, err = h.client.Run(ctx, run.ID())
	require.NoError(t, err)
	require.Equal(t, queues.RunFailed, info.State)
	require.Equal(t, seen.count(seen.succeeded), info.Succeeded)
	require.Equal(t, seen.count(seen.failed), info.Failed)
	require.Equal(t, 10, info.Succeeded)
	require.Equal(t, 2, info.Failed)
	require.Zero(t, info.Queued+info.Running+info.Refused+info.Cancelled)
	require.Len(t, info.Tiers, 3)
	require.Equal(t, "regulatory", info.Tiers[0].Tier, "tiers highest first")
	require.Equal(t, 4, info.Tiers[0].Total())
	require.Len(t, info.Failures, 2)
	require.Equal(t, "r04", info.Failures[0].JobID)
	require.Contains(t, info.Failures[0].Reason, "the ledger does not balance")
	require.Equal(t, "complete,failure", info.Fired)

	// Each step once, with the summary: once the ops queue is empty,
	// nothing more can come.
	testwait.For(t, 10*time.Second, "the ops queue drained", func() bool {
		qi, err := h.insp.GetQueueInfo(queues.QueueName(h.cfg.Namespace, "ops", ""))
		return err == nil && qi.Pending+qi.Active+qi.Scheduled+qi.Retry == 0
	})
	seen.mu.Lock()
	steps := append([]stepSeen(nil), seen.steps...)
	seen.mu.Unlock()
	require.Len(t, steps, 2)
	byType := map[string]stepSeen{}
	for _, s := range steps {
		byType[s.Type] = s
	}
	require.Equal(t, "to finance", byType["notify"].Note)
	require.Equal(t, "oct-1", byType["notify"].Run.ID)
	require.Equal(t, 10, byType["notify"].Run.Counts.Succeeded)
	require.Equal(t, 2, byType["alarm"].Run.Counts.Failed)
	require.Equal(t, "2026-10", byType["alarm"].Run.Period)
	require.Equal(t, "run:oct-1:on_complete", byType["notify"].JobID)
}

// Cancel: queued jobs leave their queues (kept as archived), running ones
// see their context cancelled and end as cancelled, none is retried, no
// job of the run starts after CancelRun returns, and a second run of the
// same jobs runs normally.
func TestRunCancel(t *testing.T) {
	h := newHarness(t, runPools()...)
	seen := newRunSeen()
	ctx := context.Background()
	reqs := reportReqs(t, 10, func(int) string { return `"hold"` }, func(int) string { return "close" })
	run, _, err := h.client.EnqueueRun(ctx, queues.RunOptions{ID: "oct-cancel", OnComplete: &queues.RunStep{JobType: "notify"}}, reqs)
	require.NoError(t, err)
	h.run(seen.handlers())
	// The run counts a job as running a moment before its handler is
	// called: wait for both, so that the count taken below holds every
	// job that started before CancelRun.
	testwait.For(t, 10*time.Second, "three jobs running (the pool's size), their handlers called", func() bool {
		info, err := h.client.Run(ctx, run.ID())
		if err != nil || info.Running != 3 {
			return false
		}
		seen.mu.Lock()
		defer seen.mu.Unlock()
		return len(seen.started) == 3
	})
	res, err := h.client.CancelRun(ctx, run.ID())
	require.NoError(t, err)
	require.Equal(t, "cancelled", res.Outcome)
	require.Equal(t, 3, res.Running)
	seen.mu.Lock()
	startedAtCancel := len(seen.started)
	seen.mu.Unlock()
	testwait.For(t, 10*time.Second, "the run ended", func() bool {
		info, err := h.client.Run(ctx, run.ID())
		return err == nil && info.Finished()
	})
	info, err := h.client.Run(ctx, run.ID())
	require.NoError(t, err)
	require.Equal(t, queues.RunCancelled, info.State)
	require.Equal(t, 10, info.Cancelled)
	require.Equal(t, 3, seen.count(seen.cut), "the running jobs saw their context cancelled")
	seen.mu.Lock()
	require.Equal(t, startedAtCancel, len(seen.started), "no job of the run started after CancelRun returned")
	for id, n := range seen.started {
		require.Equal(t, 1, n, "job %s ran once: not retried", id)
	}
	seen.mu.Unlock()
	// The running ones are archived by asynq a moment after their ends
	// were recorded (the record first, then asynq's write).
	testwait.For(t, 10*time.Second, "every job of the run kept, archived", func() bool {
		archived, err := h.insp.ListArchivedTasks(queues.QueueName(h.cfg.Namespace, "batch", "close"))
		return err == nil && len(archived) == 10
	})
	again, err := h.client.CancelRun(ctx, run.ID())
	require.NoError(t, err)
	require.Equal(t, "ended", again.Outcome)

	// The same jobs in a new run run normally.
	reqs = reportReqs(t, 10, func(int) string { return `"ok"` }, func(int) string { return "close" })
	run2, res2, err := h.client.EnqueueRun(ctx, queues.RunOptions{ID: "oct-again", OnComplete: &queues.RunStep{JobType: "notify"}}, reqs)
	require.NoError(t, err)
	for _, r := range res2 {
		require.Equal(t, queues.Replaced, r.Outcome)
	}
	info, err = h.client.WaitRun(ctx, run2.ID(), 20*time.Millisecond, nil)
	require.NoError(t, err)
	require.Equal(t, queues.RunSucceeded, info.State)
	require.Equal(t, 10, info.Succeeded)
	testwait.For(t, 10*time.Second, "the second run's step ran", func() bool {
		seen.mu.Lock()
		defer seen.mu.Unlock()
		return len(seen.steps) == 1
	})
	seen.mu.Lock()
	require.Equal(t, "oct-again", seen.steps[0].Run.ID, "the cancelled run's step never fired")
	seen.mu.Unlock()
}

// Jobs the door refuses stay in the run as refused; the run still ends
// and completes with the rest.
func TestRunRefusedAtTheDoor(t *testing.T) {
	pools := runPools()
	pools[0].MaxBacklog = 4
	h := newHarness(t, pools...)
	ctx := context.Background()
	run, err := h.client.StartRun(ctx, queues.RunOptions{ID: "with-refusals", OnComplete: &queues.RunStep{JobType: "notify"}})
	require.NoError(t, err)
	first := reportReqs(t, 4, func(int) string { return `"ok"` }, func(int) string { return "adhoc" })
	_, err = run.EnqueueMany(ctx, first)
	require.NoError(t, err)
	second := reportReqs(t, 7, func(int) string { return `"ok"` }, func(int) string { return "close" })[4:]
	_, err = run.EnqueueMany(ctx, second)
	require.ErrorIs(t, err, queues.ErrRefused)
	require.NoError(t, run.Seal(ctx))
	info, err := h.client.Run(ctx, run.ID())
	require.NoError(t, err)
	require.Equal(t, 4, info.Queued)
	require.Equal(t, 3, info.Refused)

	seen := newRunSeen()
	h.run(seen.handlers())
	info, err = h.client.WaitRun(ctx, run.ID(), 20*time.Millisecond, nil)
	require.NoError(t, err)
	require.Equal(t, queues.RunSucceeded, info.State)
	require.Equal(t, seen.count(seen.succeeded), info.Succeeded)
	require.Equal(t, 4, info.Succeeded)
	require.Equal(t, 3, info.Refused)
	require.Equal(t, "complete", info.Fired)
}

// Bad input: an unknown run, a step routed nowhere, a bad ID.
func TestRunBadInput(t *testing.T) {
	h := newHarness(t, runPools()...)
	ctx := context.Background()
	_, err := h.client.Run(ctx, "nope")
	require.ErrorIs(t, err, queues.ErrRunNotFound)
	_, err = h.client.CancelRun(ctx, "nope")
	require.ErrorIs(t, err, queues.ErrRunNotFound)
	_, err = h.client.StartRun(ctx, queues.RunOptions{ID: "bad id!", OnComplete: &queues.RunStep{JobType: "nowhere"}, OnFailure: &queues.RunStep{JobType: "notify", Payload: json.RawMessage(`[1]`)}})
	require.ErrorIs(t, err, queues.ErrInvalidRequest)
	require.ErrorContains(t, err, `run ID "bad id!"`)
	require.ErrorContains(t, err, `on_complete: `)
	require.ErrorContains(t, err, `"nowhere"`)
	require.ErrorContains(t, err, `on_failure: job type "notify": payload: want a JSON object`)
	runs, err := h.client.Runs(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, runs, "a refused start writes nothing")
}

// After a run with failures, refusals and a promote, the record's counts,
// per tier, equal what the handlers saw (a job counts in the tier it ran
// in: the promoted one in its new tier).
func TestRunCountsWithFailuresRefusalsAndPromote(t *testing.T) {
	pools := runPools()
	pools[0].MaxBacklog = 6
	pools[0].MaxRetry = queues.NoRetry
	h := newHarness(t, pools...)
	ctx := context.Background()
	run, err := h.client.StartRun(ctx, queues.RunOptions{ID: "mixed", OnComplete: &queues.RunStep{JobType: "notify"}})
	require.NoError(t, err)
	tiers := []string{"close", "adhoc"}
	first := reportReqs(t, 6, func(i int) string {
		if i%3 == 0 {
			return `"fail"`
		}
		return `"ok"`
	}, func(i int) string { return tiers[i%2] })
	_, err = run.EnqueueMany(ctx, first)
	require.NoError(t, err)
	refused := reportReqs(t, 9, func(int) string { return `"ok"` }, func(int) string { return "regulatory" })[6:]
	_, err = run.EnqueueMany(ctx, refused)
	require.ErrorIs(t, err, queues.ErrRefused)
	pr, err := h.client.Promote(ctx, "report", "r01", "regulatory") // an adhoc job that succeeds
	require.NoError(t, err)
	require.Equal(t, "adhoc", pr.From)
	require.NoError(t, run.Seal(ctx))

	type seenJob struct{ tier, outcome string }
	var mu sync.Mutex
	seen := map[string]seenJob{}
	hs := queues.NewHandlers()
	hs.HandleFunc("report", func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		queue, _ := asynq.GetQueueName(ctx)
		tier := queue[strings.LastIndex(queue, ":")+1:]
		outcome, err := "succeeded", error(nil)
		if string(t.Payload()) == `"fail"` {
			outcome, err = "failed", errors.New("no")
		}
		mu.Lock()
		seen[id] = seenJob{tier, outcome}
		mu.Unlock()
		return err
	})
	hs.HandleFunc("notify", func(context.Context, *asynq.Task) error { return nil })
	hs.HandleFunc("alarm", func(context.Context, *asynq.Task) error { return nil })
	h.run(hs)
	info, err := h.client.WaitRun(ctx, run.ID(), 20*time.Millisecond, nil)
	require.NoError(t, err)

	want := map[string]*queues.RunCounts{"regulatory": {Refused: 3}}
	mu.Lock()
	for _, j := range seen {
		if want[j.tier] == nil {
			want[j.tier] = &queues.RunCounts{}
		}
		if j.outcome == "succeeded" {
			want[j.tier].Succeeded++
		} else {
			want[j.tier].Failed++
		}
	}
	require.Len(t, seen, 6, "each admitted job ran once")
	require.Equal(t, "regulatory", seen["r01"].tier, "the promoted job ran in its new tier")
	mu.Unlock()
	got := map[string]*queues.RunCounts{}
	for _, tr := range info.Tiers {
		got[tr.Tier] = &tr.RunCounts
	}
	require.Equal(t, want, got)
	require.Equal(t, queues.RunCounts{Succeeded: 4, Failed: 2, Refused: 3}, info.RunCounts)
	require.Equal(t, queues.RunFailed, info.State)
	require.Equal(t, "regulatory", info.Tiers[0].Tier)
}

// A job listed twice, or added again to the run that holds it, stays in the
// run once: the repeat's Duplicate does not take it out.
func TestRunRepeatedJobsStay(t *testing.T) {
	h := newHarness(t, runPools()...)
	ctx := context.Background()
	run, err := h.client.StartRun(ctx, queues.RunOptions{ID: "repeats"})
	require.NoError(t, err)
	reqs := reportReqs(t, 2, func(int) string { return `"ok"` }, func(int) string { return "close" })
	res, err := run.EnqueueMany(ctx, append(reqs, reqs[0]))
	require.NoError(t, err)
	require.Equal(t, queues.Duplicate, res[2].Outcome)
	res, err = run.EnqueueMany(ctx, reqs[1:])
	require.NoError(t, err)
	require.Equal(t, queues.Duplicate, res[0].Outcome)
	require.NoError(t, run.Seal(ctx))
	info, err := h.client.Run(ctx, run.ID())
	require.NoError(t, err)
	require.Equal(t, 2, info.Queued)
	seen := newRunSeen()
	h.run(seen.handlers())
	info, err = h.client.WaitRun(ctx, run.ID(), 20*time.Millisecond, nil)
	require.NoError(t, err)
	require.Equal(t, 2, info.Succeeded)
	require.Equal(t, 2, seen.count(seen.succeeded))
}

// Cancel touches only the run's own jobs: a job another run holds under an
// ID this run's record lists (as it does while the run is enqueuing) is
// left alone, and a promoted job of the run is found in its new tier.
func TestRunCancelTouchesOnlyItsOwnJobs(t *testing.T) {
	h := newHarness(t, runPools()...)
	ctx := context.Background()
	reqs := reportReqs(t, 3, func(int) string { return `"ok"` }, func(int) string { return "adhoc" })
	_, _, err := h.client.EnqueueRun(ctx, queues.RunOptions{ID: "first"}, reqs[:1])
	require.NoError(t, err)
	second, err := h.client.StartRun(ctx, queues.RunOptions{ID: "second"})
	require.NoError(t, err)
	_, err = second.EnqueueMany(ctx, reqs[1:])
	require.NoError(t, err)
	_, err = h.client.Promote(ctx, "report", "r02", "regulatory")
	require.NoError(t, err)
	// What the second run's record holds while its enqueue of r00 is under
	// way: r00, which the first run's job holds.
	ks := rdb.KeyspaceFor(h.cfg.Namespace, h.redis.Client)
	_, err = rdb.NewRuns(h.redis.Client, ks, time.Hour).Add(ctx, "second", time.Time{}, nil,
		[]rdb.RunJob{{ID: "r00", Tier: "adhoc", Queue: queues.QueueName(h.cfg.Namespace, "batch", "adhoc")}})
	require.NoError(t, err)

	res, err := h.client.CancelRun(ctx, "second")
	require.NoError(t, err)
	require.Equal(t, 2, res.Removed, "r01, and r02 in its new tier; not r00")
	info, err := h.insp.GetTaskInfo(queues.QueueName(h.cfg.Namespace, "batch", "adhoc"), "r00")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State, "the first run's job is untouched")
	info, err = h.insp.GetTaskInfo(queues.QueueName(h.cfg.Namespace, "batch", "regulatory"), "r02")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateArchived, info.State)
}

// A job asynq archived without its handler's verdict (its worker crashed
// more often than its retries allow) still ends its run: once the run's
// counts stand still, a worker's keeper records what asynq says.
func TestRunEndsWhenAsynqArchivedAJobBehindItsBack(t *testing.T) {
	defer queues.SetRunStaleAfter(200 * time.Millisecond)()
	h := newHarness(t, runPools()...)
	ctx := context.Background()
	reqs := reportReqs(t, 2, func(int) string { return `"ok"` }, func(int) string { return "close" })
	run, _, err := h.client.EnqueueRun(ctx, queues.RunOptions{ID: "behind", OnComplete: &queues.RunStep{JobType: "notify"}}, reqs)
	require.NoError(t, err)
	// What asynq's recoverer does to a job whose retries crashes used up:
	// it archives it; no handler ever says so.
	queue := queues.QueueName(h.cfg.Namespace, "batch", "close")
	require.NoError(t, h.insp.ArchiveTask(queue, "r00"))
	seen := newRunSeen()
	h.run(seen.handlers())
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := h.client.WaitRun(ctx2, run.ID(), 50*time.Millisecond, nil)
	require.NoError(t, err, "the run ended")
	require.Equal(t, queues.RunFailed, info.State)
	require.Equal(t, 1, info.Succeeded)
	require.Equal(t, 1, info.Failed)
	require.Len(t, info.Failures, 1)
	require.Equal(t, "r00", info.Failures[0].JobID)
	require.Contains(t, info.Failures[0].Reason, "archived by asynq without its handler's verdict")
	require.Equal(t, "complete,failure", info.Fired)
}
