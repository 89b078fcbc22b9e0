package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/testwait"
	"github.com/lci-labs/compartment/internal/web"
	"github.com/lci-labs/compartment/queues"
)

// runReports are the reports of the tests' run, by tier: the batch pool
// (size 2) runs the two regulatory ones first.
var runReports = []struct{ name, tier string }{
	{"vat-return", "regulatory"}, {"withholding-tax", "regulatory"},
	{"trial-balance", "close"}, {"ar-aging", "close"}, {"ap-aging", "close"},
}

// startRun enqueues runReports for 2026-10 as run id.
func (s *stack) startRun(id string) {
	s.t.Helper()
	reqs := make([]queues.Request, len(runReports))
	for i, r := range runReports {
		req, err := handlers.Report.Request(handlers.ReportPayload{Report: r.name, Period: "2026-10"},
			queues.EnqueueOptions{Tier: r.tier, ID: handlers.ReportJobID(r.name, "2026-10")})
		require.NoError(s.t, err)
		reqs[i] = req
	}
	_, res, err := s.enq.Client.EnqueueRun(context.Background(), queues.RunOptions{ID: id, Kind: "month-end", Period: "2026-10"}, reqs)
	require.NoError(s.t, err)
	for _, r := range res {
		require.Equal(s.t, queues.Enqueued, r.Outcome)
	}
}

// apiRuns reads GET /api/runs.
func (s *stack) apiRuns() []web.APIRun {
	s.t.Helper()
	code, body := s.get("/api/runs")
	require.Equal(s.t, http.StatusOK, code, body)
	var got web.APIRuns
	require.NoError(s.t, json.Unmarshal([]byte(body), &got))
	require.NotNil(s.t, got.Runs, "an empty list is [], not null")
	return got.Runs
}

func (s *stack) apiRun(id string) web.APIRun {
	s.t.Helper()
	for _, r := range s.apiRuns() {
		if r.ID == id {
			return r
		}
	}
	s.t.Fatalf("/api/runs does not list run %s", id)
	return web.APIRun{}
}

func (s *stack) run(id string) queues.RunInfo {
	s.t.Helper()
	info, err := s.enq.Client.Run(context.Background(), id)
	require.NoError(s.t, err)
	return info
}

func cancelAnswer(t *testing.T, body string) web.RunCancelAnswer {
	t.Helper()
	var a web.RunCancelAnswer
	require.NoError(t, json.Unmarshal([]byte(body), &a), body)
	return a
}

