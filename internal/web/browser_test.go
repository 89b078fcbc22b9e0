package web_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/internal/web"
	"github.com/lci-labs/compartment/queues"
)

// ScreenshotEnv names a path where the browser test also writes its
// screenshot of the dashboard (docs/dashboard.png, on the README and in
// docs/OBSERVABILITY.md, is made this way).
const ScreenshotEnv = "DASHBOARD_SCREENSHOT"

// browser finds a Chromium or Chrome, or skips the test saying how to get
// one.
func browser(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no headless browser: install Debian's chromium (apt-get install -y chromium) to run the dashboard test; .ci/run does")
	return ""
}

// The dashboard in a real headless browser during a month-end run: the
// numbers it shows after refreshing itself equal /api/status, the
// dependency's and the adaptive limit's included; the adaptive pool's
// timeline shows an operator's resize and reset; pause without the token
// is refused and changes nothing; with the token the batch pool is paused
// in Redis (asynq's pause key), and resumed.
//
// Every pool uses reports-db (capacity 20), and batch is adaptive (size 2,
// max_size 4, min 1): an operator's resize to 2 before the worker starts
// holds it at 2, so that the reports released below do not let the limit
// start more of them, and puts the resize in the limit's timeline.
func TestDashboardInBrowser(t *testing.T) {
	exe := browser(t)
	s := newStackWith(t, func(path string) {
		apptest.ReplaceInConfig(t, path, "database:\n", "dependencies: [{name: reports-db, capacity: 20}]\ndatabase:\n")
		apptest.ReplaceInConfig(t, path, "[order:create]\n", "[order:create]\n    uses: {reports-db: 1}\n")
		apptest.ReplaceInConfig(t, path, "[search:index]\n", "[search:index]\n    uses: {reports-db: 1}\n")
		// The door and the breaker, as newStack's batch pool has them; a
		// short adaptive window, so the limit has decided on the released
		// reports well before the page is read.
		apptest.ReplaceInConfig(t, path, "    max_retry: 2\n", "    max_retry: 2\n    max_backlog: 100\n    tier_limits: {adhoc: 10}\n    breaker: {min_calls: 50, window: 1m}\n"+
			"    max_size: 4\n    uses: {reports-db: 1}\n    adaptive: {min: 1, window: 200ms}\n")
	}, func(cfg *app.Config) { cfg.HTTP.Listen, cfg.HTTP.Token = "127.0.0.1:0", testToken })
	require.NoError(t, s.enq.Client.Resize(context.Background(), "batch", 2))
	s.start()
	broken := s.brokenReport()
	res := s.monthEnd()
	require.Len(t, res.Jobs, 10)
	testwait.For(t, 30*time.Second, "the batch pool to fill (2 reports held)", func() bool { return s.held.Load() == 2 })
	// Ad-hoc reports until the door refuses one (its adhoc limit is 10;
	// the worker took up to its max_size 4 of the month-end's jobs from
	// the queues, 2 running and the rest ahead of a slot): the page must
	// show the refusal.
	refused := false
	for _, period := range []string{"2026-01", "2026-02", "2026-03", "2026-04", "2026-05", "2026-06", "2026-07", "2026-08"} {
		_, _, err := s.enq.EnqueueReport(context.Background(), "refunds-analysis", period, "adhoc")
		if errors.Is(err, queues.ErrBacklogFull) {
			refused = true
			break
		}
		require.NoError(t, err)
	}
	require.True(t, refused, "the door refused an ad-hoc report")

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.WindowSize(1280, 1100))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, actions...), what)
	}
	poll := func(expr string) chromedp.Action[chromedp.Void] {
		return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			_, err := chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(20*time.Second))(ctx, tg)
			return chromedp.Void{}, err
		}
	}
	// click clicks the first node that matches sel. The page swaps its
	// live part every refresh; when the swap lands between the query and
	// the click, the browser no longer knows the node and says so before
	// any mouse event is sent, so clicking the new node is safe and what a
	// user's pointer would have done.
	click := func(sel string) chromedp.Action[chromedp.Void] {
		return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			var err error
			for range 5 {
				if _, err = chromedp.Click(chromedp.CSS(sel))(ctx, tg); err == nil || !isStaleNode(err) {
					break
				}
			}
			return chromedp.Void{}, err
		}
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, "read %s", sel)
		return v
	}
	refreshes := func() int {
		a, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS("#refreshes"), "data-n"))
		require.NoError(t, err)
		v, _ := strconv.Atoi(a.Value)
		return v
	}
	// settled waits for two refreshes that started after the state froze.
	settled := func() {
		n := refreshes()
		run("wait for two refreshes", poll(fmt.Sprintf(`+document.getElementById("refreshes").dataset.n >= %d`, n+2)))
	}

	run("load the dashboard", chromedp.Navigate(s.url+"/"), chromedp.WaitVisible(chromedp.CSS("#pool-batch")))

	// Let four reports finish, then freeze again (two more held).
	for range 4 {
		s.releaseOne()
	}
	testwait.For(t, 30*time.Second, "four reports done and two more held", func() bool { return s.held.Load() == 6 })
	settled()

	shown, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](
		`Object.fromEntries([...document.querySelectorAll("[data-k]")].map(e => [e.dataset.k, e.dataset.v ?? e.textContent.trim()]))`))
	require.NoError(t, err, "read the numbers on the page")
	code, body := s.get("/api/status")
	require.Equal(t, 200, code)
	var st app.Status
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	checked := 0
	eq := func(key string, want int) {
		t.Helper()
		got, ok := shown[key]
		require.True(t, ok, "the page shows %s", key)
		require.Equal(t, strconv.Itoa(want), got, "%s: page vs /api/status", key)
		checked++
	}
	for _, p := range st.Pools {
		eq(p.Name+"/active", p.Active)
		eq(p.Name+"/capacity", p.Capacity)
		eq(p.Name+"/available", p.Available)
		eq(p.Name+"/workers", p.Workers)
		for _, q := range p.Queues {
			k := p.Name + "/" + q.Tier
			if q.Tier == "" {
				k = p.Name + "/-"
			}
			eq(k+"/pending", q.Pending)
			eq(k+"/active", q.Active)
			eq(k+"/forslot", q.WaitingForSlot)
			eq(k+"/scheduled", q.Scheduled)
			eq(k+"/retry", q.Retry)
			eq(k+"/archived", q.Archived)
			eq(k+"/completed", q.Completed)
			oldest, err := strconv.ParseFloat(shown[k+"/oldest"], 64)
			require.NoError(t, err)
			require.InDelta(t, q.OldestPendingSeconds, oldest, 5, "%s oldest wait: the page read it a moment earlier", k)
			if p.Name == "batch" {
				eq("progress/"+q.Tier+"/done", q.Completed)
				eq("progress/"+q.Tier+"/total", q.Pending+q.Active+q.WaitingForSlot+q.Scheduled+q.Retry+q.Archived+q.Completed)
				eq("progress/"+q.Tier+"/running", q.Active)
				eq("progress/"+q.Tier+"/forslot", q.WaitingForSlot)
			}
		}
	}
	for _, p := range st.Pools {
		if p.Breaker != nil {
			b := *p.Breaker
			require.Equal(t, string(b.State), shown[p.Name+"/breaker/state"], "breaker state: page vs /api/status")
			eq(p.Name+"/breaker/window-calls", b.WindowCalls)
			eq(p.Name+"/breaker/window-failures", b.WindowFailures)
			eq(p.Name+"/breaker/window-slow", b.WindowSlow)
			eq(p.Name+"/breaker/calls", b.Calls)
			eq(p.Name+"/breaker/failures", b.Failures)
			eq(p.Name+"/breaker/slow", b.Slow)
			require.Equal(t, b.Why, shown[p.Name+"/breaker/why"])
		}
		if p.MaxBacklog == 0 && len(p.Rates) == 0 {
			_, ok := shown[p.Name+"/door/backlog"]
			require.False(t, ok, "pool %s has no door, and the page shows none", p.Name)
			continue
		}
		eq(p.Name+"/door/backlog", p.Backlog)
		eq(p.Name+"/door/max", p.MaxBacklog)
		eq(p.Name+"/door/waiting", int(p.WaitingForRoom))
		for _, q := range p.Queues {
			eq(p.Name+"/door/"+q.Tier+"/limit", q.BacklogLimit)
			eq(p.Name+"/door/"+q.Tier+"/refused-backlog", int(q.Refused["backlog"]))
			eq(p.Name+"/door/"+q.Tier+"/refused-rate", int(q.Refused["rate"]))
		}
	}
	// The dependencies: capacity, claims and use, in all and per pool.
	require.NotEmpty(t, st.Dependencies)
	for _, d := range st.Dependencies {
		eq("dep/"+d.Name+"/capacity", d.Capacity)
		eq("dep/"+d.Name+"/claimed", d.Claimed)
		eq("dep/"+d.Name+"/in-use", d.InUse)
		for _, u := range d.Pools {
			eq("dep/"+d.Name+"/"+u.Pool+"/units", u.Units)
			eq("dep/"+d.Name+"/"+u.Pool+"/claimed", u.Claimed)
			eq("dep/"+d.Name+"/"+u.Pool+"/in-use", u.InUse)
		}
	}
	// The adaptive limits, and each one's timeline: its newest changes,
	// in the order of /api/status's log.
	adaptive := 0
	for _, p := range st.Pools {
		if p.Adaptive == nil {
			_, ok := shown[p.Name+"/adaptive/limit"]
			require.False(t, ok, "pool %s is not adaptive, and the page shows no limit", p.Name)
			continue
		}
		adaptive++
		a := p.Adaptive
		eq(p.Name+"/adaptive/limit", a.Limit)
		eq(p.Name+"/adaptive/min", a.Min)
		eq(p.Name+"/adaptive/max", a.Max)
		eq(p.Name+"/adaptive/changes", int(a.Changes))
		require.Equal(t, a.Reason, shown[p.Name+"/adaptive/reason"], "pool %s: the limit's last reason", p.Name)
		reasons, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
			`[...document.querySelectorAll("#adaptive-`+p.Name+` tr.change .creason")].map(e => e.textContent)`))
		require.NoError(t, err, "read pool %s's timeline", p.Name)
		var want []string
		for _, c := range a.Log[:min(len(a.Log), web.MaxAdaptiveChanges)] {
			want = append(want, c.Reason)
		}
		require.Equal(t, want, reasons, "pool %s: the timeline shows the log's newest changes, newest first", p.Name)
	}
	require.Equal(t, 1, adaptive, "the batch pool is adaptive")
	batch := st.Pools[2]
	require.Equal(t, "batch", batch.Name)
	require.Equal(t, app.DependencyStatus{Name: "reports-db", Capacity: 20, Claimed: 3 + 2 + 4, InUse: 2, Pools: []app.DependencyUse{
		{Pool: "order", Units: 1, Claimed: 3}, {Pool: "search", Units: 1, Claimed: 2},
		{Pool: "batch", Units: 1, Claimed: 4, InUse: 2}, // adaptive: it claims its max_size; its two held reports hold one each
	}}, st.Dependencies[0])
	require.True(t, batch.Resized, "the operator's size holds the batch pool at 2")
	require.Equal(t, 2, batch.EffectiveSize)
	require.Contains(t, shown, "batch/adaptive/held", "the page says the operator's size holds the limit off")
	require.Contains(t, text("#adaptive-batch"), "an operator resized the pool", "the operator's resize is in the batch pool's timeline")
	require.NotNil(t, batch.Breaker, "the batch pool has a breaker, shown on the page")
	require.Equal(t, "closed", shown["batch/breaker/state"])
	require.Equal(t, "1", shown["batch/door/adhoc/refused-backlog"], "the refusal shows on the page")
	require.Equal(t, 2, batch.Active)
	require.True(t, batch.IsFull)
	done := 0
	for _, q := range batch.Queues {
		done += q.Completed
	}
	require.Equal(t, 4, done, "the four released reports show as done")
	// The Runs section: the month-end is a run; its row shows its state
	// and each tier's ended / total as the run's record has them.
	require.NotEmpty(t, res.Run, "the month-end is a run")
	info, err := s.enq.Client.Run(context.Background(), res.Run)
	require.NoError(t, err)
	require.Equal(t, queues.RunRunning, info.State)
	require.Equal(t, info.State, shown["run/"+res.Run+"/state"], "run state: page vs Client.Run")
	tiersShown := 0
	for k := range shown {
		if strings.HasPrefix(k, "run/"+res.Run+"/") && strings.HasSuffix(k, "/total") {
			tiersShown++
		}
	}
	require.Equal(t, len(info.Tiers), tiersShown, "one entry per tier of the run")
	for _, tr := range info.Tiers {
		eq("run/"+res.Run+"/"+cmp.Or(tr.Tier, "-")+"/ended", tr.Ended())
		eq("run/"+res.Run+"/"+cmp.Or(tr.Tier, "-")+"/total", tr.Total())
	}
	require.Equal(t, 10, info.Total())
	require.Equal(t, queues.RunCounts{Succeeded: 4, Running: 2, Queued: 4}, info.RunCounts, "four released, two held, four to go")
	t.Logf("the page showed %d numbers, each equal to /api/status or the run's record", checked)
	// The recent failures list the broken report with its reason.
	require.Contains(t, text(`tr.failure[data-id="`+broken+`"] .reason`), "malformed payload")

	// The timeline: each pool has its charts, drawn from /api/history; the
	// last point drawn of each line is the newest sample's.
	run("wait for the timeline", poll(`+(document.getElementById("charts").dataset.samples || 0) >= 3`))
	drawn, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](
		`(() => { const c = document.getElementById("charts"); const out = {last: c.dataset.last};
		  c.querySelectorAll("svg[data-chart] path[data-series]").forEach(p => { out[p.closest("svg").dataset.chart + "|" + p.dataset.series] = p.dataset.last; });
		  return out; })()`))
	require.NoError(t, err, "read the timeline")
	code, body = s.get("/api/history")
	require.Equal(t, 200, code)
	var hist struct {
		Samples []web.Sample `json:"samples"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &hist))
	var drawnAt *web.Sample
	for i := range hist.Samples {
		if strconv.FormatInt(hist.Samples[i].At, 10) == drawn["last"] {
			drawnAt = &hist.Samples[i]
		}
	}
	require.NotNil(t, drawnAt, "the sample the page drew last is in /api/history (%s)", drawn["last"])
	for _, p := range drawnAt.Pools {
		require.Equal(t, strconv.FormatInt(p.Running, 10), drawn[p.Pool+"/slots|running"], "pool %s: running drawn", p.Pool)
		require.Equal(t, strconv.FormatInt(p.Size, 10), drawn[p.Pool+"/slots|size"], "pool %s: size drawn", p.Pool)
		require.Equal(t, strconv.FormatInt(p.ForSlot, 10), drawn[p.Pool+"/slots|waiting for slot"], "pool %s: waiting for slot drawn", p.Pool)
		_, ok := drawn[p.Pool+"/done|done/s"]
		require.True(t, ok, "pool %s: jobs done per second drawn", p.Pool)
	}
	require.Equal(t, "2", drawn["batch/slots|running"], "the batch pool's two held reports are drawn running")
	require.Equal(t, "2", drawn["batch/slots|size"])

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err, "screenshot")
	require.NoError(t, os.WriteFile(filepath.Join(t.TempDir(), "dashboard.png"), png, 0o644))
	if path := os.Getenv(ScreenshotEnv); path != "" {
		require.NoError(t, os.WriteFile(path, png, 0o644))
		t.Logf("screenshot written to %s", path)
	}

	// Pause without the token: refused, nothing changes.
	before := s.pausedKeys()
	pause := `#pool-batch button[data-action="pause"]`
	run("click pause without the token", click(pause), poll(`document.getElementById("msg").textContent !== ""`))
	require.Equal(t, "refused: missing or wrong token", text("#msg"))
	require.False(t, s.operatorPaused(), "a refused request pauses nothing")
	require.Equal(t, before, s.pausedKeys(), "a refused request changes nothing")

	// With the token: paused in Redis, and the page says so.
	run("click pause with the token", chromedp.SendKeys(chromedp.CSS("#token"), testToken),
		click(pause), poll(`document.getElementById("msg").textContent.includes("paused")`))
	require.Equal(t, `pool "batch" paused`, text("#msg"))
	require.True(t, s.operatorPaused(), "every batch queue has asynq's pause key, set by an operator: %q", s.pausedKeys())
	run("the page shows the pause", chromedp.WaitVisible(chromedp.CSS(`#pool-batch [data-k="batch/paused"]`)))

	// The breaker, forced open from the page with the token, then reset.
	clearMsg := chromedp.Evaluate[bool](`(() => { const m = document.getElementById("msg"); m.textContent = ""; m.className = ""; return true; })()`)
	_, err = chromedp.Run(ctx, clearMsg)
	require.NoError(t, err)
	run("click force open", click(`#breaker-batch button[data-op="open"]`),
		poll(`document.getElementById("msg").textContent !== ""`))
	require.Equal(t, "ok", func() string {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("msg").className`))
		require.NoError(t, err)
		return v
	}(), "forcing the breaker open was accepted: %s", text("#msg"))
	b, err := s.enq.Client.Breaker(context.Background(), "batch")
	require.NoError(t, err)
	require.Equal(t, queues.BreakerOpen, b.State, "the page forced the breaker open: %s", text("#msg"))
	require.Equal(t, queues.BreakerOpen, b.Forced)
	run("the page shows it open", chromedp.WaitVisible(chromedp.CSS(`#breaker-batch [data-k="batch/breaker/forced"]`)),
		poll(`document.querySelector('[data-k="batch/breaker/state"]').textContent === "open"`))
	run("click reset", click(`#breaker-batch button[data-op="reset"]`),
		poll(`document.querySelector('[data-k="batch/breaker/state"]') && document.querySelector('[data-k="batch/breaker/state"]').textContent === "closed"`))
	b, err = s.enq.Client.Breaker(context.Background(), "batch")
	require.NoError(t, err)
	require.Equal(t, queues.BreakerClosed, b.State)
	require.Empty(t, b.Forced)

	// Resume from the page.
	run("click resume", click(`#pool-batch button[data-action="resume"]`),
		poll(`document.getElementById("msg").textContent.includes("resumed")`))
	require.False(t, s.operatorPaused())
	for _, v := range s.pausedKeys() {
		require.True(t, v == "" || v == "compartment-gate", "only the gate's own pauses may remain: %q", v)
	}

	// Cancel the month-end's run from its row, with the token: its two
	// held reports are told to stop (they are held, so it is cancelling),
	// and the row shows it, without its cancel button.
	_, err = chromedp.Run(ctx, clearMsg)
	require.NoError(t, err)
	row := `tr.run[data-id="` + res.Run + `"]`
	run("click cancel", click(row+` button[data-action="cancel-run"]`),
		poll(`document.getElementById("msg").textContent !== ""`))
	require.Contains(t, text("#msg"), `run "`+res.Run+`" cancelled`)
	info, err = s.enq.Client.Run(context.Background(), res.Run)
	require.NoError(t, err)
	require.Equal(t, queues.RunCancelling, info.State, "the page cancelled the run: %s", text("#msg"))
	run("the page shows it cancelling", poll(`document.querySelector('[data-k="run/`+res.Run+`/state"]').textContent === "cancelling"`),
		poll(`document.querySelector('`+row+` button[data-action="cancel-run"]') === null`))

	// The operator gives the batch pool back to its adaptive limit: the
	// timeline shows the reset, newest, and the limit is no longer held off.
	require.NoError(t, s.enq.Client.ResetSize(context.Background(), "batch"))
	run("the page shows the reset", poll(`(() => { const r = document.querySelector("#adaptive-batch tr.change"); return r !== null && r.textContent.includes("an operator reset the size"); })()`),
		poll(`document.querySelector('[data-k="batch/adaptive/held"]') === null`))
	require.Equal(t, "reset", text("#adaptive-batch tr.change .move"))
}

// isStaleNode reports whether err says the browser no longer has the node a
// query found (the page replaced it in between).
func isStaleNode(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Could not find node with given id") || strings.Contains(msg, "Node is detached")
}
