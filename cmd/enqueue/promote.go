package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/cli"
)

const promoteHelp = `usage: enqueue promote -name REPORT -period YYYY-MM -tier TIER [-json]

Moves a waiting report (queued, scheduled, or waiting for a retry) to
another tier, in one step: it keeps its job ID and goes to the end of that
tier's queue. A report already running or done is left alone (exit 0); a
report that is not queued is an error (exit 2).`

// cmdPromote moves a waiting report to another tier. The report, period
// and tier are checked against the config before Redis is touched.
func cmdPromote(ctx context.Context, e env, configPath string, args []string) error {
	var name, period, tier string
	var asJSON bool
	_, err := subFlags(e, "promote", promoteHelp, args, func(fs *flag.FlagSet) {
		fs.StringVar(&name, "name", "", "report `name` from the catalog (required)")
		fs.StringVar(&period, "period", "", "month, `YYYY-MM` (required)")
		fs.StringVar(&tier, "tier", "", "the priority `tier` to move it to (required)")
		fs.BoolVar(&asJSON, "json", false, "print JSON for scripts")
	})
	if err != nil {
		return err
	}
	if name == "" || period == "" || tier == "" {
		return cli.Usagef("-name, -period and -tier are required")
	}
	cfg, err := app.Load(configPath, e.getenv)
	if err != nil {
		return err
	}
	if err := cfg.CheckPromote(name, period, tier); err != nil {
		return err // before connecting to Redis
	}
	enq, err := app.NewEnqueuer(ctx, cfg)
	if err != nil {
		return err
	}
	defer enq.Close()
	res, err := enq.PromoteReport(ctx, name, period, tier)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, res)
	}
	fmt.Fprintln(e.stdout, app.PromoteText(res))
	return nil
}
