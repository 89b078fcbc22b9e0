package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/queues"
)

// startedBy names who runs this command, for the runs it starts.
func startedBy(e env) string {
	user := e.getenv("USER")
	if user == "" {
		user = "someone"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		return user
	}
	return user + "@" + host
}

const runsHelp = `usage: enqueue runs [-json] [-n N]

Lists the most recent runs (month-ends), newest first, with their progress.`

func cmdRuns(ctx context.Context, e env, configPath string, args []string) error {
	var asJSON bool
	var n int
	_, err := subFlags(e, "runs", runsHelp, args, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print JSON")
		fs.IntVar(&n, "n", 20, "how many runs, at most")
	})
	if err != nil {
		return err
	}
	if n < 1 || n > 1000 {
		return cli.Usagef("-n must be between 1 and 1000")
	}
	enq, done, err := setupForReading(ctx, e, "runs", configPath)
	if err != nil {
		return err
	}
	defer done()
	runs, err := enq.Client.Runs(ctx, n)
	if err != nil {
		return err
	}
	if asJSON {
		if runs == nil {
			runs = []queues.RunInfo{}
		}
		return writeJSON(e.stdout, runs)
	}
	if len(runs) == 0 {
		fmt.Fprintln(e.stdout, "no runs yet (enqueue month-end starts one)")
		return nil
	}
	now := time.Now()
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tKIND\tPERIOD\tSTATE\tENDED/TOTAL\tFAILED\tSTARTED\tBY\tETA")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\t%s\n", r.ID, dash(r.Kind), dash(r.Period), r.State, r.Ended(), r.Total(), r.Failed,
			r.CreatedAt.Local().Format("2006-01-02 15:04:05"), dash(r.StartedBy), etaText(r, now))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func etaText(r queues.RunInfo, now time.Time) string {
	if r.Finished() {
		return "done"
	}
	if d, ok := r.ETA(now); ok {
		return d.String()
	}
	return "-"
}

const runHelp = `usage: enqueue run show ID [-json]
       enqueue run wait ID [-poll D]
       enqueue run cancel ID

show    one run: its counts per tier and state, and each failed job's reason
wait    show progress until the run has ended; exit 1 if a job failed for
        good or the run was cancelled
cancel  cancel the run: its queued jobs are taken out of their queues (kept,
        archived), its running jobs' handlers are cancelled; none is retried
        and its completion step does not fire. A run that has ended is left
        as it is (exit 0).

Exit code 2 for an unknown run.`

func cmdRun(ctx context.Context, e env, configPath string, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		if len(args) == 0 {
			return cli.Usagef("run needs show, wait or cancel and a run ID\n%s", runHelp)
		}
		fmt.Fprintln(e.stdout, runHelp)
		return flag.ErrHelp
	}
	verb := args[0]
	if verb != "show" && verb != "wait" && verb != "cancel" {
		return cli.Usagef("run: unknown action %s (show, wait or cancel)", cli.Quote(verb))
	}
	if len(args) < 2 || strings.HasPrefix(args[1], "-") {
		return cli.Usagef("run %s needs a run ID (enqueue runs lists them)", verb)
	}
	id := args[1]
	var asJSON bool
	poll := 500 * time.Millisecond
	_, err := subFlags(e, "run "+verb, runHelp, args[2:], func(fs *flag.FlagSet) {
		switch verb {
		case "show":
			fs.BoolVar(&asJSON, "json", false, "print JSON")
		case "wait":
			fs.DurationVar(&poll, "poll", poll, "progress refresh interval")
		}
	})
	if err != nil {
		return err
	}
	if poll <= 0 {
		return cli.Usagef("-poll must be > 0")
	}
	var enq *app.Enqueuer
	var done func()
	if verb == "cancel" {
		enq, done, err = setup(ctx, e, configPath)
	} else {
		enq, done, err = setupForReading(ctx, e, "run", configPath)
	}
	if err != nil {
		return err
	}
	defer done()
	switch verb {
	case "show":
		info, err := enq.Client.Run(ctx, id)
		if err != nil {
			return runErr(id, err)
		}
		if asJSON {
			return writeJSON(e.stdout, info)
		}
		printRun(e.stdout, info, time.Now())
		return nil
	case "wait":
		info, _, err := watchRun(ctx, e, enq, id, nil, poll, nil)
		if err != nil {
			return runErr(id, err)
		}
		if info.Failed > 0 || info.State == queues.RunCancelled {
			return errReported
		}
		return nil
	}
	res, err := enq.Client.CancelRun(ctx, id)
	if err != nil {
		return runErr(id, err)
	}
	switch res.Outcome {
	case "ended":
		fmt.Fprintf(e.stdout, "run %s had already ended (%s): nothing changed\n", id, res.Ended.Local().Format(time.RFC3339))
	case "already":
		fmt.Fprintf(e.stdout, "run %s was already cancelled\n", id)
	default:
		fmt.Fprintf(e.stdout, "run %s cancelled: %d queued jobs taken out of their queues (kept as archived), %d running jobs cancelled; its completion step will not fire\n", id, res.Removed, res.Running)
	}
	return nil
}

