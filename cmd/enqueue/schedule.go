package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/schedule"
)

func cmdSchedules(ctx context.Context, e env, configPath string, args []string) error {
	var asJSON bool
	var runs int
	_, err := subFlags(e, "schedules", "usage: enqueue schedules [-json] [-runs N]\n\nLists the config's schedules with their next run and their newest runs.", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print JSON for scripts")
		fs.IntVar(&runs, "runs", 5, "show the newest `N` runs of each schedule")
	})
	if err != nil {
		return err
	}
	if runs < 1 {
		return cli.Usagef("-runs must be >= 1")
	}
	enq, done, err := setupForReading(ctx, e, "schedules", configPath)
	if err != nil {
		return err
	}
	defer done()
	list, err := enq.Schedules(ctx, time.Now(), runs)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, struct {
			Schedules []app.ScheduleStatus `json:"schedules"`
		}{list})
	}
	if len(list) == 0 {
		fmt.Fprintf(e.stdout, "no schedules in %s (add a schedules: list; see docs/SCHEDULES.md)\n", configPath)
		return nil
	}
	printSchedules(e.stdout, list)
	for _, s := range list {
		fmt.Fprintf(e.stdout, "\n%s: plan %s (%d reports); newest runs first\n", s.Name, s.Plan, s.Reports)
		printRuns(e.stdout, s)
	}
	return nil
}

func cmdSchedule(ctx context.Context, e env, configPath string, args []string) error {
	const help = "usage: enqueue schedule run NAME [-period YYYY-MM]\n\nRuns the schedule's plan now, enabled or not: each report is enqueued unless its job for the period is already queued, running or done, and the run is recorded."
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		if len(args) > 0 {
			fmt.Fprintln(e.stdout, help)
			return flag.ErrHelp
		}
		return cli.Usagef("missing subcommand: run NAME [-period YYYY-MM]")
	}
	if args[0] != "run" {
		return cli.Usagef("unknown subcommand %s (use: schedule run NAME [-period YYYY-MM])", cli.Quote(args[0]))
	}
	// NAME may come before or after the flags.
	rest, name := args[1:], ""
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		name, rest = rest[0], rest[1:]
	}
	var period string
	fs := flag.NewFlagSet("schedule run", flag.ContinueOnError)
	fs.StringVar(&period, "period", "", "month, `YYYY-MM`; defaults to the month a run starting now would cover")
	if err := cli.ParseFlags(fs, rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cli.Usage(e.stdout, fs, help)
		}
		return err
	}
	switch {
	case name == "" && fs.NArg() == 1:
		name = fs.Arg(0)
	case fs.NArg() > 0:
		return cli.Usagef("unexpected argument %q", fs.Arg(fs.NArg()-1))
	}
	if name == "" {
		return cli.Usagef("missing schedule name: schedule run NAME [-period YYYY-MM]")
	}
	if period != "" {
		if _, err := reports.ParsePeriod(period); err != nil {
			return cli.Usagef("%v", err)
		}
	}
	cfg, err := app.Load(configPath, e.getenv)
	if err != nil {
		return err
	}
	if cfg.Schedule(name) == nil {
		names := make([]string, len(cfg.Schedules))
		for i, s := range cfg.Schedules {
			names[i] = s.Name
		}
		if len(names) == 0 {
			return cli.Usagef("unknown schedule %s: %s has no schedules", cli.Quote(name), configPath)
		}
		return cli.Usagef("unknown schedule %s (schedules: %s)\nnothing was enqueued", cli.Quote(name), strings.Join(names, ", "))
	}
	enq, err := app.NewEnqueuer(ctx, cfg)
	if err != nil {
		return err
	}
	defer enq.Close()
	host, _ := os.Hostname()
	sched := app.NewScheduler(cfg, enq, app.SchedulerOptions{
		Logger: slog.New(slog.DiscardHandler), ID: fmt.Sprintf("enqueue@%s:%d", host, os.Getpid()),
	})
	rec, err := sched.RunNow(ctx, name, period)
	if errors.Is(err, schedule.ErrUnknown) {
		return cli.Usagef("%v", err)
	}
	if err != nil {
		if rec.ID == "" {
			return err
		}
		return fmt.Errorf("schedule %s: run for %s failed after enqueuing %d reports (%d already present, %d refused): %w (recorded as run %s)",
			name, rec.Period, rec.Enqueued, rec.AlreadyPresent, rec.Refused, err, rec.ID)
	}
	total := rec.Enqueued + rec.AlreadyPresent + rec.Refused
	if rec.Enqueued == 0 && rec.Refused == 0 {
		fmt.Fprintf(e.stdout, "schedule %s: run for %s enqueued nothing new: all %d reports are already queued, running or done (recorded as run %s)\n",
			name, rec.Period, total, rec.ID)
	} else {
		fmt.Fprintf(e.stdout, "schedule %s: run for %s enqueued %d of %d reports (%d already queued, running or done; %d refused) (recorded as run %s)\n",
			name, rec.Period, rec.Enqueued, total, rec.AlreadyPresent, rec.Refused, rec.ID)
	}
	if rec.Refused > 0 {
		fmt.Fprintf(e.stdout, "%d reports were refused by the queues; see the worker's log, and run this again once there is room\n", rec.Refused)
		return errReported
	}
	return nil
}

