// Command enqueue puts month-end reports on the queues and shows their state.
//
//	enqueue -config FILE report    -name NAME -period YYYY-MM [-tier TIER]
//	enqueue -config FILE month-end -plan FILE -period YYYY-MM [-wait]
//	enqueue -config FILE job       -type TYPE -payload JSON [-tier TIER]
//	enqueue job [-type TYPE] -example
//	enqueue -config FILE promote   -name NAME -period YYYY-MM -tier TIER [-json]
//	enqueue -config FILE status    [-json]
//	enqueue -config FILE schedules [-json] [-runs N]
//	enqueue -config FILE schedule run NAME [-period YYYY-MM]
//	enqueue -config FILE breaker   -pool POOL [open|close|reset] [-json]
//	enqueue -config FILE resize    -pool POOL (-size N | -reset) [-json]
//
// report, month-end and job take -rate-key KEY: the caller (a requester, a
// tenant) that a pool's enqueue_rate_per_key limits. Into such a pool they
// require it (exit 2 without it, nothing enqueued), so that a caller cannot
// escape the limit by leaving the flag out.
//
// status, schedules and breaker without an action only read: a config
// whose only problems concern the jobs (the database and its connection
// budget, the report settings, the listener) prints them as a warning and
// the command goes on. Every other command refuses such a config (exit 2).
//
// Exit codes: 0 success; 1 a runtime failure (Redis unreachable, a report
// failed); 2 a usage or validation error (nothing was enqueued); 3 refused
// by a pool's door: its backlog is full or a rate limit was reached
// (nothing was enqueued; the message says when to try again); 130 or 143
// interrupted by SIGINT or SIGTERM (what was enqueued before stays queued).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/telemetry"
	"github.com/lci-labs/compartment/queues"
)

// usage is the help of the command itself (enqueue -h).
var usage = fmt.Sprintf(`usage: enqueue [-config FILE] <command> [flags]

  -config FILE  config file (default %s:
                %s)

commands:
  report     -name NAME -period YYYY-MM [-tier TIER]   enqueue one report
  month-end  -plan FILE -period YYYY-MM [-wait]        enqueue a month-end plan
  job        -type TYPE -payload JSON [-tier TIER]     enqueue any job type
  job        [-type TYPE] -example                     show a job type's payload: fields, a valid one
  promote    -name NAME -period YYYY-MM -tier TIER     move a waiting report to another tier
  status     [-json]                                   pools, queues and schedules
  schedules  [-json] [-runs N]                         schedules with their next and last runs
  schedule   run NAME [-period YYYY-MM]                run a schedule's plan now
  breaker    -pool POOL [open|close|reset]             show or force a pool's circuit breaker
  resize     -pool POOL (-size N | -reset)             change a cluster-scoped pool's size in every worker
  runs       [-json] [-n N]                            recent runs (month-ends) with their progress
  run        show|wait|cancel ID                       one run: its counts and failures, wait for it, cancel it

Run "enqueue <command> -h" for a command's flags.
Exit codes: 0 done, 1 a failure, 2 bad input, 3 refused at a pool's door
(backlog full or rate limit; nothing was enqueued), 130/143 interrupted by
SIGINT/SIGTERM.`, app.DefaultConfigPath, app.DefaultConfigSummary)

func main() { cli.MainWith(interrupt, run) }

// interrupt is what enqueue says on SIGINT or SIGTERM: it runs no jobs, so
// the worker's words about them would not be true here. An interrupted
// command exits 128 + the signal's number (cli.InterruptedCode).
var interrupt = cli.Interrupt{
	First:  "interrupted (%s); stopping",
	Second: "second signal (%s): exiting at once",
}

// env is what a command needs from its surroundings.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	isTerminal     bool
}