// runErr makes an unknown run a usage error (exit 2).
func runErr(id string, err error) error {
	if errors.Is(err, queues.ErrRunNotFound) {
		return cli.Usagef("no run %s (enqueue runs lists the recent ones; a run's record is kept %s after it ends)", cli.Quote(id), queues.RunKeep)
	}
	return err
}

// printRun prints one run for people.
func printRun(w io.Writer, r queues.RunInfo, now time.Time) {
	fmt.Fprintf(w, "run %s: %s\n", r.ID, r.State)
	for _, kv := range [][2]string{{"kind", r.Kind}, {"period", r.Period}, {"plan", r.Plan}, {"started by", r.StartedBy}} {
		if kv[1] != "" {
			fmt.Fprintf(w, "  %-11s %s\n", kv[0]+":", kv[1])
		}
	}
	fmt.Fprintf(w, "  %-11s %s\n", "started:", r.CreatedAt.Local().Format(time.RFC3339))
	if !r.CancelledAt.IsZero() {
		fmt.Fprintf(w, "  %-11s %s\n", "cancelled:", r.CancelledAt.Local().Format(time.RFC3339))
	}
	if r.Finished() {
		fmt.Fprintf(w, "  %-11s %s (took %s)\n", "ended:", r.EndedAt.Local().Format(time.RFC3339), r.EndedAt.Sub(r.CreatedAt).Round(100*time.Millisecond))
	} else if d, ok := r.ETA(now); ok {
		fmt.Fprintf(w, "  %-11s %s\n", "ETA:", d)
	}
	for _, s := range []struct {
		name string
		step *queues.RunStep
	}{{"on_complete", r.OnComplete}, {"on_failure", r.OnFailure}} {
		if s.step == nil {
			continue
		}
		fired := "not yet"
		switch {
		case s.name == "on_complete" && strings.Contains(r.Fired, "complete"), s.name == "on_failure" && strings.Contains(r.Fired, "failure"):
			fired = "enqueued"
		case r.State == queues.RunCancelled || (r.Finished() && s.name == "on_failure" && r.Failed == 0):
			fired = "will not fire"
		}
		fmt.Fprintf(w, "  %-11s %s (%s)\n", s.name+":", s.step.JobType, fired)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIER\tTOTAL\tQUEUED\tRUNNING\tSUCCEEDED\tFAILED\tREFUSED\tCANCELLED")
	row := func(tier string, n queues.RunCounts) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", tier, n.Total(), n.Queued, n.Running, n.Succeeded, n.Failed, n.Refused, n.Cancelled)
	}
	for _, t := range r.Tiers {
		row(dash(t.Tier), t.RunCounts)
	}
	row("all", r.RunCounts)
	_ = tw.Flush()
	for _, f := range r.Failures {
		fmt.Fprintf(w, "  FAILED %s (tier %s): %s\n", f.JobID, dash(f.Tier), cli.Readable(f.Reason))
	}
}

