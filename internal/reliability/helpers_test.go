package reliability

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lci-labs/compartment/internal/testleak"
	"github.com/lci-labs/compartment/internal/testwait"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
)

// bins holds the binaries built once for the package.
var bins struct {
	dir                            string
	worker, enqueue, clusterworker string
	traceworker                    string
}

// parallelDefault is how many of this package's tests run at once unless
// -parallel says otherwise. go test's default is GOMAXPROCS (2 on a 2-core
// CI machine), but these tests spend most of their time waiting on timers
// (asynq's one-minute recoverer and 30 s job leases, the gate's 15 s slot
// leases, a 30 s Redis outage), not on the CPU: run side by side, the
// package takes about as long as its longest test instead of their sum.
// Each test says why it does or does not call t.Parallel: the one whose
// measure CPU taken by other tests would change (utilization) does not.
const parallelDefault = 16

func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", fmt.Sprint(parallelDefault))
	}
	if testing.Short() { // every test here skips: build nothing
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "reliability-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..")
	build := exec.Command("go", "build", "-o", dir+"/", "./cmd/worker", "./cmd/enqueue", "./internal/reliability/clusterworker", "./internal/reliability/traceworker")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build binaries: %v\n%s", err, out)
		os.Exit(1)
	}
	bins.dir, bins.worker, bins.enqueue = dir, filepath.Join(dir, "worker"), filepath.Join(dir, "enqueue")
	bins.clusterworker = filepath.Join(dir, "clusterworker")
	bins.traceworker = filepath.Join(dir, "traceworker")
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(testleak.Options()...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// skipShort skips t under -short, saying what it is and how to run it.
// Every test here skips: most take from 10 s to over a minute, and even
// the short ones need the three binaries built (10-20 s) and a
// redis-server; `go test -short ./...` is the repository's quick subset.
func skipShort(t *testing.T, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("skipped under -short: %s; run it with: go test -race -run '^%s$' ./internal/reliability/",
			what, strings.SplitN(t.Name(), "/", 2)[0])
	}
}

// every returns cond checked at most once per d (false in between), for
// waits whose condition is expensive: testwait.For polls every 5 ms, and
// listing every job in Redis that often takes CPU from the processes under
// test, and from the tests running beside this one.
func every(d time.Duration, cond func() bool) func() bool {
	var last time.Time
	return func() bool {
		if time.Since(last) < d {
			return false
		}
		last = time.Now()
		return cond()
	}
}

// ownRedis is a redis-server the test starts on a free port, keeping its
// data in a dump file so it can be stopped and started again.
type ownRedis struct {
	t      *testing.T
	port   int
	dir    string
	extra  []string // more redis-server arguments
	cmd    *exec.Cmd
	Client *redis.Client
	URL    string
}

// handedOut are the ports freePort returned in this test binary: the
// kernel may hand a port just closed to the next caller, and two tests
// running in parallel then start their servers on the same port (one
// fails to bind, and the other's answers for both).
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePort returns a loopback TCP port that was free a moment ago and
// that no other test of this binary was given.
func freePort(t *testing.T) int {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		handedOut.Lock()
		taken := handedOut.ports[port]
		handedOut.ports[port] = true
		handedOut.Unlock()
		if !taken {
			return port
		}
	}
}

// startRedis starts a redis-server on a free port; extra are more
// arguments (such as --replicaof).
func startRedis(t *testing.T, extra ...string) *ownRedis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (.ci/run installs it); these tests need a Redis they can stop")
	}
	r := &ownRedis{t: t, dir: t.TempDir(), extra: extra}
	t.Cleanup(func() {
		if r.Client != nil {
			_ = r.Client.Close()
		}
		if r.cmd != nil {
			_ = r.cmd.Process.Kill()
			_ = r.cmd.Wait()
		}
	})
	// A server of another test binary may take the port between
	// freePort and the start: then another port.
	for attempt := 1; ; attempt++ {
		r.port = freePort(t)
		if r.launch() {
			break
		}
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
		if attempt == 5 {
			t.Fatalf("another server answered at each of 5 free ports, the last %d", r.port)
		}
	}
	r.URL = fmt.Sprintf("redis://127.0.0.1:%d/1", r.port)
	r.Client = redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port), DB: 1})
	return r
}

// start starts the server again on its port (after stop or a kill).
func (r *ownRedis) start() {
	r.t.Helper()
	if !r.launch() {
		r.t.Fatalf("another server answers at 127.0.0.1:%d, where this test's Redis was", r.port)
	}
}

// launch starts redis-server on r.port and says whether the server that
// answers there is this one (testredis.Launch).
func (r *ownRedis) launch() bool {
	r.t.Helper()
	var ours bool
	r.cmd, ours = testredis.Launch(r.t, r.port, append([]string{"--dir", r.dir, "--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no"}, r.extra...)...)
	return ours
}

// stop saves the data and stops the server, as a planned outage would.
func (r *ownRedis) stop() {
	r.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port)})
	_ = c.ShutdownSave(context.Background()).Err() // the connection drops as it stops
	c.Close()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// testRedis wraps the server for apptest.Config.
func (r *ownRedis) testRedis() *testredis.Redis {
	opts, _ := redis.ParseURL(r.URL)
	return &testredis.Redis{Client: r.Client, Options: opts, URL: r.URL}
}

