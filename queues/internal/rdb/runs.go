package rdb

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Runs: a run's record and its jobs (lua/run_lib.lua says what each key
// holds). Every key of every run shares the hash tag {<ns>:runs} on a Redis
// Cluster, so that each script is one step on one node; runs are few next
// to jobs.

//go:embed lua/run_lib.lua
var runLib string

//go:embed lua/run_add.lua
var runAddLua string

//go:embed lua/run_drop.lua
var runDropLua string

//go:embed lua/run_seal.lua
var runSealLua string

//go:embed lua/run_start.lua
var runStartLua string

//go:embed lua/run_end.lua
var runEndLua string

//go:embed lua/run_cancel.lua
var runCancelLua string

//go:embed lua/run_fired.lua
var runFiredLua string

var (
	runAddScript    = redis.NewScript(runLib + runAddLua)
	runDropScript   = redis.NewScript(runLib + runDropLua)
	runSealScript   = redis.NewScript(runLib + runSealLua)
	runStartScript  = redis.NewScript(runLib + runStartLua)
	runEndScript    = redis.NewScript(runLib + runEndLua)
	runCancelScript = redis.NewScript(runLib + runCancelLua)
	runFiredScript  = redis.NewScript(runLib + runFiredLua)
)

// RunHeader carries, in a job's asynq headers, the ID of the run the job
// belongs to.
const RunHeader = "compartment-run"

// Run states of a job in a run's record.
const (
	RunQueued    = "queued"
	RunRunning   = "running"
	RunSucceeded = "succeeded"
	RunFailed    = "failed"
	RunRefused   = "refused"
	RunCancelled = "cancelled"
)

// RunStates lists every state, in the order people read them.
var RunStates = []string{RunQueued, RunRunning, RunSucceeded, RunFailed, RunRefused, RunCancelled}

// Run keys: one run's record and jobs, the index of runs and the set of
// runs whose completion step is due.
func (k Keyspace) runsPrefix() string {
	if k.cluster {
		return k.ns + ":{" + k.ns + ":runs}"
	}
	return k.ns + ":runs"
}

// RunKeys returns the keys a script on run id takes, in the order
// lua/run_lib.lua reads them.
func (k Keyspace) RunKeys(id string) []string {
	p := k.runsPrefix()
	return []string{p + ":run:" + id, p + ":run:" + id + ":jobs", p + ":index", p + ":due"}
}

// Runs reads and changes runs' records on one Redis.
type Runs struct {
	rc redis.UniversalClient
	ks Keyspace
	// Keep is how long a run's record lives after it ended.
	Keep time.Duration
}

// NewRuns returns the runs of ks's namespace on rc; records live keep
// after their run ended.
func NewRuns(rc redis.UniversalClient, ks Keyspace, keep time.Duration) *Runs {
	return &Runs{rc: rc, ks: ks, Keep: keep}
}

// ErrRunSealed: a job was added to a run that takes no more.
var ErrRunSealed = errors.New("the run is sealed: it takes no more jobs")

// RunJob is a job as a run's record holds it.
type RunJob struct {
	ID, Tier, Queue string
}

func (r *Runs) keepArg() string { return strconv.FormatInt(r.Keep.Milliseconds(), 10) }

// Add creates run id with labels (field, value pairs; only on the first
// call) and adds jobs to it, queued. Returns, per job, whether it was new
// (a job already in the run, or listed twice, is added once).
func (r *Runs) Add(ctx context.Context, id string, created time.Time, labels []string, jobs []RunJob) ([]bool, error) {
	args := make([]any, 0, 3+len(labels)+3*len(jobs))
	args = append(args, id, created.UnixMilli(), len(labels)/2)
	for _, l := range labels {
		args = append(args, l)
	}
	for _, j := range jobs {
		args = append(args, j.ID, j.Tier, j.Queue)
	}
	res, err := runAddScript.Run(ctx, r.rc, r.ks.RunKeys(id), args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("run %s: add jobs: %w", id, err)
	}
	if res[0] == "sealed" {
		return nil, fmt.Errorf("run %s: %w", id, ErrRunSealed)
	}
	added := make([]bool, len(jobs))
	for i := range added {
		added[i] = res[1+i].(int64) == 1
	}
	return added, nil
}