// watchRun shows a run's progress until it has ended (and its completion
// steps were enqueued), and returns its last reading and whether a job of
// also failed or was cancelled. also are jobs of the same plan that its
// command found already queued or running, so not this run's: they are
// shown with the run's and watched until they too have ended. A Redis
// that does not answer is polled again for up to watchOutageLimit. label,
// when set, names each failed job for people.
func watchRun(ctx context.Context, e env, enq *app.Enqueuer, id string, also []app.ReportJob, poll time.Duration, label func(queues.RunFailure) string) (queues.RunInfo, bool, error) {
	view := &app.ProgressView{W: e.stdout, Terminal: e.isTerminal}
	var info queues.RunInfo
	before := newEarlierJobs(also)
	goesOn := "the run goes on, its jobs stay queued"
	if len(also) > 0 {
		fmt.Fprintf(e.stdout, "%s already queued or running before this command: watching %s too\n", plural(len(also), "report"), them(len(also)))
		goesOn = "the reports stay queued; the same command again watches them"
	}
	err := pollUntil(ctx, e, poll, goesOn, func() (bool, error) {
		var err error
		info, err = enq.Client.Run(ctx, id)
		if err != nil {
			return false, err
		}
		if err := before.read(ctx, enq); err != nil {
			return false, err
		}
		view.Draw(withEarlier(tierCounts(info), app.CountByTier(before.states, enq.Config.Policy.Tiers())), time.Since(info.CreatedAt))
		if !info.Finished() || info.Due != "" || len(before.open) > 0 {
			return false, nil
		}
		if len(also) == 0 || info.Total() > 0 {
			printRunEnd(e.stdout, info, label)
		}
		return true, nil
	})
	if err != nil {
		return info, false, err
	}
	return info, before.printEnd(e.stdout), nil
}

// them is the pronoun for n things.
func them(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}

// earlierJobs are a plan's jobs that were queued or running before its
// command, with the state each was last read in. A job that has ended
// (completed, failed for good, deleted) keeps that state and is not read
// again.
type earlierJobs struct {
	states []app.JobState
	open   []int // indexes of the jobs not ended yet
}

func newEarlierJobs(jobs []app.ReportJob) *earlierJobs {
	e := &earlierJobs{states: make([]app.JobState, len(jobs))}
	for i, j := range jobs {
		e.states[i] = app.JobState{Job: j, State: "pending"}
		e.open = append(e.open, i)
	}
	return e
}

// read reads the state of every job not ended yet.
func (e *earlierJobs) read(ctx context.Context, enq *app.Enqueuer) error {
	if len(e.open) == 0 {
		return nil
	}
	jobs := make([]app.ReportJob, len(e.open))
	for k, i := range e.open {
		jobs[k] = e.states[i].Job
	}
	states, err := enq.Progress(ctx, jobs)
	if err != nil {
		return err
	}
	open := e.open[:0]
	for k, i := range e.open {
		e.states[i] = states[k]
		if !states[k].Ended() {
			open = append(open, i)
		}
	}
	e.open = open
	return nil
}

// printEnd says how the jobs ended, each failure on a line of its own,
// and reports whether one failed or was cancelled.
func (e *earlierJobs) printEnd(w io.Writer) bool {
	if len(e.states) == 0 {
		return false
	}
	var done, failed, cancelled, gone int
	for _, s := range e.states {
		switch {
		case s.State == "completed":
			done++
		case s.State == "archived" && cancelledWithRun(s.LastErr):
			cancelled++
		case s.State == "archived":
			failed++
		default:
			gone++
		}
	}
	fmt.Fprintf(w, "the %s queued before: %d completed, %d failed", plural(len(e.states), "report"), done, failed)
	if cancelled > 0 {
		fmt.Fprintf(w, ", %d cancelled", cancelled)
	}
	if gone > 0 {
		fmt.Fprintf(w, ", %d deleted meanwhile", gone)
	}
	fmt.Fprintln(w)
	for _, s := range e.states {
		if s.State == "archived" && !cancelledWithRun(s.LastErr) {
			fmt.Fprintf(w, "  FAILED %s (%s, tier %s): %s\n", s.Job.Report, s.Job.Period, s.Job.Tier, cli.Readable(s.LastErr))
		}
	}
	return failed+cancelled > 0
}

// cancelledWithRun says whether an archived job's last error is its run's
// cancel: none for a job archived before it started, ErrRunCancelled for
// one cut while it ran.
func cancelledWithRun(lastErr string) bool {
	return lastErr == "" || strings.Contains(lastErr, queues.ErrRunCancelled.Error())
}

