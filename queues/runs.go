package queues

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// A run is one piece of business work made of many jobs (a month-end): one
// record in Redis with its labels and the count of its jobs per tier and
// state, kept exact by the steps that start and end each job, and a
// completion step (a job) enqueued exactly once when every job of it has
// ended. See docs/RUNS.md.

// RunKeep is how long a run's record is kept after the run ended, and how
// long its completion step's job is kept once done (its ID stays taken, so
// that the step is never enqueued twice).
const RunKeep = 7 * 24 * time.Hour

// ErrRunNotFound: no record of the run (a wrong ID, or one that ended more
// than RunKeep ago).
var ErrRunNotFound = rdb.ErrRunNotFound

// ErrRunCancelled is the error a job of a cancelled run ends with: asynq
// archives it (not retried), and its run counts it as cancelled.
var ErrRunCancelled = errors.New("cancelled with its run")

// RunStep is a job a run enqueues when it ends: its job type, its payload
// (a JSON object, or empty; the run's summary is added to it as the field
// "run": RunSummary) and, for a pool with tiers, its tier.
type RunStep struct {
	JobType string          `json:"job_type"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Tier    string          `json:"tier,omitempty"`
}

// RunOptions describe a run when it starts.
type RunOptions struct {
	// ID names the run. Defaults to a random one. At most 64 characters
	// of letters, digits and "-_.:".
	ID string
	// Kind ("month-end"), Period ("2026-10"), Plan (a plan file's name)
	// and StartedBy (a person, a schedule) are labels people read.
	Kind, Period, Plan, StartedBy string
	// OnComplete is enqueued once every job of the run has succeeded or
	// failed for good; OnFailure too, when one of them failed for good.
	// Neither fires for a cancelled run, nor for a run none of whose jobs
	// was enqueued.
	OnComplete, OnFailure *RunStep
}

// Run is a run this client started: EnqueueMany adds jobs to it, Seal says
// no more will come (it can then end).
type Run struct {
	c  *Client
	id string
}

// ID returns the run's ID.
func (r *Run) ID() string { return r.id }

// maxRunID bounds a run's ID.
const maxRunID = 64

func runIDProblem(id string) string {
	if id == "" || len(id) > maxRunID {
		return fmt.Sprintf("run ID %q: want 1 to %d characters", cutQuote(id), maxRunID)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:", r)) {
			return fmt.Sprintf("run ID %q: only letters, digits and -_.: are allowed", cutQuote(id))
		}
	}
	return ""
}

func cutQuote(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// CheckRunStep says what is wrong with a run step for this client's pools:
// its job type routed to no pool, a tier its pool does not serve, a
// payload that is not a JSON object. nil when it is fine.
func (c *Client) CheckRunStep(s RunStep) error {
	if _, _, err := c.stepQueue(s); err != nil {
		return err
	}
	if len(s.Payload) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(s.Payload, &obj); err != nil || obj == nil {
			return fmt.Errorf("job type %q: payload: want a JSON object (the run's summary is added to it as \"run\")", s.JobType)
		}
		if _, ok := obj["run"]; ok {
			return fmt.Errorf("job type %q: payload: the field \"run\" is the run's summary; choose another name", s.JobType)
		}
	}
	return nil
}

// StartRun creates a run's record. Its jobs are added by the run's
// EnqueueMany; Seal ends the adding. A bad option is ErrInvalidRequest,
// every problem named, and nothing is written.
func (c *Client) StartRun(ctx context.Context, o RunOptions) (*Run, error) {
	if o.ID == "" {
		o.ID = uuid.NewString()
	}
	var bad []string
	if msg := runIDProblem(o.ID); msg != "" {
		bad = append(bad, msg)
	}
	for _, s := range []struct {
		name string
		step *RunStep
	}{{"on_complete", o.OnComplete}, {"on_failure", o.OnFailure}} {
		if s.step == nil {
			continue
		}
		if err := c.CheckRunStep(*s.step); err != nil {
			bad = append(bad, s.name+": "+err.Error())
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w: %s; nothing was enqueued", ErrInvalidRequest, strings.Join(bad, "; "))
	}
	// Each step's queue is fixed now: asynq refuses a second job of the
	// same ID only within one queue, so a step enqueued again (after a
	// crash) must go where the first went, whatever the config says then.
	rs := runSteps{OnComplete: o.OnComplete, OnFailure: o.OnFailure, Queues: map[string]string{}}
	for name, st := range map[string]*RunStep{"complete": o.OnComplete, "failure": o.OnFailure} {
		if st != nil {
			_, q, _ := c.stepQueue(*st) // checked above
			rs.Queues[name] = q
		}
	}
	steps, err := json.Marshal(rs)
	if err != nil {
		return nil, err
	}
	labels := []string{"kind", o.Kind, "period", o.Period, "plan", o.Plan, "by", o.StartedBy, "steps", string(steps)}
	if _, err := c.runs.Add(ctx, o.ID, time.Now(), labels, nil); err != nil {
		return nil, err
	}
	return &Run{c: c, id: o.ID}, nil
}

type runSteps struct {
	OnComplete *RunStep `json:"on_complete,omitempty"`
	OnFailure  *RunStep `json:"on_failure,omitempty"`
	// Queues: each step's queue, by "complete" and "failure".
	Queues map[string]string `json:"queues,omitempty"`
}

// stepQueue routes a step to its pool and queue.
func (c *Client) stepQueue(s RunStep) (*Pool, string, error) {
	p, err := c.pools().route(s.JobType)
	if err != nil {
		return nil, "", err
	}
	tier := s.Tier
	if tier == "" && p.tiers != nil {
		tier = c.pools().tiers.Default()
	}
	q, err := p.QueueFor(tier)
	if err != nil {
		return nil, "", err
	}
	return p, q, nil
}

// EnqueueMany enqueues jobs as the client's EnqueueMany does, each as a job
// of the run: a job without an ID gets a random one. The run's record holds
// each job before it is enqueued; a job another job's ID already holds
// (Duplicate) or that was not enqueued leaves the run, one the door refused
// stays in it as refused.
func (r *Run) EnqueueMany(ctx context.Context, reqs []Request) ([]EnqueueResult, error) {
	c := r.c
	b, err := c.route(reqs)
	if err != nil {
		return nil, err
	}
	own := make([]Request, len(reqs))
	jobs := make([]rdb.RunJob, len(reqs))
	for i, req := range reqs {
		if req.Options.ID == "" {
			req.Options.ID = uuid.NewString()
		}
		req.Options.run = r.id
		own[i] = req
		jobs[i] = rdb.RunJob{ID: req.Options.ID, Tier: b.results[i].Tier, Queue: b.results[i].Queue}
	}
	added, err := c.runs.Add(ctx, r.id, time.Time{}, nil, jobs)
	if err != nil {
		return nil, err
	}
	res, err := c.EnqueueMany(ctx, own)
	refused := errors.Is(err, ErrRefused) // the door refused the batch whole
	// Only a job this call added leaves the run (or is refused): one the
	// run held already, or that an earlier request of the call holds, is
	// another request's.
	var ids []string
	var how []bool
	for i := range own {
		if !added[i] {
			continue
		}
		if res != nil && res[i].Outcome != Duplicate && res[i].Outcome != NotEnqueued {
			continue
		}
		door := b.pools[i].cfg.HasDoor()
		if res != nil && res[i].Outcome == NotEnqueued && !(refused && door) {
			// Redis may have written it though its reply was lost: a job
			// that is there stays in its run.
			if there, xerr := c.Exists(context.WithoutCancel(ctx), own[i].JobType, []string{jobs[i].ID}); xerr != nil || there[0] {
				continue
			}
		}
		ids = append(ids, jobs[i].ID)
		how = append(how, refused && door && res != nil && res[i].Outcome == NotEnqueued)
	}
	if len(ids) > 0 {
		due, derr := c.runs.Drop(context.WithoutCancel(ctx), r.id, ids, how)
		if derr != nil && err == nil {
			err = derr
		}
		c.fireIfDue(ctx, r.id, due)
	}
	return res, err
}

// Seal says that no more jobs join the run: once every job of it has
// ended, it ends, and its completion step is enqueued.
func (r *Run) Seal(ctx context.Context) error {
	due, err := r.c.runs.Seal(ctx, r.id)
	if err != nil {
		return err
	}
	r.c.fireIfDue(ctx, r.id, due)
	return nil
}

// EnqueueRun starts a run, enqueues reqs as its jobs and seals it: the
// usual way to start a month-end. The run is sealed even when the enqueue
// fails part way: the jobs enqueued before the error are the run. The Run
// is nil only when the run could not be created.
func (c *Client) EnqueueRun(ctx context.Context, o RunOptions, reqs []Request) (*Run, []EnqueueResult, error) {
	if _, err := c.route(reqs); err != nil {
		return nil, nil, err
	}
	run, err := c.StartRun(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	res, err := run.EnqueueMany(ctx, reqs)
	if serr := run.Seal(context.WithoutCancel(ctx)); serr != nil && err == nil {
		err = serr
	}
	return run, res, err
}

// RunCounts counts a run's jobs by state.
type RunCounts struct {
	Queued    int `json:"queued"`
	Running   int `json:"running"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Refused   int `json:"refused"`
	Cancelled int `json:"cancelled"`
}