func run(ctx context.Context, ce cli.Env) int {
	args, stdout, stderr, getenv := ce.Args, ce.Stdout, ce.Stderr, ce.Getenv
	fs := flag.NewFlagSet("enqueue", flag.ContinueOnError)
	configPath := cli.ConfigFlag(fs, app.DefaultConfigPath, app.DefaultConfigSummary)
	if err := cli.ParseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, usage)
			return cli.ExitOK
		}
		fmt.Fprintln(stderr, cli.Message("enqueue", err))
		return cli.ExitUsage
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "enqueue: missing command\n\n"+usage)
		return cli.ExitUsage
	}
	e := env{stdout: stdout, stderr: stderr, getenv: getenv, isTerminal: cli.IsTerminal(stdout)}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	var commands = map[string]func(context.Context, env, string, []string) error{
		"report":    cmdReport,
		"month-end": cmdMonthEnd,
		"job":       cmdJob,
		"promote":   cmdPromote,
		"status":    cmdStatus,
		"schedules": cmdSchedules,
		"schedule":  cmdSchedule,
		"breaker":   cmdBreaker,
		"resize":    cmdResize,
		"runs":      cmdRuns,
		"run":       cmdRun,
	}
	fn, ok := commands[cmd]
	if !ok {
		fmt.Fprintf(stderr, "enqueue: unknown command %q\n\n%s\n", cmd, usage)
		return cli.ExitUsage
	}
	tracing, err := telemetry.Setup(ctx, "compartment-enqueue", getenv)
	if err != nil {
		fmt.Fprintln(stderr, "enqueue:", err)
		return cli.ExitUsage
	}
	defer func() {
		if err := tracing.Shutdown(); err != nil {
			fmt.Fprintln(stderr, "enqueue: tracing: spans not sent:", err)
		}
	}()
	if tracing.Enabled() {
		// One trace per command: the jobs' enqueue spans are its children.
		var span trace.Span
		ctx, span = otel.Tracer("github.com/lci-labs/compartment/cmd/enqueue").Start(ctx, "enqueue "+cmd)
		defer span.End()
	}
	err = fn(ctx, e, *configPath, rest)
	if code, ok := cli.InterruptedCode(ctx); ok && errors.Is(err, context.Canceled) {
		return code // said when the signal came
	}
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
		return cli.ExitOK
	case errors.Is(err, errReported):
		return cli.ExitFailure
	default:
		fmt.Fprintln(stderr, cli.Message("enqueue "+cmd, err))
		return cli.ExitCode(err)
	}
}

// errReported means the command already told the user what failed.
var errReported = errors.New("failure reported")