// withEarlier adds a run's counts to those of its plan's earlier jobs
// (one entry per tier of the policy, in its order), keeping only tiers
// with jobs.
func withEarlier(run, earlier []app.TierCount) (counts []app.TierCount) {
	all := slices.Clone(earlier)
	for _, c := range run {
		i := slices.IndexFunc(all, func(e app.TierCount) bool { return e.Tier == c.Tier })
		if i < 0 {
			all = append(all, c)
			continue
		}
		m := &all[i]
		m.Total += c.Total
		m.Done += c.Done
		m.Failed += c.Failed
		m.Running += c.Running
		m.Retry += c.Retry
		m.Waiting += c.Waiting
		m.Missing += c.Missing
	}
	for _, c := range all {
		if c.Total > 0 {
			counts = append(counts, c)
		}
	}
	return counts
}

// pollUntil calls read every poll until it reports done. A Redis that does
// not answer is polled again for up to watchOutageLimit; a run that is not
// there ends it at once (queues.ErrRunNotFound); an interrupt stops the
// watching (goesOn says what carries on without it).
func pollUntil(ctx context.Context, e env, poll time.Duration, goesOn string, read func() (bool, error)) error {
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var downSince time.Time
	for {
		done, err := read()
		switch {
		case errors.Is(err, queues.ErrRunNotFound):
			return err
		case err != nil && ctx.Err() == nil && downSince.IsZero():
			downSince = time.Now()
			fmt.Fprintf(e.stdout, "redis does not answer (%v); still watching for up to %s: the jobs keep running\n", err, watchOutageLimit)
		case err == nil && !downSince.IsZero():
			fmt.Fprintf(e.stdout, "redis answers again after %s\n", time.Since(downSince).Round(100*time.Millisecond))
			downSince = time.Time{}
		}
		if done {
			return nil
		}
		if ctx.Err() != nil {
			// Interrupted while reading: the read's error, if any, is the
			// interrupt's.
			fmt.Fprintf(e.stdout, "stopped watching; %s\n", goesOn)
			return ctx.Err()
		}
		if err != nil && time.Since(downSince) >= watchOutageLimit {
			return err
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(e.stdout, "stopped watching; %s\n", goesOn)
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// tierCounts turns a run's counts into the progress view's: refused and
// cancelled jobs are finished without having run.
func tierCounts(r queues.RunInfo) []app.TierCount {
	out := make([]app.TierCount, 0, len(r.Tiers))
	for _, t := range r.Tiers {
		out = append(out, app.TierCount{Tier: dash(t.Tier), Total: t.Total(), Done: t.Succeeded, Failed: t.Failed,
			Running: t.Running, Waiting: t.Queued, Missing: t.Refused + t.Cancelled})
	}
	return out
}

// printRunEnd says how a run ended, each failure on a line of its own.
func printRunEnd(w io.Writer, r queues.RunInfo, label func(queues.RunFailure) string) {
	kind := dash(r.Kind)
	fmt.Fprintf(w, "%s finished in %s: %d completed, %d failed", kind, r.EndedAt.Sub(r.CreatedAt).Round(100*time.Millisecond), r.Succeeded, r.Failed)
	if r.Refused > 0 {
		fmt.Fprintf(w, ", %d refused at the door", r.Refused)
	}
	if r.Cancelled > 0 {
		fmt.Fprintf(w, ", %d cancelled", r.Cancelled)
	}
	fmt.Fprintln(w)
	for _, f := range r.Failures {
		name := f.JobID
		if label != nil {
			name = label(f)
		}
		fmt.Fprintf(w, "  FAILED %s: %s\n", name, cli.Readable(f.Reason))
	}
	var fired []string
	if r.OnComplete != nil && strings.Contains(r.Fired, "complete") {
		fired = append(fired, "on_complete "+r.OnComplete.JobType)
	}
	if r.OnFailure != nil && strings.Contains(r.Fired, "failure") {
		fired = append(fired, "on_failure "+r.OnFailure.JobType)
	}
	if len(fired) > 0 {
		fmt.Fprintf(w, "enqueued: %s\n", strings.Join(fired, ", "))
	}
}