// Total is every job of the run.
func (n RunCounts) Total() int {
	return n.Queued + n.Running + n.Succeeded + n.Failed + n.Refused + n.Cancelled
}

// Ended counts the jobs that will not change any more.
func (n RunCounts) Ended() int { return n.Total() - n.Queued - n.Running }

func (n *RunCounts) set(state string, v int) {
	switch state {
	case rdb.RunQueued:
		n.Queued = v
	case rdb.RunRunning:
		n.Running = v
	case rdb.RunSucceeded:
		n.Succeeded = v
	case rdb.RunFailed:
		n.Failed = v
	case rdb.RunRefused:
		n.Refused = v
	case rdb.RunCancelled:
		n.Cancelled = v
	}
}

// RunTier is a run's counts in one tier ("" for jobs of pools without
// tiers).
type RunTier struct {
	Tier string `json:"tier"`
	RunCounts
}

// RunFailure is a job of a run that failed for good, and why.
type RunFailure struct {
	JobID  string `json:"job_id"`
	Tier   string `json:"tier,omitempty"`
	Reason string `json:"reason"`
}

// Run states, as RunInfo.State says them.
const (
	RunOpen       = "open"       // started, jobs may still be added
	RunRunning    = "running"    // sealed, some job queued or running
	RunCancelling = "cancelling" // cancelled, some job still running
	RunSucceeded  = "succeeded"  // ended, every job that ran succeeded
	RunFailed     = "failed"     // ended, some job failed for good
	RunCancelled  = "cancelled"  // ended after a cancel
	RunRefused    = "refused"    // ended, no job of it was enqueued
)