// setup loads the config and connects to Redis.
func setup(ctx context.Context, e env, configPath string) (*app.Enqueuer, func(), error) {
	cfg, err := app.Load(configPath, e.getenv)
	if err != nil {
		return nil, nil, err
	}
	enq, err := app.NewEnqueuer(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return enq, enq.Close, nil
}

// setupForReading loads the config for a command that only reads the
// queues' state and connects to Redis. Problems of the config that do not
// concern reading (see app.LoadForReading) are printed on stderr as a
// warning, and the command goes on; any other problem is the error.
func setupForReading(ctx context.Context, e env, cmd, configPath string) (*app.Enqueuer, func(), error) {
	cfg, err := loadForReading(e, cmd, configPath)
	if err != nil {
		return nil, nil, err
	}
	enq, err := app.NewEnqueuer(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return enq, enq.Close, nil
}

// loadForReading loads the config for a command that only reads; see
// setupForReading.
func loadForReading(e env, cmd, configPath string) (*app.Config, error) {
	cfg, warnings, err := app.LoadForReading(configPath, e.getenv)
	if err != nil {
		return nil, err
	}
	if len(warnings) > 0 {
		what := "1 problem"
		if len(warnings) > 1 {
			what = fmt.Sprintf("%d problems", len(warnings))
		}
		fmt.Fprintf(e.stderr, "enqueue %s: warning: config %s: %s; reading goes on, but the worker and the commands that change something refuse this config until it is fixed:\n", cmd, configPath, what)
		for _, w := range warnings {
			fmt.Fprintf(e.stderr, "  - %s\n", w)
		}
	}
	return cfg, nil
}

func subFlags(e env, name, help string, args []string, define func(fs *flag.FlagSet)) (*flag.FlagSet, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	define(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cli.Usage(e.stdout, fs, help)
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	return fs, nil
}

func cmdReport(ctx context.Context, e env, configPath string, args []string) error {
	var name, period, tier, rateKey string
	_, err := subFlags(e, "report", "usage: enqueue report -name NAME -period YYYY-MM [-tier TIER]", args, func(fs *flag.FlagSet) {
		fs.StringVar(&name, "name", "", "report `name` from the catalog (required)")
		fs.StringVar(&period, "period", "", "month, `YYYY-MM` (required)")
		fs.StringVar(&tier, "tier", "", "priority `tier`; defaults to the report's tier in the priorities file")
		fs.StringVar(&rateKey, "rate-key", "", "the caller (`key`: a requester, a tenant) for enqueue_rate_per_key")
	})
	if err != nil {
		return err
	}
	if name == "" || period == "" {
		return cli.Usagef("-name and -period are required")
	}
	cfg, err := app.Load(configPath, e.getenv)
	if err != nil {
		return err
	}
	if err := needRateKey(cfg, handlers.TypeReport, rateKey); err != nil {
		return err
	}
	enq, err := app.NewEnqueuer(ctx, cfg)
	if err != nil {
		return err
	}
	defer enq.Close()
	enq.RateKey = rateKey
	job, outcome, err := enq.EnqueueReport(ctx, name, period, tier)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "report %s for %s: %s (tier %s, queue %s, id %s)\n", job.Report, job.Period, app.OutcomeText(outcome), job.Tier, job.Queue, job.ID)
	return nil
}

func cmdMonthEnd(ctx context.Context, e env, configPath string, args []string) error {
	var planPath, period, rateKey string
	var wait bool
	var poll time.Duration
	_, err := subFlags(e, "month-end", "usage: enqueue month-end -plan FILE -period YYYY-MM [-wait]", args, func(fs *flag.FlagSet) {
		fs.StringVar(&planPath, "plan", "", "plan `file` listing the reports (required)")
		fs.StringVar(&period, "period", "", "month, `YYYY-MM` (required)")
		fs.BoolVar(&wait, "wait", false, "show live progress until every report is done; exit 1 if any failed")
		fs.DurationVar(&poll, "poll", 500*time.Millisecond, "progress refresh interval with -wait")
		fs.StringVar(&rateKey, "rate-key", "", "the caller (`key`: a requester, a tenant) for enqueue_rate_per_key")
	})
	if err != nil {
		return err
	}
	if planPath == "" || period == "" {
		return cli.Usagef("-plan and -period are required")
	}
	if poll <= 0 {
		return cli.Usagef("-poll must be > 0")
	}
	cfg, err := app.Load(configPath, e.getenv)
	if err != nil {
		return err
	}
	if err := needRateKey(cfg, handlers.TypeReport, rateKey); err != nil {
		return err
	}
	plan, err := loadPlan(planPath, period, cfg)
	if err != nil {
		return cli.Usagef("%v\nnothing was enqueued", err)
	}
	enq, err := app.NewEnqueuer(ctx, cfg)
	if err != nil {
		return err
	}
	defer enq.Close()
	enq.RateKey = rateKey
	enq.StartedBy = startedBy(e)
	res, err := enq.EnqueuePlan(ctx, plan)
	if err != nil {
		return err
	}
	printPlanSummary(e.stdout, cfg, res)
	fmt.Fprintf(e.stdout, "run %s (enqueue run show %s)\n", res.Run, res.Run)
	if !wait {
		return nil
	}
	jobs := map[string]app.ReportJob{}
	var earlier []app.ReportJob // queued or running before: another run's
	for i, j := range res.Jobs {
		jobs[j.ID] = j
		if res.Outcomes[i] == queues.Duplicate {
			earlier = append(earlier, j)
		}
	}
	info, badBefore, err := watchRun(ctx, e, enq, res.Run, earlier, poll, func(f queues.RunFailure) string {
		j, ok := jobs[f.JobID]
		if !ok {
			return f.JobID
		}
		return fmt.Sprintf("%s (%s, tier %s)", j.Report, j.Period, f.Tier)
	})
	if err != nil {
		return err
	}
	if info.Failed > 0 || info.Cancelled > 0 || badBefore {
		return errReported
	}
	return nil
}

const jobHelp = `usage: enqueue job -type TYPE -payload JSON [-tier TIER]
       enqueue job [-type TYPE] -example

Enqueues one job of any job type a pool serves; the payload is checked as
its handler will decode it. -example prints a valid payload and its fields
for TYPE, or for every job type, and enqueues nothing.`

func cmdJob(ctx context.Context, e env, configPath string, args []string) error {
	var jobType, payload, tier, rateKey string
	var example bool
	_, err := subFlags(e, "job", jobHelp, args, func(fs *flag.FlagSet) {
		fs.StringVar(&jobType, "type", "", "job `type`, for example order:create (required, but with -example)")
		fs.StringVar(&payload, "payload", "", "the job's payload, `JSON` (required, but with -example)")
		fs.StringVar(&tier, "tier", "", "priority `tier`, for a pool with tiers")
		fs.StringVar(&rateKey, "rate-key", "", "the caller (`key`: a requester, a tenant) for enqueue_rate_per_key")
		fs.BoolVar(&example, "example", false, "print a valid payload and its fields for -type (or every job type); enqueue nothing")
	})
	if err != nil {
		return err
	}
	if example {
		if payload != "" || tier != "" || rateKey != "" {
			return cli.Usagef("-example prints a job type's payload and enqueues nothing: give it only -type")
		}
		return printExamples(e.stdout, jobType)
	}
	if jobType == "" || payload == "" {
		return cli.Usagef("-type and -payload are required (-example shows a payload)")
	}
	cfg, err := app.Load(configPath, e.getenv)
	if err != nil {
		return err
	}
	if err := needRateKey(cfg, jobType, rateKey); err != nil {
		return err
	}
	enq, err := app.NewEnqueuer(ctx, cfg)
	if err != nil {
		return err
	}
	defer enq.Close()
	enq.RateKey = rateKey
	res, err := enq.EnqueueJob(ctx, jobType, []byte(payload), tier)
	if err != nil {
		return err
	}
	where := "queue " + res.Queue
	if res.Tier != "" {
		where = "tier " + res.Tier + ", " + where
	}
	fmt.Fprintf(e.stdout, "job %s: %s (%s, id %s)\n", jobType, app.OutcomeText(res.Outcome), where, res.ID)
	return nil
}

// needRateKey refuses an enqueue without -rate-key into the pool of
// jobType when that pool limits enqueues per caller (enqueue_rate_per_key):
// the engine applies that limit only to a request that names its caller,
// so without this check leaving the flag out would escape the limit. A
// job type no pool runs is left to the enqueue's own error.
func needRateKey(cfg *app.Config, jobType, rateKey string) error {
	if rateKey != "" {
		return nil
	}
	for _, p := range cfg.Engine.Pools {
		if slices.Contains(p.JobTypes, jobType) && p.EnqueueRatePerKey != nil {
			return cli.Usagef("pool %q limits enqueues per caller (enqueue_rate_per_key): name the caller with -rate-key KEY (a requester, a tenant); nothing was enqueued", p.Name)
		}
	}
	return nil
}

func cmdStatus(ctx context.Context, e env, configPath string, args []string) error {
	var asJSON bool
	_, err := subFlags(e, "status", "usage: enqueue status [-json]", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print JSON for scripts")
	})
	if err != nil {
		return err
	}
	enq, done, err := setupForReading(ctx, e, "status", configPath)
	if err != nil {
		return err
	}
	defer done()
	st, err := enq.Status(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, st)
	}
	printStatus(e.stdout, st)
	printScheduleStatus(e.stdout, st.Schedules)
	return nil
}
