package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/queues"
)

const resizeHelp = `usage: enqueue resize -pool POOL (-size N | -reset) [-json]

Changes a cluster-scoped pool's size in every worker process at once, until
-reset gives it back its configured size. Running jobs are not touched: when
the pool shrinks, no new job starts until fewer than N run. N is from 1 to
the pool's max_size (see docs/STEERING.md).`

// cmdResize sets or resets a cluster-scoped pool's size in Redis.
func cmdResize(ctx context.Context, e env, configPath string, args []string) error {
	var pool string
	var size int
	var reset, asJSON bool
	fs, err := subFlags(e, "resize", resizeHelp, args, func(fs *flag.FlagSet) {
		fs.StringVar(&pool, "pool", "", "the `pool` to resize (required; scope: cluster)")
		fs.IntVar(&size, "size", 0, "the pool's new size across every worker process, from 1 to its max_size")
		fs.BoolVar(&reset, "reset", false, "give the pool back its configured size")
		fs.BoolVar(&asJSON, "json", false, "print JSON for scripts")
	})
	if err != nil {
		return err
	}
	sizeSet := false
	fs.Visit(func(f *flag.Flag) { sizeSet = sizeSet || f.Name == "size" })
	switch {
	case pool == "":
		return cli.Usagef("-pool is required")
	case reset == sizeSet:
		return cli.Usagef("give either -size N or -reset")
	}
	enq, closeEnq, err := setup(ctx, e, configPath)
	if err != nil {
		return err
	}
	defer closeEnq()
	if _, err := enq.Client.Pool(pool); err != nil {
		return cli.Usagef("%v", err)
	}
	before, err := enq.Client.PoolSize(ctx, pool)
	if err != nil {
		return err
	}
	if reset {
		err = enq.Client.ResetSize(ctx, pool)
	} else {
		err = enq.Client.Resize(ctx, pool, size)
	}
	if errors.Is(err, queues.ErrInvalidResize) || errors.Is(err, queues.ErrOverBudget) {
		return fmt.Errorf("%w: %w", cli.ErrUsage, err) // nothing was changed
	}
	if err != nil {
		return err
	}
	after, err := enq.Client.PoolSize(ctx, pool)
	if err != nil {
		return err
	}
	// What the live workers can run between them: each runs at most its
	// own max_size of the pool's jobs, which may be less than this
	// config's.
	stats, err := enq.Client.Stats(ctx)
	if err != nil {
		return err
	}
	slots := stats.Slots[pool]
	if asJSON {
		return writeJSON(e.stdout, struct {
			Pool          string          `json:"pool"`
			Before        queues.PoolSize `json:"before"`
			After         queues.PoolSize `json:"after"`
			Workers       int64           `json:"workers"`
			WorkersCanRun int64           `json:"workers_can_run"`
		}{pool, before, after, slots.Processes, slots.Capacity})
	}
	fmt.Fprintf(e.stdout, "pool %s: size %d in every worker process (was %d; configured %d, max %d)\n",
		pool, after.Effective, before.Effective, after.Configured, after.Max)
	if slots.Processes > 0 && int64(after.Effective) > slots.Capacity {
		fmt.Fprintf(e.stdout, "note: the %d worker processes running pool %s now can run %d of its jobs at once between them (each up to its own max_size): the size %d is reached only when more workers start\n",
			slots.Processes, pool, slots.Capacity, after.Effective)
	}
	return nil
}