// RunInfo is a run as its record says.
type RunInfo struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind,omitempty"`
	Period    string    `json:"period,omitempty"`
	Plan      string    `json:"plan,omitempty"`
	StartedBy string    `json:"started_by,omitempty"`
	State     string    `json:"state"`
	CreatedAt time.Time `json:"created_at"`
	// EndedAt and CancelledAt are zero until then.
	EndedAt     time.Time `json:"ended_at,omitzero"`
	CancelledAt time.Time `json:"cancelled_at,omitzero"`
	RunCounts
	// Tiers are the counts per tier, highest tier first.
	Tiers []RunTier `json:"tiers"`
	// OnComplete and OnFailure are the run's completion steps; Fired says
	// which were enqueued ("complete", "complete,failure"), Due which are
	// due and not yet enqueued (a moment, or until a worker runs).
	OnComplete *RunStep `json:"on_complete,omitempty"`
	OnFailure  *RunStep `json:"on_failure,omitempty"`
	Fired      string   `json:"fired,omitempty"`
	Due        string   `json:"due,omitempty"`
	// Failures are the jobs that failed for good (only from Client.Run).
	Failures []RunFailure `json:"failures,omitempty"`
}

// Finished says whether the run has ended.
func (i RunInfo) Finished() bool { return !i.EndedAt.IsZero() }