// A month-end run as /api/runs and the page show it, its counts those the
// run's record holds and what the worker did: two regulatory reports
// done, two close ones running, one queued. Cancel needs the token, like
// the other actions; with it the run is cancelled (its queued job taken
// out, its running ones told to stop); an unknown run is 404, a run that
// ended is 200 and nothing changes.
func TestRuns(t *testing.T) {
	t.Parallel()
	s := newStack(t, testToken)
	require.Empty(t, s.apiRuns(), "no run yet")
	const id = "month-end-2026-10-web"
	s.startRun(id)

	got := s.apiRun(id)
	require.Equal(t, queues.RunRunning, got.State)
	require.Equal(t, "month-end", got.Kind)
	require.Equal(t, "2026-10", got.Period)
	require.Equal(t, queues.RunCounts{Queued: 5}, got.RunCounts)
	require.Equal(t, []queues.RunTier{
		{Tier: "regulatory", RunCounts: queues.RunCounts{Queued: 2}},
		{Tier: "close", RunCounts: queues.RunCounts{Queued: 3}},
	}, got.Tiers)
	require.Nil(t, got.ETASeconds, "no ETA before a job has ended")

	// Two regulatory reports done, two close ones held running.
	s.start()
	testwait.For(t, 30*time.Second, "the batch pool to fill (2 reports held)", func() bool { return s.held.Load() == 2 })
	s.releaseOne()
	s.releaseOne()
	testwait.For(t, 30*time.Second, "two reports done and two more held", func() bool {
		info := s.run(id)
		return s.held.Load() == 4 && info.Succeeded == 2 && info.Running == 2
	})
	want := []queues.RunTier{
		{Tier: "regulatory", RunCounts: queues.RunCounts{Succeeded: 2}},
		{Tier: "close", RunCounts: queues.RunCounts{Running: 2, Queued: 1}},
	}
	got = s.apiRun(id)
	info := s.run(id)
	require.Equal(t, queues.RunRunning, got.State)
	require.Equal(t, info.RunCounts, got.RunCounts, "/api/runs says what the run's record says")
	require.Equal(t, queues.RunCounts{Succeeded: 2, Running: 2, Queued: 1}, got.RunCounts)
	require.Equal(t, want, got.Tiers)
	require.Equal(t, info.Tiers, got.Tiers)
	require.NotNil(t, got.ETASeconds, "two jobs ended: the pace is known")

	// The page: one row, each tier's ended / total, and a cancel button.
	_, page := s.get("/")
	row := runRow(t, page, id)
	for _, want := range []string{
		`data-k="run/` + id + `/state">running<`,
		`data-k="run/` + id + `/regulatory/ended">2<`, `data-k="run/` + id + `/regulatory/total">2<`,
		`data-k="run/` + id + `/close/ended">0<`, `data-k="run/` + id + `/close/total">3<`,
		`data-action="cancel-run" data-id="` + id + `"`,
		"month-end <b>2026-10</b>",
	} {
		require.Contains(t, row, want)
	}

	t.Run("refused without the token, as the other actions", func(t *testing.T) {
		pauseCode, pauseBody := s.post("/actions/pause", url.Values{"pool": {"batch"}}, "")
		for _, token := range []string{"", "wrong-token-0123456789"} {
			code, body := s.post("/actions/cancel-run", url.Values{"id": {id}}, token)
			require.Equal(t, http.StatusUnauthorized, code)
			require.Equal(t, pauseCode, code)
			require.Equal(t, pauseBody, body)
		}
		code, _ := s.post("/actions/cancel-run", url.Values{"id": {id}, "token": {"wrong-token-0123456789"}}, "")
		require.Equal(t, http.StatusUnauthorized, code)
		after := s.run(id)
		require.Equal(t, queues.RunRunning, after.State, "nothing changed")
		require.True(t, after.CancelledAt.IsZero(), "nothing changed")
		require.Equal(t, info.RunCounts, after.RunCounts, "nothing changed")
	})

	t.Run("unknown or missing ID", func(t *testing.T) {
		code, body := s.post("/actions/cancel-run", url.Values{"id": {"nope"}}, testToken)
		require.Equal(t, http.StatusNotFound, code, body)
		a := cancelAnswer(t, body)
		require.Equal(t, `no run "nope": a wrong ID, or a run that ended more than 7 days ago (its record is kept that long)`, a.Error)
		require.Empty(t, a.Outcome)
		code, body = s.post("/actions/cancel-run", url.Values{}, testToken)
		require.Equal(t, http.StatusBadRequest, code, body)
		require.Equal(t, "form field id: the ID of the run to cancel is required", cancelAnswer(t, body).Error)
		require.Equal(t, queues.RunRunning, s.run(id).State, "nothing changed")
	})

	t.Run("cancel with the token", func(t *testing.T) {
		code, body := s.post("/actions/cancel-run", url.Values{"id": {id}}, testToken)
		require.Equal(t, http.StatusOK, code, body)
		a := cancelAnswer(t, body)
		require.Equal(t, "cancelled", a.Outcome)
		// The queued close report is taken out of its queue, unless a
		// worker took it ahead of a free slot (the look-ahead): it is
		// then refused at its start.
		require.Contains(t, []int{0, 1}, a.Removed, "the queued close report")
		require.Equal(t, 2, a.Running, "the two held reports were told to stop")
		t.Logf("cancel: %s", a.Message)
		require.Equal(t, fmt.Sprintf(`run "%s" cancelled (queued jobs taken out of their queues: %d, running jobs told to stop: 2)`, id, a.Removed), a.Message)
		require.Equal(t, queues.RunCancelling, s.run(id).State, "its two reports are still held")
		row := runRow(t, s.page(), id)
		require.Contains(t, row, `data-k="run/`+id+`/state">cancelling<`)
		require.NotContains(t, row, `data-action="cancel-run"`, "no cancel button for a run being cancelled")

		s.releaseAll()
		testwait.For(t, 30*time.Second, "the run to end", func() bool { return s.run(id).Finished() })
		ended := s.run(id)
		require.Equal(t, queues.RunCancelled, ended.State)
		require.Equal(t, 5, ended.Total())
		require.Equal(t, 5, ended.Ended())
		require.Equal(t, 2, ended.Tiers[0].Succeeded, "the regulatory reports had succeeded before")

		code, body = s.post("/actions/cancel-run", url.Values{"id": {id}}, testToken)
		require.Equal(t, http.StatusOK, code, body)
		a = cancelAnswer(t, body)
		require.Equal(t, "ended", a.Outcome)
		require.Contains(t, a.Message, "had ended")
		require.Contains(t, a.Message, "nothing changed")
		require.Equal(t, ended.EndedAt.UnixMilli(), a.EndedAt.UnixMilli())
		again := s.run(id)
		require.Equal(t, ended.State, again.State, "nothing changed")
		require.Equal(t, ended.RunCounts, again.RunCounts, "nothing changed")
		require.Equal(t, ended.EndedAt, again.EndedAt, "nothing changed")
		require.Nil(t, s.apiRun(id).ETASeconds, "no ETA once ended")
	})
}

