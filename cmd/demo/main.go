// Command demo runs the month-end story end to end in one process, on
// embedded defaults: an in-process Redis and an SQLite database seeded with
// demo orders. It runs the same load twice: order and search traffic, then
// a month-end plan of reports in four priority tiers. BEFORE is the story's
// outage: one shared pool (one asynq server for every queue, concurrency
// 20, every job taking connections freely from the same 20), where the
// reports take every slot and connection and orders wait and time out.
// AFTER has the walls: pools order 8, search 8, batch 4, each drawing
// connections only inside its share. A third act, SLOWDOWN, follows on the
// walls: the report database becomes 5x slower, the batch pool's adaptive
// limit falls, and it climbs back to 4 once the database recovers, while
// orders keep flowing. Each phase has a live view counted inside the
// handlers; the summary sets them side by side.
//
//	demo [-config configs/demo.yaml] [-plan configs/month-end.yaml] [-periods 2026-09,2026-10] [-skip-outage] [-skip-slowdown] [-http 127.0.0.1:8089]
//
// While it runs it serves the dashboard and Prometheus metrics (package
// internal/web) on -http or the config's http.listen (configs/demo.yaml:
// 127.0.0.1:8089), and prints the dashboard's URL.
//
// Exit codes: 0 when, with the walls, every report completed, no pool
// exceeded its size and no tier was overtaken; BEFORE reproduced the
// outage (order p99 during the month-end at least demo.OutageP99Ratio times
// its p99 before, or demo.OutageTimeouts orders timed out); and in SLOWDOWN
// the batch pool's limit fell while the database was slow and was back at
// its max_size after it recovered, no job started beyond it, and every
// order and report completed (demo.SlowdownAct.Held); 1 otherwise; 2 for a
// bad flag or config.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/demo"
)

func main() { cli.Main(run) }

func run(ctx context.Context, env cli.Env) int {
	args, stdout, stderr, getenv := env.Args, env.Stdout, env.Stderr, env.Getenv
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	configPath := fs.String("config", "configs/demo.yaml", "config `file`")
	plan := fs.String("plan", "configs/month-end.yaml", "month-end plan `file`")
	periods := fs.String("periods", "", fmt.Sprintf("comma-separated months `YYYY-MM,...` (default: the last %d seeded months)", demo.DefaultPeriods))
	orders := fs.Int("orders-per-sec", demo.DefaultOrdersPerSecond, "order jobs per second, in every phase")
	searches := fs.Int("searches-per-sec", demo.DefaultSearchesPerSecond, "search jobs per second, in every phase")
	warmup := fs.Duration("warmup", demo.DefaultWarmup, "traffic before each phase's month-end starts")
	orderTimeout := fs.Duration("order-timeout", demo.DefaultOrderTimeout, "how long an order request waits before it times out")
	skipOutage := fs.Bool("skip-outage", false, "skip the BEFORE phase (the outage); the exit code then does not cover it")
	skipSlowdown := fs.Bool("skip-slowdown", false, "skip the third act (the database slows); the exit code then does not cover it")
	slowFor := fs.Duration("slow-for", demo.DefaultSlowFor, "in the third act, the report database stays slow at least this long (and until the batch pool's limit has fallen)")
	outageMin := fs.Duration("outage-min", demo.DefaultOutageMin, "the BEFORE phase lasts at least this long, the traffic going on once its reports are done, so the dashboard shows the outage and its end (0: no minimum)")
	logLevel := fs.String("log-level", "warn", "worker log level on stderr: debug, info, warn or error")
	httpAddr := fs.String("http", "", "serve the dashboard and metrics on `host:port` while the demo runs (default: the config's http.listen)")
	help := fmt.Sprintf(`usage: demo [flags]

Runs the month-end story on embedded defaults, twice on the same load:
BEFORE, one shared pool (the outage), then AFTER, with the walls; then
SLOWDOWN, on the walls: the report database %gx slower, then healthy
again. Exits 0 only if the walls held (every report completed, no pool
past its size, no tier overtaken), BEFORE reproduced the outage (order p99
during the month-end at least %.0fx its p99 before, or at least %d order
timed out), and in SLOWDOWN the batch pool's adaptive limit fell and was
back at its most after the recovery, with no job beyond it and no order
lost.
`, demo.SlowdownFactor, demo.OutageP99Ratio, demo.OutageTimeouts)
	if code, ok := cli.Parse(fs, args, stdout, stderr, help); !ok {
		return code
	}
	if *orders < 1 || *searches < 1 || *warmup <= 0 || *orderTimeout <= 0 || *slowFor <= 0 {
		fmt.Fprintln(stderr, "demo: -orders-per-sec and -searches-per-sec must be >= 1, -warmup, -order-timeout and -slow-for > 0")
		return cli.ExitUsage
	}
	if *outageMin < 0 {
		fmt.Fprintln(stderr, "demo: -outage-min must be >= 0")
		return cli.ExitUsage
	}
	if *outageMin == 0 {
		*outageMin = -1 // Options: negative for none (zero is the default)
	}
	if *httpAddr != "" {
		if err := app.CheckListen(*httpAddr); err != nil {
			fmt.Fprintln(stderr, "demo: -http:", err)
			return cli.ExitUsage
		}
	}
	log, err := cli.NewLogger(stderr, "text", *logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return cli.ExitUsage
	}
	cfg, err := app.Load(*configPath, getenv)
	if err != nil {
		fmt.Fprintln(stderr, cli.Message("demo", err))
		return cli.ExitCode(err)
	}
	if *httpAddr != "" {
		cfg.HTTP.Listen = *httpAddr
	}
	var list []string
	if *periods != "" {
		list = strings.Split(*periods, ",")
	}
	summary, err := demo.Run(ctx, demo.Options{
		Config: cfg, Plan: *plan, Periods: list,
		OrdersPerSecond: *orders, SearchesPerSecond: *searches, Warmup: *warmup, OrderTimeout: *orderTimeout,
		SkipOutage: *skipOutage, SkipSlowdown: *skipSlowdown, SlowFor: *slowFor, OutageMin: *outageMin,
		Out: stdout, Terminal: cli.IsTerminal(stdout), Logger: log,
	})
	if err != nil {
		fmt.Fprintln(stderr, cli.Message("demo", err))
		return cli.ExitCode(err)
	}
	return report(stdout, summary)
}

// report prints the summary and returns the exit code it calls for.
func report(stdout io.Writer, s demo.Summary) int {
	s.Print(stdout)
	if !s.OK() {
		fmt.Fprintln(stdout, "\nexit 1: the run did NOT show what it should (see above)")
		return cli.ExitFailure
	}
	fmt.Fprintln(stdout, "\nexit 0: the run showed what it should (see above)")
	return cli.ExitOK
}