// ETA estimates the time left from the pace so far (nil: unknown, or
// ended).
func (i RunInfo) ETA(now time.Time) (time.Duration, bool) {
	done := i.Succeeded + i.Failed
	left := i.Queued + i.Running
	if i.Finished() || done == 0 || left == 0 {
		return 0, false
	}
	took := now.Sub(i.CreatedAt)
	return time.Duration(float64(took) / float64(done) * float64(left)).Round(time.Second), true
}

func (c *Client) runInfo(rec rdb.RunRecord) RunInfo {
	f := rec.Fields
	i := RunInfo{ID: rec.ID, Kind: f["kind"], Period: f["period"], Plan: f["plan"], StartedBy: f["by"], Fired: f["fired"], Due: f["due"]}
	ms := func(k string) time.Time {
		v, err := strconv.ParseInt(f[k], 10, 64)
		if err != nil {
			return time.Time{}
		}
		return time.UnixMilli(v)
	}
	i.CreatedAt, i.EndedAt, i.CancelledAt = ms("created"), ms("ended"), ms("cancelled")
	var steps runSteps
	_ = json.Unmarshal([]byte(f["steps"]), &steps)
	i.OnComplete, i.OnFailure = steps.OnComplete, steps.OnFailure
	tiers := map[string]*RunCounts{}
	for k, v := range f {
		n, _ := strconv.Atoi(v)
		if state, ok := strings.CutPrefix(k, "t|"); ok {
			i.RunCounts.set(state, n)
			continue
		}
		rest, ok := strings.CutPrefix(k, "n|")
		if !ok {
			continue
		}
		tier, state, ok := strings.Cut(rest, "|")
		if !ok {
			continue
		}
		if tiers[tier] == nil {
			tiers[tier] = &RunCounts{}
		}
		tiers[tier].set(state, n)
	}
	for t, n := range tiers {
		if n.Total() > 0 {
			i.Tiers = append(i.Tiers, RunTier{Tier: t, RunCounts: *n})
		}
	}
	rank := func(t string) int {
		if pol := c.pools().tiers; pol != nil {
			if k := slices.Index(pol.Tiers(), t); k >= 0 {
				return k
			}
		}
		return 1 << 20
	}
	slices.SortFunc(i.Tiers, func(a, b RunTier) int {
		if ra, rb := rank(a.Tier), rank(b.Tier); ra != rb {
			return ra - rb
		}
		return strings.Compare(a.Tier, b.Tier)
	})
	switch {
	case f["sealed"] != "1":
		i.State = RunOpen
	case i.Finished() && !i.CancelledAt.IsZero():
		i.State = RunCancelled
	case i.Finished() && i.Failed > 0:
		i.State = RunFailed
	case i.Finished() && i.Succeeded == 0:
		i.State = RunRefused
	case i.Finished():
		i.State = RunSucceeded
	case !i.CancelledAt.IsZero():
		i.State = RunCancelling
	default:
		i.State = RunRunning
	}
	for id, v := range rec.Jobs {
		state, tier, _, reason := rdb.JobState(v)
		if state == rdb.RunFailed {
			i.Failures = append(i.Failures, RunFailure{JobID: id, Tier: tier, Reason: reason})
		}
	}
	slices.SortFunc(i.Failures, func(a, b RunFailure) int { return strings.Compare(a.JobID, b.JobID) })
	return i
}

// Run reads a run's record, with its failures; ErrRunNotFound without one.
func (c *Client) Run(ctx context.Context, id string) (RunInfo, error) {
	if msg := runIDProblem(id); msg != "" {
		return RunInfo{}, fmt.Errorf("run %q: %w", cutQuote(id), ErrRunNotFound)
	}
	rec, err := c.runs.Read(ctx, id, true)
	if err != nil {
		return RunInfo{}, err
	}
	return c.runInfo(rec), nil
}

