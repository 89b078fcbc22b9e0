package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/testdb"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/queues"
)

// walkStep is one line of the walk-through (docs/WALKTHROUGH.md) and what
// it must do.
type walkStep struct {
	line string // as in the walk-through, without its comment
	// before, when set, waits for what a person sees happen before they
	// type the line (the worker finishing the reports).
	before func(t *testing.T)
	// want are regular expressions the line's stdout must match.
	want []string
	// check, when set, checks what the line claims through status -json
	// (the status table's layout is not this test's subject).
	check func(t *testing.T, st app.Status)
}

// TestWalkThrough runs the walk-through of docs/WALKTHROUGH.md ("Running a
// worker and enqueuing reports") as written, in a directory holding a copy
// of configs/ (so the default -config and the plan's path resolve as in
// the repository), against the test Redis, with the worker running in this
// process. Each line must do what the page says it does; the page's lines
// must be exactly the steps below, so a change to either shows here.
func TestWalkThrough(t *testing.T) {
	// No t.Parallel: it changes the working directory.
	r := testredis.New(t)
	dir := t.TempDir()
	namespace := r.Namespace(t)
	copyConfigs(t, filepath.Join(dir, "configs"), namespace)
	t.Chdir(dir)
	env := map[string]string{"REDIS_URL": r.URL}
	if db := testdb.Config(t); db.URL != "" {
		env["DATABASE_URL"] = db.URL
	}
	getenv := func(k string) string { return env[k] }

	cfg, err := app.Load(app.DefaultConfigPath, getenv) // what bin/worker reads
	require.NoError(t, err)
	starts := &startOrder{}
	w, err := app.NewWorker(context.Background(), cfg, app.WorkerOptions{Logger: slog.New(slog.DiscardHandler), Observer: starts})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	require.NoError(t, w.Start(context.Background()))
	orders := func() int {
		var n int
		require.NoError(t, w.DB.SQL().QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&n))
		return n
	}
	seeded := orders()

	enq := func(t *testing.T, args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		code := run(context.Background(), cli.Env{Args: args, Stdout: &out, Stderr: &errOut, Getenv: getenv})
		require.Equal(t, 0, code, "enqueue %s: %s", strings.Join(args, " "), errOut.String())
		return out.String()
	}
	status := func(t *testing.T) app.Status {
		var st app.Status
		require.NoError(t, json.Unmarshal([]byte(enq(t, "status", "-json")), &st))
		require.Equal(t, "batch", st.Pools[2].Name)
		return st
	}
	// byTier counts the batch pool's reports per tier: pending, completed,
	// and whether each tier's queue is paused.
	byTier := func(st app.Status) (pending, completed map[string]int, paused map[string]bool) {
		pending, completed, paused = map[string]int{}, map[string]int{}, map[string]bool{}
		for _, q := range st.Pools[2].Queues {
			pending[q.Tier], completed[q.Tier], paused[q.Tier] = q.Pending, q.Completed, q.Paused
		}
		return pending, completed, paused
	}
	tiers := func(regulatory, close, management, adhoc int) map[string]int {
		return map[string]int{"regulatory": regulatory, "close": close, "management": management, "adhoc": adhoc}
	}
	ns := regexp.QuoteMeta(namespace)
	steps := []walkStep{
		{line: "report -name vat-return -period 2026-09",
			want: []string{`^report vat-return for 2026-09: enqueued \(tier regulatory, queue ` + ns + `:batch:regulatory, id report:vat-return:2026-09\)\n$`}},
		{line: "breaker -pool batch open",
			before: func(t *testing.T) {
				testwait.For(t, 30*time.Second, "the worker to write out/reports/vat-return_2026-09.csv", func() bool {
					_, err := os.Stat(filepath.Join(dir, "out/reports/vat-return_2026-09.csv"))
					return err == nil
				})
			},
			want: []string{`^breaker of pool batch: open \(forced open until reset\) since .*: forced open by an operator;`}},
		{line: "month-end -plan configs/month-end.yaml -period 2026-10",
			want: []string{`^month-end plan of 10 reports: 10 new reports enqueued \(in `,
				`regulatory  2    0               0\nclose       3    0               0\nmanagement  3    0               0\nadhoc       2    0               0\n`}},
		{line: "status",
			want: []string{ns + `:batch:regulatory`, ns + `:batch:adhoc`},
			check: func(t *testing.T, st app.Status) {
				pending, completed, paused := byTier(st)
				require.Equal(t, tiers(2, 3, 3, 2), pending, "the 10 reports wait, each in its tier")
				require.Equal(t, tiers(1, 0, 0, 0), completed)
				require.Equal(t, map[string]bool{"regulatory": true, "close": true, "management": true, "adhoc": true}, paused)
				require.Equal(t, queues.BreakerOpen, st.Pools[2].Breaker.State)
				require.Equal(t, queues.BreakerOpen, st.Pools[2].Breaker.Forced)
				require.Equal(t, []int{2, 2, 4}, []int{st.Pools[2].Size, st.Pools[2].EffectiveSize, st.Pools[2].MaxSize})
			}},
		{line: "promote -name customer-cohorts -period 2026-10 -tier regulatory",
			want: []string{`^report customer-cohorts for 2026-10: moved from tier adhoc to regulatory, at the end of its queue \(queue ` + ns + `:batch:regulatory, id report:customer-cohorts:2026-10\)\n$`}},
		{line: "resize -pool batch -size 4",
			want: []string{`^pool batch: size 4 in every worker process \(was 2; configured 2, max 4\)\n$`}},
		{line: "breaker -pool batch reset",
			want: []string{`^breaker of pool batch: closed since .*: reset by an operator;`}},
		{line: "job -type order:create -example",
			want: []string{`^order:create: records an order`, `\n  customer_id   integer  the customer's number, >= 1\n`}},
		{line: `job -type order:create -payload '{"region":"north","category":"books","customer_id":7,"amount_cents":1299}'`,
			want: []string{`^job order:create: enqueued \(queue ` + ns + `:order, id \S+\)\n$`}},
		{line: "status",
			before: func(t *testing.T) {
				// 11 reports, then the month-end's completion step
				// (report:bundle, in the regulatory tier) once.
				testwait.For(t, 60*time.Second, "the 11 reports and the month-end's bundle to complete", func() bool {
					_, completed, _ := byTier(status(t))
					return completed["regulatory"]+completed["close"]+completed["management"]+completed["adhoc"] == 12
				})
				testwait.For(t, 30*time.Second, "the order pool to write the order", func() bool { return orders() == seeded+1 })
			},
			want: []string{ns + `:batch:regulatory`, ns + `:batch:adhoc`},
			check: func(t *testing.T, st app.Status) {
				pending, completed, paused := byTier(st)
				require.Equal(t, tiers(0, 0, 0, 0), pending)
				require.Equal(t, tiers(5, 3, 3, 1), completed, "customer-cohorts ran in the regulatory tier, and so did the bundle")
				require.Equal(t, map[string]bool{"regulatory": false, "close": false, "management": false, "adhoc": false}, paused)
				require.Equal(t, queues.BreakerClosed, st.Pools[2].Breaker.State)
				require.Equal(t, []int{2, 4, 4}, []int{st.Pools[2].Size, st.Pools[2].EffectiveSize, st.Pools[2].MaxSize})
				require.True(t, st.Pools[2].Resized)
			}},
		{line: "runs",
			want: []string{`\nmonth-end-2026-10-[0-9a-f]{8} +month-end +2026-10 +succeeded +10/10 +0 `}},
		{line: "resize -pool batch -reset",
			want: []string{`^pool batch: size 2 in every worker process \(was 4; configured 2, max 4\)\n$`}},
	}

	lines := walkThroughLines(t)
	var want []string
	for _, s := range steps {
		want = append(want, "bin/enqueue "+s.line)
	}
	require.Equal(t, want, lines, "the walk-through in docs/WALKTHROUGH.md and this test's steps must be the same lines")

	for i, s := range steps {
		if s.before != nil {
			s.before(t)
		}
		out := enq(t, shellWords(t, s.line)...)
		for _, re := range s.want {
			require.Regexp(t, regexp.MustCompile(re), out, "step %d: enqueue %s", i+1, s.line)
		}
		if s.check != nil {
			s.check(t, status(t))
		}
	}
	for _, name := range []string{"vat-return_2026-10.csv", "customer-cohorts_2026-10.csv", "refunds-analysis_2026-10.csv", "month-end_2026-10.json"} {
		require.FileExists(t, filepath.Join(dir, "out/reports", name))
	}
	// Each report ran in its tier, the promoted one in regulatory; the
	// regulatory reports started before the ad-hoc one (the promoted report
	// was behind it before the promote). Within the first four slots the
	// start callbacks may come in any order, so only that is checked.
	var started []string
	bundles := 0
	for _, s := range starts.batch() {
		if strings.Contains(s, " run:month-end-2026-10-") && strings.HasSuffix(s, ":on_complete") {
			bundles++ // the month-end's completion step, after its reports
			continue
		}
		started = append(started, s)
	}
	require.Equal(t, 1, bundles, "the month-end's bundle ran once: %q", starts.batch())
	require.Len(t, started, 11, "each report started once: %q", started)
	tierOf := map[string]string{}
	at := map[string]int{}
	for i, s := range started {
		tier, id, _ := strings.Cut(s, " ")
		tierOf[id], at[id] = tier, i
	}
	require.Equal(t, map[string]string{
		"report:vat-return:2026-09": "regulatory",
		"report:vat-return:2026-10": "regulatory", "report:withholding-tax:2026-10": "regulatory", "report:customer-cohorts:2026-10": "regulatory",
		"report:trial-balance:2026-10": "close", "report:ar-aging:2026-10": "close", "report:ap-aging:2026-10": "close",
		"report:revenue-by-region:2026-10": "management", "report:revenue-by-category:2026-10": "management", "report:top-customers:2026-10": "management",
		"report:refunds-analysis:2026-10": "adhoc",
	}, tierOf, "each report started once, in its tier: %q", started)
	for _, id := range []string{"report:vat-return:2026-10", "report:withholding-tax:2026-10", "report:customer-cohorts:2026-10"} {
		require.Less(t, at[id], at["report:refunds-analysis:2026-10"], "%s started before the ad-hoc report: %q", id, started)
	}
}

