package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/queues"
)

const breakerHelp = `usage: enqueue breaker -pool POOL [open|close|reset] [-json]

Shows a pool's circuit breaker, or changes it in every worker process:
  open   open it now: no worker takes the pool's jobs (they wait in their
         queues) until close or reset
  close  close it now and keep it from tripping until reset
  reset  close it and count afresh (cool-down backoff cleared)`

// cmdBreaker shows or changes a pool's circuit breaker. The pool and the
// action are checked against the config before Redis is touched.
func cmdBreaker(ctx context.Context, e env, configPath string, args []string) error {
	var pool string
	var asJSON bool
	define := func(fs *flag.FlagSet) {
		fs.StringVar(&pool, "pool", "", "the `pool` whose breaker to show or change (required)")
		fs.BoolVar(&asJSON, "json", false, "print JSON for scripts")
	}
	// The action may come before or after the flags.
	action := ""
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		action, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("breaker", flag.ContinueOnError)
	define(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cli.Usage(e.stdout, fs, breakerHelp)
		}
		return err
	}
	rest := fs.Args()
	if action == "" && len(rest) > 0 {
		action, rest = rest[0], rest[1:]
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %s", cli.Quote(rest[0]))
	}
	if action != "" && !slices.Contains(queues.BreakerActions, queues.BreakerAction(action)) {
		return cli.Usagef("breaker: the action must be open, close or reset, got %s", cli.Quote(action))
	}
	if pool == "" {
		return cli.Usagef("-pool is required")
	}
	// Showing the breaker only reads; forcing it changes every worker.
	var cfg *app.Config
	var err error
	if action == "" {
		cfg, err = loadForReading(e, "breaker", configPath)
	} else {
		cfg, err = app.Load(configPath, e.getenv)
	}
	if err != nil {
		return err
	}
	var names, withBreaker []string
	for _, p := range cfg.Engine.Pools {
		names = append(names, p.Name)
		if p.Breaker != nil {
			withBreaker = append(withBreaker, p.Name)
		}
	}
	switch {
	case !slices.Contains(names, pool):
		return cli.Usagef("unknown pool %s (pools: %q)", cli.Quote(pool), names)
	case !slices.Contains(withBreaker, pool):
		return cli.Usagef("pool %q has no circuit breaker (add breaker: to it in %s; pools with one: %q)", pool, configPath, withBreaker)
	}
	enq, err := app.NewEnqueuer(ctx, cfg)
	if err != nil {
		return err
	}
	defer enq.Close()
	var st queues.BreakerState
	if action == "" {
		st, err = enq.Client.Breaker(ctx, pool)
	} else {
		st, err = enq.Client.ForceBreaker(ctx, pool, queues.BreakerAction(action))
	}
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, st)
	}
	fmt.Fprintf(e.stdout, "breaker of pool %s: %s\n", pool, describeBreaker(st))
	return nil
}

// describeBreaker says a breaker's state in one line.
func describeBreaker(b queues.BreakerState) string {
	s := string(b.State)
	if b.Forced != "" {
		s += " (forced " + string(b.Forced) + " until reset)"
	}
	if !b.Since.IsZero() {
		s += " since " + b.Since.UTC().Format("2006-01-02 15:04:05.000") + " UTC"
	}
	if b.Why != "" {
		s += ": " + b.Why
	}
	if !b.ReopensAt.IsZero() {
		s += "; probes from " + b.ReopensAt.UTC().Format("15:04:05.000") + " UTC"
	}
	return s + fmt.Sprintf("; window now: %d calls, %d failed, %d slow", b.WindowCalls, b.WindowFailures, b.WindowSlow)
}