// config writes a config for the processes, applying replacements
// (old, new pairs) to apptest's.
func config(t *testing.T, r *ownRedis, replace ...string) (path, namespace string) {
	t.Helper()
	path = apptest.Config(t, r.testRedis(), "")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	body := string(data)
	for i := 0; i+1 < len(replace); i += 2 {
		if !strings.Contains(body, replace[i]) {
			t.Fatalf("config has no %q to replace", replace[i])
		}
		body = strings.Replace(body, replace[i], replace[i+1], 1)
	}
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "namespace: "); ok {
			namespace = v
		}
	}
	return path, namespace
}

// proc is a running binary.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	out    apptest.SyncBuffer
	done   chan struct{}
	code   int
	waited bool
}

func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	return startEnv(t, nil, bin, args...)
}

// startEnv is start with env (KEY=value) added to the environment.
func startEnv(t *testing.T, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.Env = append(append(os.Environ(), "REDIS_URL=", "DATABASE_URL="), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		err := p.cmd.Wait()
		p.code = 0
		if ee, ok := err.(*exec.ExitError); ok {
			p.code = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.code = -int(ws.Signal())
			}
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("output of %s:\n%s", filepath.Base(bin), p.out.String())
		}
	})
	return p
}

// startWorker starts a worker on cfg (whose Redis is r) and waits until it
// serves: its three pools' servers are registered in Redis.
func startWorker(t *testing.T, r *ownRedis, cfg string) *proc {
	t.Helper()
	p := start(t, bins.worker, "-config", cfg)
	p.waitServing(r, 3, 60*time.Second)
	return p
}

// waitServing waits until the process has servers asynq servers
// registered in r: asynq writes them once a server has started, so they are
// the process's readiness signal, read from Redis and not from its log.
func (p *proc) waitServing(r *ownRedis, servers int, timeout time.Duration) {
	p.t.Helper()
	p.waitServingOn(r.Client, servers, timeout)
}

// waitServingOn is waitServing on any Redis client (a Redis Cluster's).
func (p *proc) waitServingOn(rdb redis.UniversalClient, servers int, timeout time.Duration) {
	p.t.Helper()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	testwait.For(p.t, timeout, fmt.Sprintf("process %d to register %d servers", p.cmd.Process.Pid, servers), func() bool {
		select {
		case <-p.done:
			p.t.Fatalf("process exited (%d) before serving; output:\n%s", p.code, p.out.String())
		default:
		}
		all, err := insp.Servers()
		if err != nil {
			return false
		}
		n := 0
		for _, s := range all {
			if s.PID == p.cmd.Process.Pid {
				n++
			}
		}
		return n >= servers
	})
}

func (p *proc) waitLog(substr string, timeout time.Duration) {
	p.t.Helper()
	testwait.For(p.t, timeout, fmt.Sprintf("%q in the output", substr), func() bool {
		return strings.Contains(p.out.String(), substr)
	})
}

func (p *proc) signal(sig os.Signal) {
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal: %v", err)
	}
}

// wait returns the exit code (negative: killed by that signal).
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.t.Fatalf("process did not exit within %s; output:\n%s", timeout, p.out.String())
		return 0
	}
}

// cpuSeconds is the process's user+system CPU time so far.
func (p *proc) cpuSeconds() float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		p.t.Fatal(err)
	}
	// Fields after the command name, which is in parentheses.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	var utime, stime float64
	fmt.Sscan(fields[11], &utime)
	fmt.Sscan(fields[12], &stime)
	return (utime + stime) / 100 // clock ticks; 100 per second on Linux
}

func enqueue(t *testing.T, cfg string, args ...string) (int, string) {
	t.Helper()
	p := start(t, bins.enqueue, append([]string{"-config", cfg}, args...)...)
	code := p.wait(60 * time.Second)
	return code, p.out.String()
}

// jobStates returns the state of every task in the namespace's queues.
// jobStates returns the state of every report job of namespace (a run's
// completion step, whose ID starts with "run:", is left out: allJobStates
// has it).
func jobStates(t *testing.T, rdb redis.UniversalClient, namespace string) map[string]*asynq.TaskInfo {
	t.Helper()
	out := allJobStates(t, rdb, namespace)
	for id := range out {
		if strings.HasPrefix(id, "run:") {
			delete(out, id)
		}
	}
	return out
}

// withoutManifests leaves out of a report directory's entries the month-end
// manifests the bundle (a run's completion step) writes.
func withoutManifests(entries []os.DirEntry) []os.DirEntry {
	var out []os.DirEntry
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "month-end_") {
			out = append(out, e)
		}
	}
	return out
}

// allJobStates returns the state of every job of namespace.
func allJobStates(t *testing.T, rdb redis.UniversalClient, namespace string) map[string]*asynq.TaskInfo {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	qs, err := insp.Queues()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*asynq.TaskInfo{}
	for _, q := range qs {
		if !strings.HasPrefix(q, namespace+":") {
			continue
		}
		for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
			insp.ListPendingTasks, insp.ListActiveTasks, insp.ListScheduledTasks, insp.ListRetryTasks,
			insp.ListArchivedTasks, insp.ListCompletedTasks,
		} {
			tasks, err := list(q, asynq.PageSize(10000))
			if err != nil {
				t.Fatal(err)
			}
			for _, ti := range tasks {
				out[ti.ID] = ti
			}
		}
	}
	return out
}

func countStates(states map[string]*asynq.TaskInfo) map[asynq.TaskState]int {
	out := map[asynq.TaskState]int{}
	for _, ti := range states {
		out[ti.State]++
	}
	return out
}
