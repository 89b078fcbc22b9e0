package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/queues"
)

// runMemory builds cmd/worker, runs it as its own process, and reads its
// resident set idle, with a 10,000-job backlog waiting, and at its peak
// while draining that backlog.
func runMemory(ctx context.Context, o *Options) (*Table, error) {
	n := o.n(10000, 1000)
	settle := 2 * time.Second // for the resident set to follow what the worker just did
	if o.Smoke {
		settle = 500 * time.Millisecond
	}
	ns, clean := namespace(o, "mem")
	defer clean()
	bin := filepath.Join(o.TempDir, "worker")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/worker")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build cmd/worker (run the bench from the repository root): %v\n%s", err, out)
	}
	cfgPath := filepath.Join(o.TempDir, "memory.yaml")
	wd, _ := os.Getwd()
	cfg := fmt.Sprintf(`redis:
  url: %q
namespace: %s
priorities: %s
reports: %s
output_dir: %s
database:
  sqlite_path: %s
  seed_orders: 2000
pools:
  - {name: order, size: 8, job_types: [order:create], poll_interval: 100ms}
  - {name: search, size: 8, job_types: [search:index], poll_interval: 200ms}
  - {name: batch, size: 4, job_types: [report:run], tiers: [regulatory, close, management, adhoc]}
`, o.RedisURL, ns, filepath.Join(wd, "configs/priorities.yaml"), filepath.Join(wd, "configs/reports.yaml"),
		filepath.Join(o.TempDir, "mem-out"), filepath.Join(o.TempDir, "mem.db"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "-config", cfgPath, "-log-level", "warn")
	cmd.Env = append(os.Environ(), "REDIS_URL=", "DATABASE_URL=")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := false
	defer func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	go func() { // drain the log so the worker never blocks on it
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
		}
	}()

	insp := asynq.NewInspectorFromRedisClient(o.Redis)
	orderQ := queues.QueueName(ns, "order", "")
	// Started: its servers show up in Redis.
	if err := waitUntil(ctx, 30*time.Second, func() bool {
		servers, _ := insp.Servers()
		for _, s := range servers {
			if s.PID == cmd.Process.Pid {
				return true
			}
		}
		return false
	}); err != nil {
		return nil, fmt.Errorf("worker did not start: %w", err)
	}
	time.Sleep(settle)
	idle, err := rss(cmd.Process.Pid)
	if err != nil {
		return nil, err
	}

	// The backlog waits in a paused queue (ours alone: this run's namespace).
	payload := []byte(`{"region":"north","category":"books","customer_id":1,"amount_cents":100}`)
	if err := insp.PauseQueue(orderQ); err != nil {
		return nil, err
	}
	c := asynq.NewClientFromRedisClient(o.Redis)
	for range n {
		if _, err := c.EnqueueContext(ctx, asynq.NewTask(handlers.TypeOrder, payload), asynq.Queue(orderQ)); err != nil {
			c.Close()
			return nil, err
		}
	}
	c.Close()
	time.Sleep(settle)
	backlog, err := rss(cmd.Process.Pid)
	if err != nil {
		return nil, err
	}

	if err := insp.UnpauseQueue(orderQ); err != nil {
		return nil, err
	}
	peak := backlog
	start := time.Now()
	if err := waitUntil(ctx, 5*time.Minute, func() bool {
		if r, err := rss(cmd.Process.Pid); err == nil {
			peak = max(peak, r)
		}
		info, err := insp.GetQueueInfo(orderQ)
		return err == nil && info.Pending == 0 && info.Active == 0
	}); err != nil {
		return nil, err
	}
	drain := time.Since(start)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	exit := cmd.Wait()
	exited = true
	t := &Table{Header: []string{"worker state", "resident memory"}}
	t.row("idle (3 pools, SQLite)", mib(idle))
	t.row(fmt.Sprintf("%d-job backlog waiting in Redis", n), mib(backlog))
	t.row(fmt.Sprintf("peak while draining it (%s)", drain.Round(100*time.Millisecond)), mib(peak))
	t.note("backlog / idle: %s; peak / idle: %s", ratio(float64(backlog), float64(idle)), ratio(float64(peak), float64(idle)))
	if exit != nil {
		t.note("the worker's exit after SIGTERM: %v", exit)
	}
	return t, nil
}

func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// rss reads a process's resident set in bytes from /proc.
func rss(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
