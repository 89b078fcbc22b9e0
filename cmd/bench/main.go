// Command bench measures the runner beside its peers on one Redis, in one
// run, and prints tables with ratios (see docs/BENCHMARKS.md for a recorded
// run).
//
//	bench [-redis-url redis://127.0.0.1:6379/15] [-smoke] [-scale 1] [-sections isolation,overhead]
//
// Run it from the repository root (the memory section builds cmd/worker).
// It uses its own queue names and deletes them afterwards; it never uses
// Redis DB 0 unless told to with -allow-db0. Exit codes: 0 when it ran (a
// missed target is printed, not an error); 1 when it could not run; 2 for
// a bad flag.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/internal/bench"
	"github.com/lci-labs/compartment/internal/cli"
)

func main() { cli.Main(run) }

func run(ctx context.Context, env cli.Env) int {
	args, stdout, stderr, getenv := env.Args, env.Stdout, env.Stderr, env.Getenv
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	defURL := getenv("BENCH_REDIS_URL")
	if defURL == "" {
		defURL = "redis://127.0.0.1:6379/15"
	}
	url := fs.String("redis-url", defURL, "Redis to measure on (`URL`; BENCH_REDIS_URL sets the default)")
	allowDB0 := fs.Bool("allow-db0", false, "allow Redis DB 0")
	clusterAddrs := fs.String("redis-cluster-addrs", getenv("BENCH_REDIS_CLUSTER_ADDRS"), "also run the overhead section on this Redis Cluster (`host:port,...`, seed nodes; BENCH_REDIS_CLUSTER_ADDRS sets the default), beside -redis-url")
	smoke := fs.Bool("smoke", false, "tiny run, about 20 s: checks that every section runs; judges only the targets that hold at any scale")
	scale := fs.Float64("scale", 1, "multiply job counts and durations (2 = longer, steadier run)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (every setup's workers share this process) to `FILE`, for go tool pprof")
	sections := fs.String("sections", "", "comma-separated sections to run (default all): isolation,overhead,pickup,enqueue,priority,memory,door,breaker,steering,clustercap,adaptive,growth")
	if code, ok := cli.Parse(fs, args, stdout, stderr, "usage: bench [flags]\n"); !ok {
		return code
	}
	if *scale <= 0 {
		fmt.Fprintln(stderr, "bench: -scale must be > 0")
		return cli.ExitUsage
	}
	var names []string
	if *sections != "" {
		known := map[string]bool{}
		for _, s := range bench.Sections() {
			known[s.Name] = true
		}
		for _, n := range strings.Split(*sections, ",") {
			if !known[n] {
				fmt.Fprintf(stderr, "bench: unknown section %q\n", n)
				return cli.ExitUsage
			}
			names = append(names, n)
		}
	}
	opts, err := redis.ParseURL(*url)
	if err != nil {
		fmt.Fprintf(stderr, "bench: -redis-url: %v\n", err)
		return cli.ExitUsage
	}
	if opts.DB == 0 && !*allowDB0 {
		fmt.Fprintln(stderr, "bench: refusing Redis DB 0 (pass -allow-db0, or pick a DB like redis://host:6379/15)")
		return cli.ExitUsage
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		fmt.Fprintf(stderr, "bench: redis at %s is unreachable: %v\n", opts.Addr, err)
		return cli.ExitFailure
	}
	var cluster redis.UniversalClient
	if *clusterAddrs != "" {
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(*clusterAddrs, ",")})
		defer cc.Close()
		if err := cc.Ping(pctx).Err(); err != nil {
			fmt.Fprintf(stderr, "bench: redis cluster at %s is unreachable: %v\n", *clusterAddrs, err)
			return cli.ExitFailure
		}
		cluster = cc
		fmt.Fprintf(stdout, "# overhead section also on the Redis Cluster at %s\n", *clusterAddrs)
	}
	tmp, err := os.MkdirTemp("", "compartment-bench-")
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return cli.ExitFailure
	}
	defer os.RemoveAll(tmp)

	mode := fmt.Sprintf("full run, scale %.2g", *scale)
	if *smoke {
		mode = "smoke run: each section at a tiny scale, to check that it runs; targets that need a full run are not judged"
	}
	fmt.Fprintf(stdout, "# compartment bench (%s) on Redis %s DB %d, %s\n", mode, opts.Addr, opts.DB, time.Now().UTC().Format(time.RFC3339))
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "bench: -cpuprofile:", err)
			return cli.ExitFailure
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, "bench: -cpuprofile:", err)
			return cli.ExitFailure
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	missed, err := bench.Run(ctx, bench.Options{
		Redis: rdb, Cluster: cluster, RedisURL: *url, Out: stdout, Smoke: *smoke, Scale: *scale, TempDir: tmp, Sections: names,
	})
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return cli.ExitFailure
	}
	judged := ""
	if *smoke {
		judged = " (smoke run: every section ran; the targets that need a full run were not judged)"
	}
	fmt.Fprintf(stdout, "\nfinished in %s%s; targets missed: %d\n", time.Since(start).Round(time.Second), judged, len(missed))
	for _, m := range missed {
		fmt.Fprintln(stdout, "  -", m)
	}
	return cli.ExitOK
}