// Drop says what became of jobs added to run id that were not enqueued:
// refused at the door (refused true) or dropped from the run. Returns the
// steps now due ("" for none).
func (r *Runs) Drop(ctx context.Context, id string, ids []string, refused []bool) (string, error) {
	args := []any{id, r.keepArg()}
	for i, j := range ids {
		what := "drop"
		if refused[i] {
			what = RunRefused
		}
		args = append(args, j, what)
	}
	due, err := runDropScript.Run(ctx, r.rc, r.ks.RunKeys(id), args...).Text()
	if err != nil {
		return "", fmt.Errorf("run %s: record jobs not enqueued: %w", id, err)
	}
	return due, nil
}

// ErrRunNotFound: no record of the run (never created, or expired).
var ErrRunNotFound = errors.New("no such run")

// Seal closes run id to new jobs. Returns the steps now due.
func (r *Runs) Seal(ctx context.Context, id string) (string, error) {
	res, err := runSealScript.Run(ctx, r.rc, r.ks.RunKeys(id), id, r.keepArg()).Slice()
	if err != nil {
		return "", fmt.Errorf("run %s: seal: %w", id, err)
	}
	if res[0] == "missing" {
		return "", fmt.Errorf("run %s: %w", id, ErrRunNotFound)
	}
	return res[1].(string), nil
}

// Start records that job (of run id) is about to run in tier and queue;
// see lua/run_start.lua for the answers.
func (r *Runs) Start(ctx context.Context, id string, job RunJob) (string, error) {
	v, err := runStartScript.Run(ctx, r.rc, r.ks.RunKeys(id), id, r.keepArg(), job.ID, job.Tier, job.Queue).Text()
	if err != nil {
		return "", fmt.Errorf("run %s: start job %s: %w", id, job.ID, err)
	}
	return v, nil
}

// End records that job (of run id) came back in state (RunQueued,
// RunSucceeded, RunFailed, RunCancelled), with reason for a failure.
// Returns whether the record changed and the steps now due.
func (r *Runs) End(ctx context.Context, id string, job RunJob, state, reason string) (bool, string, error) {
	res, err := runEndScript.Run(ctx, r.rc, r.ks.RunKeys(id), id, r.keepArg(), job.ID, state, job.Tier, job.Queue, cutReason(reason)).Slice()
	if err != nil {
		return false, "", fmt.Errorf("run %s: end job %s: %w", id, job.ID, err)
	}
	return res[0].(int64) == 1, res[1].(string), nil
}