// Runs returns the n most recent runs, newest first (without their
// failures: Run has them).
func (c *Client) Runs(ctx context.Context, n int) ([]RunInfo, error) {
	recs, err := c.runs.List(ctx, n)
	if err != nil {
		return nil, err
	}
	out := make([]RunInfo, len(recs))
	for k, rec := range recs {
		out[k] = c.runInfo(rec)
	}
	return out, nil
}

// WaitRun polls run id every poll until it has ended (and its completion
// steps were enqueued), calling each (if not nil) with every reading. It
// returns the last reading, or ctx's error.
func (c *Client) WaitRun(ctx context.Context, id string, poll time.Duration, each func(RunInfo)) (RunInfo, error) {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		info, err := c.Run(ctx, id)
		if err != nil {
			return info, err
		}
		if each != nil {
			each(info)
		}
		if info.Finished() && info.Due == "" {
			return info, nil
		}
		select {
		case <-ctx.Done():
			return info, ctx.Err()
		case <-t.C:
		}
	}
}

// RunCancel is what CancelRun did.
type RunCancel struct {
	// Outcome: "cancelled", "already" (it was cancelled before), or
	// "ended" (it had ended; nothing changed).
	Outcome string
	// Ended is when the run ended, for "ended".
	Ended time.Time
	// Removed counts the queued jobs taken out of their queues (kept as
	// archived, with the error ErrRunCancelled's text); Running the jobs
	// that were running, whose handlers' contexts are cancelled.
	Removed, Running int
}

// CancelRun cancels run id: its queued jobs (pending, scheduled, waiting
// for a retry) are taken out of their queues and kept as archived, and no
// job of it starts once this returns; its running jobs' handlers see their
// context cancelled within a second and end as cancelled, not retried. Its
// completion steps do not fire. Nothing outside the run is touched.
// ErrRunNotFound for an unknown run.
func (c *Client) CancelRun(ctx context.Context, id string) (RunCancel, error) {
	if msg := runIDProblem(id); msg != "" {
		return RunCancel{}, fmt.Errorf("run %q: %w", cutQuote(id), ErrRunNotFound)
	}
	res, err := c.runs.Cancel(ctx, id)
	if err != nil {
		return RunCancel{}, err
	}
	out := RunCancel{Outcome: res.Outcome, Ended: res.Ended, Running: res.Running}
	for _, j := range res.Queued {
		archived, err := c.archiveRunJob(ctx, id, j)
		if err != nil {
			return out, fmt.Errorf("run %s: take job %s out of its queue: %w", id, j.ID, err)
		}
		if archived {
			out.Removed++
		}
	}
	return out, nil
}

// archiveRunJob takes job j of run id out of its queue, keeping it as
// archived, when it is still waiting there (pending, scheduled, retry):
// in whichever tier of its pool it is now (a promote moves it), and only
// if it is this run's (its header names the run: another run's job may
// hold the ID). A job dequeued since is refused at its start instead.
func (c *Client) archiveRunJob(ctx context.Context, id string, j rdb.RunJob) (bool, error) {
	pool := c.poolOfQueue(j.Queue)
	if pool == nil {
		return false, nil // its pool is gone from the config
	}
	found, err := c.jobs.FindJob(ctx, pool.queues, j.ID)
	if err != nil {
		return false, err
	}
	if found.Queue == "" || rdb.TaskHeader(found.Msg, rdb.RunHeader) != id {
		return false, nil
	}
	switch found.State {
	case "pending", "scheduled", "retry":
	default:
		return false, nil
	}
	switch err := c.insp.ArchiveTask(found.Queue, j.ID); {
	case err == nil:
		return true, nil
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound), strings.Contains(err.Error(), "already"), strings.Contains(err.Error(), "active"):
		return false, nil // dequeued or moved meanwhile
	default:
		return false, err
	}
}

// RunSummary is what a completion step's payload carries as "run".
type RunSummary struct {
	ID        string       `json:"id"`
	Kind      string       `json:"kind,omitempty"`
	Period    string       `json:"period,omitempty"`
	Plan      string       `json:"plan,omitempty"`
	StartedBy string       `json:"started_by,omitempty"`
	State     string       `json:"state"`
	CreatedAt time.Time    `json:"created_at"`
	EndedAt   time.Time    `json:"ended_at"`
	Counts    RunCounts    `json:"counts"`
	Tiers     []RunTier    `json:"tiers"`
	Failures  []RunFailure `json:"failures,omitempty"`
}

