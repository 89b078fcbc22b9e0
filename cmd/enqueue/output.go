package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/quote"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/queues"
)

func loadPlan(path, period string, cfg *app.Config) (*reports.Plan, error) {
	plan, err := reports.LoadPlan(path, period, cfg.Catalog, cfg.Policy)
	if err != nil {
		return nil, err
	}
	var problems []string
	for _, s := range []struct {
		name string
		step *reports.Step
	}{{"on_complete", plan.OnComplete}, {"on_failure", plan.OnFailure}} {
		if s.step != nil {
			problems = append(problems, cfg.StepProblems(s.name, s.step)...)
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("plan %s: %s", path, strings.Join(problems, "\n"))
	}
	return plan, nil
}

// printPlanSummary prints what an enqueued plan did: a headline with the
// reports enqueued (new or again) and those left alone because they were
// already queued or running, then the same per tier.
func printPlanSummary(w io.Writer, cfg *app.Config, res app.PlanResult) {
	type counts struct{ enqueued, already, rerun int }
	var all counts
	per := map[string]*counts{}
	for i, j := range res.Jobs {
		c := per[j.Tier]
		if c == nil {
			c = &counts{}
			per[j.Tier] = c
		}
		switch res.Outcomes[i] {
		case queues.Enqueued:
			c.enqueued++
			all.enqueued++
		case queues.Duplicate:
			c.already++
			all.already++
		case queues.Replaced:
			c.rerun++
			all.rerun++
		}
	}
	parts := []string{plural(all.enqueued, "new report") + " enqueued"}
	if all.rerun > 0 {
		parts = append(parts, fmt.Sprintf("%d enqueued again (their previous run had finished)", all.rerun))
	}
	if all.already > 0 {
		parts = append(parts, fmt.Sprintf("%d already queued or running, left as they are", all.already))
	}
	rate := float64(len(res.Jobs)) / res.Took.Seconds()
	fmt.Fprintf(w, "month-end plan of %s: %s (in %s, %.0f reports/s)\n",
		plural(len(res.Jobs), "report"), strings.Join(parts, ", "), res.Took.Round(time.Millisecond), rate)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIER\tNEW\tALREADY QUEUED\tRERUN")
	for _, t := range cfg.Policy.Tiers() {
		if c := per[t]; c != nil {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", t, c.enqueued, c.already, c.rerun)
		}
	}
	_ = tw.Flush()
}

// watchOutageLimit is how long watching (month-end -wait, run wait) keeps
// polling a Redis that does not answer (a Sentinel failover takes seconds;
// a restart, a few more) before it gives up with the error.
const watchOutageLimit = time.Minute

func printStatus(w io.Writer, st app.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tSCOPE\tSIZE\tWORKERS\tACTIVE\tWAITING FOR SLOT\tAVAILABLE\tFULL\tSLOTS HELD BY")
	for _, p := range st.Pools {
		full := "no"
		if p.IsFull {
			full = "yes"
		}
		if p.Workers == 0 {
			full = "no worker"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", p.Name, p.Scope, sizeText(p), p.Workers, p.Active, p.WaitingForSlot, p.Available, full, holders(p.Holders))
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tTIER\tPENDING\tACTIVE\tWAITING FOR SLOT\tSCHEDULED\tRETRY\tARCHIVED\tCOMPLETED\tOLDEST PENDING")
	for _, p := range st.Pools {
		for _, q := range p.Queues {
			tier := q.Tier
			if tier == "" {
				tier = "-"
			}
			oldest := "-"
			if q.Pending > 0 {
				oldest = (time.Duration(q.OldestPendingSeconds * float64(time.Second))).Round(time.Millisecond).String()
			}
			paused := ""
			if q.Paused {
				paused = " (paused)"
			}
			fmt.Fprintf(tw, "%s%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", q.Queue, paused, tier, q.Pending, q.Active, q.WaitingForSlot, q.Scheduled, q.Retry, q.Archived, q.Completed, oldest)
		}
	}
	_ = tw.Flush()
	printDoors(w, st)
	printSteering(w, st)
	printBreakers(w, st)
	printAdaptive(w, st)
	printDependencies(w, st)
	printSilent(w, st)
	fmt.Fprintln(w, "\nA cluster-scoped pool's SIZE holds across every worker process; a process-scoped pool's SIZE holds per process (capacity = SIZE x WORKERS).")
	fmt.Fprintln(w, "ACTIVE counts jobs whose handler runs; WAITING FOR SLOT counts jobs a worker took from the queue ahead of a free slot (they start the moment one frees).")
	fmt.Fprintf(w, "Worker processes the work can keep busy now: %d (the most over the pools; a cluster-scoped pool needs no more than its SIZE fills: docs/AUTOSCALING.md).\n", st.UsefulWorkers)
	if len(st.Dependencies) > 0 {
		fmt.Fprintln(w, "A pool CLAIMS its size in effect x its uses of a dependency (an adaptive pool its max_size x uses); IN USE is its slots held x uses, across every worker process (docs/DEPENDENCIES.md).")
	}
}

// printAdaptive shows the adaptive limit of each pool that has one: the
// limit, its bounds, how often it changed and its last change.
func printAdaptive(w io.Writer, st app.Status) {
	var rows []app.PoolStatus
	for _, p := range st.Pools {
		if p.Adaptive != nil {
			rows = append(rows, p)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ADAPTIVE\tLIMIT\tMIN..MAX\tCHANGES\tLAST CHANGE")
	for _, p := range rows {
		a := p.Adaptive
		limit := fmt.Sprint(a.Limit)
		if p.Resized {
			limit += fmt.Sprintf(" (held off: an operator's size %d is in effect)", p.EffectiveSize)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d..%d\t%d\t%s\n", p.Name, limit, a.Min, a.Max, a.Changes, lastAdaptiveChange(a))
	}
	_ = tw.Flush()
}

// lastAdaptiveChange is when and why an adaptive limit last moved, with
// from and to when its log still holds the change: "2026-10-31 12:03:04
// 2 → 3: jobs took 20ms, ...", or "none yet".
func lastAdaptiveChange(a *queues.AdaptiveStatus) string {
	if a.At.IsZero() {
		return "none yet"
	}
	s := a.At.UTC().Format(time.DateTime)
	for _, c := range a.Log {
		if c.From > 0 && c.At.Equal(a.At) {
			s += fmt.Sprintf(" %d → %d", c.From, c.To)
			break
		}
	}
	return s + ": " + a.Reason
}

// printDependencies shows each dependency's capacity against what the
// pools claim of it and what their running jobs hold, in all and per
// pool.
func printDependencies(w io.Writer, st app.Status) {
	if len(st.Dependencies) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEPENDENCY\tCAPACITY\tCLAIMED\tIN USE\tBY POOL (CLAIMED/IN USE)")
	for _, d := range st.Dependencies {
		claimed := fmt.Sprint(d.Claimed)
		if d.Claimed > d.Capacity {
			claimed += " (overbooked)"
		}
		parts := make([]string, 0, len(d.Pools))
		for _, u := range d.Pools {
			parts = append(parts, fmt.Sprintf("%s %d/%d", u.Pool, u.Claimed, u.InUse))
		}
		by := strings.Join(parts, ", ")
		if by == "" {
			by = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\n", d.Name, d.Capacity, claimed, d.InUse, by)
	}
	_ = tw.Flush()
}

// printSilent shows the running jobs whose worker stopped renewing their
// lease: a worker that died, froze or lost Redis, and is being recovered.
func printSilent(w io.Writer, st app.Status) {
	first := true
	for _, p := range st.Pools {
		for _, j := range p.Silent {
			if first {
				fmt.Fprintln(w, "\nWorkers not heard from: their jobs go back to the head of their queue once silent for recover_after (docs/RELIABILITY.md):")
				first = false
			}
			proc := "a worker asynq no longer lists"
			if j.Process != "" {
				proc = "worker " + quote.Value(j.Process)
			}
			tier := ""
			if j.Tier != "" {
				tier = " (" + j.Tier + ")"
			}
			fmt.Fprintf(w, "  %s: job %s%s of %s, silent %.0fs of %.0fs\n", p.Name, quote.Value(j.ID), tier, proc, j.SilentSeconds, j.RecoverAfterSeconds)
		}
	}
}

// sizeText is a pool's size in effect, with the configured one beside it
// when an operator resized the pool, and the most it may be resized to.
func sizeText(p app.PoolStatus) string {
	s := fmt.Sprint(p.EffectiveSize)
	if p.Resized {
		s += fmt.Sprintf(" (resized; configured %d)", p.Size)
	}
	if p.Scope == "cluster" && p.MaxSize > p.EffectiveSize {
		s += fmt.Sprintf(" max %d", p.MaxSize)
	}
	if p.Scope == "cluster" && p.Workers > 0 && p.WorkersCanRun < p.EffectiveSize {
		s += fmt.Sprintf(" (workers can run %d)", p.WorkersCanRun)
	}
	return s
}

// printDoors shows what the door of each pool with door settings or
// refusals holds: the backlog against its limits, the rates and how many
// jobs were refused.
func printDoors(w io.Writer, st app.Status) {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DOOR\tTIER\tBACKLOG\tLIMIT\tREFUSED (BACKLOG)\tREFUSED (RATE)")
	rows := 0
	var rates []string
	for _, p := range st.Pools {
		for _, r := range p.Rates {
			what := r.Limit
			if r.JobType != "" {
				what += " " + r.JobType
			}
			rates = append(rates, fmt.Sprintf("  %s: %s %s", p.Name, what, r.Rate))
		}
		for _, q := range p.Queues {
			if q.BacklogLimit == 0 && len(q.Refused) == 0 {
				continue
			}
			tier, limit := q.Tier, "-"
			if tier == "" {
				tier = "-"
			}
			if q.BacklogLimit > 0 {
				limit = fmt.Sprint(q.BacklogLimit)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\n", p.Name, tier, p.Backlog, limit, q.Refused["backlog"], q.Refused["rate"])
			rows++
		}
		if p.WaitingForRoom > 0 {
			rates = append(rates, fmt.Sprintf("  %s: %d requests waiting for room", p.Name, p.WaitingForRoom))
		}
	}
	_ = tw.Flush()
	if rows > 0 {
		fmt.Fprint(w, "\n"+b.String())
	}
	if len(rates) > 0 {
		fmt.Fprintln(w, "\nrate limits:\n"+strings.Join(rates, "\n"))
	}
}

// printSteering shows, for the tiers of pools with reserved slots or
// maximum waits, the reservation, the wait limit and the oldest pending
// job's wait against it.
func printSteering(w io.Writer, st app.Status) {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEERING\tTIER\tRESERVED\tMAX WAIT\tOLDEST WAIT")
	rows := 0
	for _, p := range st.Pools {
		steered := false
		for _, q := range p.Queues {
			steered = steered || q.Reserved > 0 || q.MaxWaitSeconds > 0
		}
		if !steered {
			continue
		}
		for _, q := range p.Queues {
			reserved, limit, oldest := "-", "-", "-"
			if q.Reserved > 0 {
				reserved = fmt.Sprint(q.Reserved)
			}
			if q.MaxWaitSeconds > 0 {
				limit = seconds(q.MaxWaitSeconds).String()
			}
			if q.Pending > 0 {
				oldest = seconds(q.OldestPendingSeconds).Round(time.Second).String()
				if q.OverMaxWait {
					oldest += " (over: served first)"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Name, q.Tier, reserved, limit, oldest)
			rows++
		}
	}
	_ = tw.Flush()
	if rows > 0 {
		fmt.Fprint(w, "\n"+b.String())
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// holders lists the processes holding a pool's slots: "host:pid:id×n, ...".
func holders(h map[string]int) string {
	if len(h) == 0 {
		return "-"
	}
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, name := range names {
		parts[i] = fmt.Sprintf("%s×%d", name, h[name])
	}
	return strings.Join(parts, ", ")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printBreakers shows the circuit breaker of each pool that has one.
func printBreakers(w io.Writer, st app.Status) {
	var rows []app.PoolStatus
	for _, p := range st.Pools {
		if p.Breaker != nil {
			rows = append(rows, p)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BREAKER\tSTATE\tSINCE\tWHY\tCALLS\tFAILED\tSLOW\tWINDOW (CALLS/FAILED/SLOW)")
	for _, p := range rows {
		fmt.Fprintln(tw, breakerRow(p.Name, *p.Breaker))
	}
	_ = tw.Flush()
}

// breakerRow is one breaker's line: state (forced, reopening when),
// since, why, the counts that drove the last change, and the window now.
func breakerRow(pool string, b queues.BreakerState) string {
	state := string(b.State)
	if b.Forced != "" {
		state += " (forced)"
	}
	if !b.ReopensAt.IsZero() {
		state += ", probes at " + b.ReopensAt.UTC().Format(time.TimeOnly)
	}
	if b.State == queues.BreakerHalfOpen {
		state += fmt.Sprintf(", %d probes running, %d succeeded", b.ProbesRunning, b.ProbesSucceeded)
	}
	since, why := "-", b.Why
	if !b.Since.IsZero() {
		since = b.Since.UTC().Format(time.DateTime)
	}
	if why == "" {
		why = "-"
	}
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d/%d/%d", pool, state, since, why, b.Calls, b.Failures, b.Slow,
		b.WindowCalls, b.WindowFailures, b.WindowSlow)
}

// plural is "1 report" or "n reports".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// printExamples prints, for jobType or for every job type when it is
// empty, what the job does, its payload's fields and a command that
// enqueues a valid one. It reads no config and touches no Redis.
func printExamples(w io.Writer, jobType string) error {
	docs := handlers.Payloads()
	if jobType != "" {
		d, err := handlers.PayloadOf(jobType)
		if err != nil {
			return cli.Usagef("%v", err)
		}
		docs = []handlers.PayloadDoc{d}
	}
	for i, d := range docs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s: %s\n", d.JobType, d.Summary)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  FIELD\tTYPE\tMEANING")
		for _, f := range d.Fields {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", f.Name, f.Type, f.Meaning)
		}
		_ = tw.Flush()
		fmt.Fprintf(w, "  enqueue job -type %s -payload '%s'\n", d.JobType, d.Example)
	}
	return nil
}