// cutReason keeps a failure's reason to one line of sane length: the
// record's fields are tab-separated.
func cutReason(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// CancelResult is what Cancel did.
type CancelResult struct {
	// Outcome: "cancelled", "already" (cancelled before), "ended" (the
	// run had ended: nothing changed).
	Outcome string
	// Ended is when the run ended, for "ended".
	Ended time.Time
	// Running is how many of its jobs were running: they end as
	// cancelled when their handlers return.
	Running int
	// Queued are the queued jobs cancelled, to take out of their queues.
	Queued []RunJob
}

// Cancel cancels run id; see lua/run_cancel.lua.
func (r *Runs) Cancel(ctx context.Context, id string) (CancelResult, error) {
	res, err := runCancelScript.Run(ctx, r.rc, r.ks.RunKeys(id), id, r.keepArg()).Slice()
	if err != nil {
		return CancelResult{}, fmt.Errorf("run %s: cancel: %w", id, err)
	}
	out := CancelResult{Outcome: res[0].(string)}
	switch out.Outcome {
	case "missing":
		return CancelResult{}, fmt.Errorf("run %s: %w", id, ErrRunNotFound)
	case "ended":
		ms, _ := strconv.ParseInt(res[1].(string), 10, 64)
		out.Ended = time.UnixMilli(ms)
	case "cancelled":
		out.Running = int(res[1].(int64))
		for i := 2; i+1 < len(res); i += 2 {
			out.Queued = append(out.Queued, RunJob{ID: res[i].(string), Queue: res[i+1].(string)})
		}
	}
	return out, nil
}

// Fired notes that run id's due steps were enqueued.
func (r *Runs) Fired(ctx context.Context, id string) error {
	if err := runFiredScript.Run(ctx, r.rc, r.ks.RunKeys(id), id).Err(); err != nil {
		return fmt.Errorf("run %s: note its steps enqueued: %w", id, err)
	}
	return nil
}

// Due returns the runs whose completion steps are due and not yet noted
// as enqueued.
func (r *Runs) Due(ctx context.Context) ([]string, error) {
	return r.rc.SMembers(ctx, r.ks.RunKeys("")[3]).Result()
}

// RunRecord is a run's record as stored: its fields (labels, counts,
// times) and its jobs.
type RunRecord struct {
	ID     string
	Fields map[string]string
	Jobs   map[string]string
}

// JobState splits a job's entry of Jobs into its state, tier, queue and
// reason.
func JobState(v string) (state, tier, queue, reason string) {
	parts := strings.SplitN(v, "\t", 4)
	for len(parts) < 4 {
		parts = append(parts, "")
	}
	return parts[0], parts[1], parts[2], parts[3]
}

// Read returns run id's record; ErrRunNotFound without one. withJobs
// reads its jobs too.
func (r *Runs) Read(ctx context.Context, id string, withJobs bool) (RunRecord, error) {
	keys := r.ks.RunKeys(id)
	var fields, jobs *redis.MapStringStringCmd
	_, err := r.rc.Pipelined(ctx, func(p redis.Pipeliner) error {
		fields = p.HGetAll(ctx, keys[0])
		if withJobs {
			jobs = p.HGetAll(ctx, keys[1])
		}
		return nil
	})
	if err != nil {
		return RunRecord{}, fmt.Errorf("run %s: read: %w", id, err)
	}
	if len(fields.Val()) == 0 {
		return RunRecord{}, fmt.Errorf("run %s: %w", id, ErrRunNotFound)
	}
	rec := RunRecord{ID: id, Fields: fields.Val()}
	if withJobs {
		rec.Jobs = jobs.Val()
	}
	return rec, nil
}

// List returns the records of the n most recent runs, newest first, and
// takes the ones whose records expired off the index.
func (r *Runs) List(ctx context.Context, n int) ([]RunRecord, error) {
	index := r.ks.RunKeys("")[2]
	ids, err := r.rc.ZRevRange(ctx, index, 0, int64(n)-1).Result()
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	cmds := make([]*redis.MapStringStringCmd, len(ids))
	_, err = r.rc.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HGetAll(ctx, r.ks.RunKeys(id)[0])
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	out := make([]RunRecord, 0, len(ids))
	var gone []any
	for i, c := range cmds {
		if len(c.Val()) == 0 {
			gone = append(gone, ids[i])
			continue
		}
		out = append(out, RunRecord{ID: ids[i], Fields: c.Val()})
	}
	if len(gone) > 0 {
		_ = r.rc.ZRem(ctx, index, gone...).Err()
	}
	return out, nil
}

// Cancelled says, for each run of ids, whether it was cancelled. One
// round trip (a pipeline; on a cluster every run's keys share one slot).
func (r *Runs) Cancelled(ctx context.Context, ids []string) ([]bool, error) {
	cmds := make([]*redis.BoolCmd, len(ids))
	_, err := r.rc.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HExists(ctx, r.ks.RunKeys(id)[0], "cancelled")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(ids))
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return out, nil
}