// runStepJobID is the ID of a run's completion step's job: fixed, so that
// asynq refuses a second one (it is kept RunKeep once done).
func runStepJobID(run, step string) string { return "run:" + run + ":on_" + step }

// fireIfDue enqueues the steps due of run id, now: the caller just saw
// them become due. If this fails or the process dies first, a worker's
// keeper enqueues them (Client.fireDue).
func (c *Client) fireIfDue(ctx context.Context, id, due string) {
	if due == "" {
		return
	}
	if err := c.fireRun(context.WithoutCancel(ctx), id); err != nil {
		c.cfg.Logger.Warn("run: completion step not enqueued yet; a worker will retry", "run", id, "error", err)
	}
}

// fireRun enqueues the steps due of run id, each once: its job's ID is
// fixed, so a second attempt (after a crash between the enqueue and the
// note that it was done) finds it there. Then it notes them enqueued.
func (c *Client) fireRun(ctx context.Context, id string) error {
	rec, err := c.runs.Read(ctx, id, true)
	if errors.Is(err, ErrRunNotFound) {
		return c.runs.Fired(ctx, id)
	}
	if err != nil {
		return err
	}
	due := rec.Fields["due"]
	if due == "" {
		return c.runs.Fired(ctx, id)
	}
	info := c.runInfo(rec)
	var steps runSteps
	_ = json.Unmarshal([]byte(rec.Fields["steps"]), &steps)
	sum := RunSummary{ID: info.ID, Kind: info.Kind, Period: info.Period, Plan: info.Plan, StartedBy: info.StartedBy, State: info.State,
		CreatedAt: info.CreatedAt, EndedAt: info.EndedAt, Counts: info.RunCounts, Tiers: info.Tiers, Failures: info.Failures}
	for _, name := range strings.Split(due, ",") {
		step := info.OnComplete
		if name == "failure" {
			step = info.OnFailure
		}
		if step == nil {
			continue
		}
		if err := c.enqueueStep(ctx, id, name, *step, steps.Queues[name], sum); err != nil {
			return err
		}
	}
	return c.runs.Fired(ctx, id)
}

// enqueueStep enqueues one completion step, past the door: a step refused
// would be lost.
func (c *Client) enqueueStep(ctx context.Context, run, name string, s RunStep, queue string, sum RunSummary) error {
	obj := map[string]json.RawMessage{}
	if len(s.Payload) > 0 {
		if err := json.Unmarshal(s.Payload, &obj); err != nil {
			return fmt.Errorf("run %s: on_%s payload: %w", run, name, err)
		}
	}
	raw, err := json.Marshal(sum)
	if err != nil {
		return err
	}
	obj["run"] = raw
	payload, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	p, q, err := c.stepQueue(s)
	if err != nil {
		return fmt.Errorf("run %s: on_%s: %w", run, name, err)
	}
	if queue != "" {
		q = queue // where it was fixed when the run started
	}
	o := EnqueueOptions{ID: runStepJobID(run, name), Retention: RunKeep}
	task := asynq.NewTaskWithHeaders(s.JobType, payload, jobHeaders(time.Now(), o, nil))
	_, err = c.aq.EnqueueContext(ctx, task, c.options(p, q, o)...)
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("run %s: enqueue on_%s (%s): %w", run, name, s.JobType, err)
	}
	return nil
}

// fireDue enqueues the steps of every run whose steps are due: those a
// process saw become due and died (or failed) before enqueuing.
func (c *Client) fireDue(ctx context.Context) {
	ids, err := c.runs.Due(ctx)
	if err != nil {
		return
	}
	for _, id := range ids {
		if err := c.fireRun(ctx, id); err != nil {
			c.cfg.Logger.Warn("run: completion step not enqueued yet; retrying", "run", id, "error", err)
		}
	}
}