// startOrder records the batch pool's job starts, in order.
type startOrder struct {
	mu     sync.Mutex
	starts []string
}

func (o *startOrder) JobStarted(s queues.JobStart) {
	if s.Pool != "batch" {
		return
	}
	o.mu.Lock()
	o.starts = append(o.starts, s.Tier+" "+s.JobID)
	o.mu.Unlock()
}

func (o *startOrder) JobFinished(queues.JobEnd) {}

func (o *startOrder) batch() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.starts...)
}

// copyConfigs copies the repository's configs/ to dir, giving worker.yaml
// the test's Redis namespace and a small demo dataset (300 orders up to
// October 2026) so the worker starts quickly.
func copyConfigs(t *testing.T, dir, namespace string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, name := range []string{"worker.yaml", "priorities.yaml", "reports.yaml", "month-end.yaml"} {
		data, err := os.ReadFile(apptest.RepoPath("configs/" + name))
		require.NoError(t, err)
		if name == "worker.yaml" {
			body := string(data)
			require.Contains(t, body, "  max_connections: 20\n")
			body = strings.Replace(body, "  max_connections: 20\n", "  max_connections: 20\n  seed_orders: 300\n  seed_months: 4\n  seed_until: \"2026-11\"\n", 1)
			data = []byte(body + "\nnamespace: " + namespace + "\n")
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
	}
}

// walkThroughPage is the page that holds the walk-through.
const walkThroughPage = "docs/WALKTHROUGH.md"

// walkThroughLines returns the enqueue lines of the first sh block of the
// section "Running a worker and enqueuing reports" of walkThroughPage,
// without their comments, after checking that the block builds the
// commands and starts the worker on its default config.
func walkThroughLines(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(apptest.RepoPath(walkThroughPage))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(data), "\n## Running a worker and enqueuing reports\n")
	require.True(t, ok, "%s has the section", walkThroughPage)
	_, block, ok := strings.Cut(section, "```sh\n")
	require.True(t, ok)
	block, _, ok = strings.Cut(block, "```")
	require.True(t, ok)
	var enqueue, other []string
	for _, line := range strings.Split(block, "\n") {
		line = strings.TrimSpace(withoutComment(line))
		switch {
		case line == "":
		case strings.HasPrefix(line, "bin/enqueue "):
			enqueue = append(enqueue, line)
		default:
			other = append(other, line)
		}
	}
	require.Equal(t, []string{"go build -o bin/ ./cmd/...", "bin/worker"}, other, "the block builds the commands, then starts the worker on its default config")
	return enqueue
}

// withoutComment cuts a shell line at a # that starts a comment (outside
// single quotes, after a space).
func withoutComment(line string) string {
	quoted := false
	for i, c := range line {
		switch {
		case c == '\'':
			quoted = !quoted
		case c == '#' && !quoted && (i == 0 || line[i-1] == ' '):
			return line[:i]
		}
	}
	return line
}

// shellWords splits a shell line into its words: spaces separate them,
// single quotes keep what they enclose as it is. That is all the
// walk-through's lines use.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var word strings.Builder
	inWord, quoted := false, false
	for _, c := range line {
		switch {
		case c == '\'':
			quoted, inWord = !quoted, true
		case c == ' ' && !quoted:
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(c)
			inWord = true
		}
	}
	require.False(t, quoted, "unbalanced quote in %q", line)
	if inWord {
		words = append(words, word.String())
	}
	return words
}