// Everything a run's record holds is text from Redis: the page escapes it
// (html/template), /api/runs encodes it. An open run (no job yet) can be
// cancelled; on a read-only worker its button is there and refused.
func TestRunsEscaped(t *testing.T) {
	t.Parallel()
	s := newStack(t, "")
	const id = "open-run.1:x"
	kind, period := `<script>alert("kind")</script>`, `2026-10"><img src=x onerror=alert(1)>`
	_, err := s.enq.Client.StartRun(context.Background(), queues.RunOptions{ID: id, Kind: kind, Period: period})
	require.NoError(t, err)
	got := s.apiRun(id)
	require.Equal(t, kind, got.Kind)
	require.Equal(t, period, got.Period)
	require.Equal(t, queues.RunOpen, got.State)
	require.Equal(t, []queues.RunTier{}, got.Tiers)

	page := s.page()
	require.NotContains(t, page, "<script>alert")
	require.NotContains(t, page, "<img src=x")
	row := runRow(t, page, id)
	require.Contains(t, row, "&lt;script&gt;alert(&#34;kind&#34;)&lt;/script&gt;")
	require.Contains(t, row, "2026-10&#34;&gt;&lt;img src=x onerror=alert(1)&gt;")
	require.Contains(t, row, "no jobs yet")
	require.Contains(t, row, `data-action="cancel-run" data-id="`+id+`" title="read-only: this request will be refused"`)
	code, body := s.post("/actions/cancel-run", url.Values{"id": {id}}, testToken)
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, "refused: this worker is read-only (no http.token_file in its config)", body)
	require.Equal(t, queues.RunOpen, s.run(id).State, "nothing changed")
}

func (s *stack) page() string {
	s.t.Helper()
	code, page := s.get("/")
	require.Equal(s.t, http.StatusOK, code)
	return page
}

// runRow returns the page's row of run id.
func runRow(t *testing.T, page, id string) string {
	t.Helper()
	start := strings.Index(page, `<tr class="run" data-id="`+id+`">`)
	require.GreaterOrEqual(t, start, 0, "the page has a row for run %s", id)
	end := strings.Index(page[start:], "</tr>")
	require.Greater(t, end, 0)
	return page[start : start+end]
}
