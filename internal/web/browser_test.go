package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/testwait"
)

// ScreenshotEnv names a path where the browser test also writes its
// screenshot of the dashboard (the README's is made this way).
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
// numbers it shows after refreshing itself equal /api/status; pause
// without the token is refused and changes nothing; with the token the
// batch pool is paused in Redis (asynq's pause key), and resumed.
func TestDashboardInBrowser(t *testing.T) {
	exe := browser(t)
	s := newStack(t, testToken)
	s.start()
	broken := s.brokenReport()
	res := s.monthEnd()
	require.Len(t, res.Jobs, 10)
	testwait.For(t, 30*time.Second, "the batch pool to fill (2 reports held)", func() bool { return s.held.Load() == 2 })

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
	batch := st.Pools[2]
	require.Equal(t, "batch", batch.Name)
	require.Equal(t, 2, batch.Active)
	require.True(t, batch.IsFull)
	done := 0
	for _, q := range batch.Queues {
		done += q.Completed
	}
	require.Equal(t, 4, done, "the four released reports show as done")
	t.Logf("the page showed %d numbers, each equal to /api/status", checked)
	// The recent failures list the broken report with its reason.
	require.Contains(t, text(`tr.failure[data-id="`+broken+`"] .reason`), "malformed payload")

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err, "screenshot")
	require.NoError(t, os.WriteFile(filepath.Join(t.TempDir(), "dashboard.png"), png, 0o644))
	if path := os.Getenv(ScreenshotEnv); path != "" {
		require.NoError(t, os.WriteFile(path, png, 0o644))
		t.Logf("screenshot written to %s", path)
	}

	// Pause without the token: refused, nothing changes.
	before := s.pausedKeys()
	pause := chromedp.CSS(`#pool-batch button[data-action="pause"]`)
	run("click pause without the token", chromedp.Click(pause), poll(`document.getElementById("msg").textContent !== ""`))
	require.Equal(t, "refused: missing or wrong token", text("#msg"))
	require.False(t, s.operatorPaused(), "a refused request pauses nothing")
	require.Equal(t, before, s.pausedKeys(), "a refused request changes nothing")

	// With the token: paused in Redis, and the page says so.
	run("click pause with the token", chromedp.SendKeys(chromedp.CSS("#token"), testToken),
		chromedp.Click(pause), poll(`document.getElementById("msg").textContent.includes("paused")`))
	require.Equal(t, `pool "batch" paused`, text("#msg"))
	require.True(t, s.operatorPaused(), "every batch queue has asynq's pause key, set by an operator: %q", s.pausedKeys())
	run("the page shows the pause", chromedp.WaitVisible(chromedp.CSS(`#pool-batch [data-k="batch/paused"]`)))

	// Resume from the page.
	run("click resume", chromedp.Click(chromedp.CSS(`#pool-batch button[data-action="resume"]`)),
		poll(`document.getElementById("msg").textContent.includes("resumed")`))
	require.False(t, s.operatorPaused())
	for _, v := range s.pausedKeys() {
		require.True(t, v == "" || v == "compartment-gate", "only the gate's own pauses may remain: %q", v)
	}
}