// printSchedules prints one line per schedule: how it is set and its next
// run.
func printSchedules(w io.Writer, list []app.ScheduleStatus) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCHEDULE\tENABLED\tCRON\tTIMEZONE\tPERIOD\tREPORTS\tCATCH-UP\tNEXT RUN")
	for _, s := range list {
		enabled, next := "yes", "-"
		if !s.Enabled {
			enabled, next = "no", "- (disabled)"
		}
		if s.NextRun != nil {
			next = fmt.Sprintf("%s (for %s)", s.NextRun.Format("2006-01-02 15:04 MST"), s.NextPeriod)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.Name, enabled, s.Cron, s.Timezone, s.Period, s.Reports, shortDuration(s.CatchUp), next)
	}
	_ = tw.Flush()
}

// printRuns prints a schedule's runs, newest first.
func printRuns(w io.Writer, s app.ScheduleStatus) {
	if len(s.Runs) == 0 {
		fmt.Fprintln(w, "  no runs yet")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  RUN\tTRIGGER\tPERIOD\tSTATE\tENQUEUED\tALREADY\tREFUSED\tSTARTED (UTC)\tTOOK\tCLAIMED BY")
	for _, r := range s.Runs {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", runName(r, s.Timezone), r.Trigger, r.Period, runState(r),
			r.Enqueued, r.AlreadyPresent, r.Refused, r.StartedAt.UTC().Format("2006-01-02 15:04:05"), took(r), r.ClaimedBy)
	}
	_ = tw.Flush()
	for _, r := range s.Runs {
		if r.Error != "" {
			fmt.Fprintf(w, "  run %s: %s\n", runName(r, s.Timezone), r.Error)
		}
	}
}

// runName is a run's fire time in the schedule's zone, or "manual".
func runName(r schedule.Record, zone string) string {
	if r.ScheduledFor.IsZero() {
		return "manual"
	}
	t := r.ScheduledFor
	if loc, err := time.LoadLocation(zone); err == nil {
		t = t.In(loc)
	}
	return t.Format("2006-01-02 15:04 MST")
}

func runState(r schedule.Record) string {
	if r.Attempt > 1 {
		return fmt.Sprintf("%s (attempt %d)", r.State, r.Attempt)
	}
	return r.State
}

func took(r schedule.Record) string {
	if r.FinishedAt.IsZero() {
		return "-"
	}
	return r.FinishedAt.Sub(r.StartedAt).Round(time.Millisecond).String()
}

// shortDuration turns "24h0m0s" into "24h" and "1h30m0s" into "1h30m".
func shortDuration(s string) string {
	d, err := time.ParseDuration(s)
	if err != nil {
		return s
	}
	switch {
	case d > 0 && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d > 0 && d%time.Minute == 0:
		return strings.TrimSuffix(d.String(), "0s")
	}
	return d.String()
}

// printScheduleStatus is status's section on schedules: each one's last
// and next run.
func printScheduleStatus(w io.Writer, list []app.ScheduleStatus) {
	if len(list) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCHEDULE\tNEXT RUN\tLAST RUN\tPERIOD\tSTATE\tENQUEUED\tALREADY\tREFUSED")
	for _, s := range list {
		next := "- (disabled)"
		if s.Enabled {
			next = "-"
		}
		if s.NextRun != nil {
			next = fmt.Sprintf("%s (for %s)", s.NextRun.Format("2006-01-02 15:04 MST"), s.NextPeriod)
		}
		if s.LastRun == nil {
			fmt.Fprintf(tw, "%s\t%s\tnever\t-\t-\t-\t-\t-\n", s.Name, next)
			continue
		}
		r := *s.LastRun
		last := runName(r, s.Timezone)
		if r.Trigger != schedule.TriggerSchedule && r.Trigger != schedule.TriggerManual {
			last += " (" + r.Trigger + ")"
		}
		if r.Trigger == schedule.TriggerManual {
			last = "manual, " + r.StartedAt.UTC().Format("2006-01-02 15:04 UTC")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n", s.Name, next, last, r.Period, runState(r), r.Enqueued, r.AlreadyPresent, r.Refused)
	}
	_ = tw.Flush()
}
