package web

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/lci-labs/compartment/queues"
)

// MaxRuns is how many runs the dashboard and /api/runs list: the most
// recently started ones (queues.Client.Runs).
const MaxRuns = 20

// runView is a run as the dashboard shows it.
type runView struct {
	queues.RunInfo
	// Progress is each tier's ended / total, highest tier first.
	Progress []runTierView
	// ETA is the time left at the pace so far, "…" while it is unknown,
	// "-" once the run has ended.
	ETA string
	// Cancellable: the run is open or running, so the cancel action has
	// something to do.
	Cancellable bool
}

// runTierView is one tier of a run: its jobs that ended (succeeded,
// failed, refused or cancelled) against all of them.
type runTierView struct {
	Tier         string // "-" for jobs of a pool without tiers
	Ended, Total int
	// Detail counts the tier's jobs by state, for the tooltip.
	Detail string
}

// recentRuns reads the MaxRuns most recent runs for the page.
func recentRuns(ctx context.Context, c *queues.Client, now time.Time) ([]runView, error) {
	runs, err := c.Runs(ctx, MaxRuns)
	if err != nil {
		return nil, err
	}
	out := make([]runView, 0, len(runs))
	for _, r := range runs {
		v := runView{RunInfo: r, ETA: "…", Cancellable: r.State == queues.RunOpen || r.State == queues.RunRunning}
		if d, ok := r.ETA(now); ok {
			v.ETA = fmtDur(d)
		} else if r.Finished() {
			v.ETA = "-"
		}
		for _, t := range r.Tiers {
			v.Progress = append(v.Progress, runTierView{Tier: cmp.Or(t.Tier, "-"), Ended: t.Ended(), Total: t.Total(), Detail: countsDetail(t.RunCounts)})
		}
		out = append(out, v)
	}
	return out, nil
}

// countsDetail says a run's counts in words, leaving out the zeros.
func countsDetail(n queues.RunCounts) string {
	var parts []string
	for _, c := range []struct {
		what string
		n    int
	}{{"queued", n.Queued}, {"running", n.Running}, {"succeeded", n.Succeeded}, {"failed", n.Failed}, {"refused", n.Refused}, {"cancelled", n.Cancelled}} {
		if c.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c.n, c.what))
		}
	}
	if parts == nil {
		return "no jobs"
	}
	return strings.Join(parts, ", ")
}

// APIRun is a run as GET /api/runs lists it: the run's record
// (queues.RunInfo, without its failures) and its ETA.
type APIRun struct {
	queues.RunInfo
	// ETASeconds is the time left at the pace so far (RunInfo.ETA);
	// absent while it is unknown and once the run has ended.
	ETASeconds *float64 `json:"eta_seconds,omitempty"`
}

// APIRuns is the answer of GET /api/runs.
type APIRuns struct {
	// Runs are the MaxRuns most recently started runs, newest first.
	Runs []APIRun `json:"runs"`
}

func (s *Server) apiRuns(w http.ResponseWriter, r *http.Request) {
	runs, err := s.o.Enqueuer.Client.Runs(r.Context(), MaxRuns)
	if err != nil {
		s.o.Logger.Error("http: runs", "error", err)
		writeJSON(w, http.StatusServiceUnavailable, apiError{"runs: " + err.Error()})
		return
	}
	now := time.Now()
	out := APIRuns{Runs: make([]APIRun, 0, len(runs))}
	for _, info := range runs {
		a := APIRun{RunInfo: info}
		if a.Tiers == nil {
			a.Tiers = []queues.RunTier{}
		}
		if d, ok := info.ETA(now); ok {
			secs := d.Seconds()
			a.ETASeconds = &secs
		}
		out.Runs = append(out.Runs, a)
	}
	writeJSON(w, http.StatusOK, out)
}

// RunCancelAnswer is the answer of the cancel-run action, once the token
// was accepted: what was done, or, in Error alone, why nothing was.
type RunCancelAnswer struct {
	Run string `json:"run,omitempty"`
	// Outcome is queues.RunCancel's: "cancelled", "already" (cancelled
	// before) or "ended" (it had ended; nothing changed).
	Outcome string `json:"outcome,omitempty"`
	// Removed counts the queued jobs taken out of their queues, Running
	// the running jobs told to stop (for "cancelled").
	Removed int `json:"removed"`
	Running int `json:"running"`
	// EndedAt is when the run ended (for "ended").
	EndedAt time.Time `json:"ended_at,omitzero"`
	// Message says it in a sentence, as the dashboard shows it.
	Message string `json:"message,omitempty"`
	// Error says why nothing was done (400, 404, 503).
	Error string `json:"error,omitempty"`
}

type apiError struct {
	Error string `json:"error"`
}

// cancelRun cancels the run the form field id names (queues.Client.
// CancelRun), once the token has been checked (Server.action). It answers
// JSON: 200 for a run cancelled now, cancelled before, or already ended
// (nothing changed then); 400 without an ID; 404 for an unknown run; 503
// when Redis fails.
func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request) {
	id := r.PostForm.Get("id")
	if id == "" {
		writeJSON(w, http.StatusBadRequest, RunCancelAnswer{Error: "form field id: the ID of the run to cancel is required"})
		return
	}
	res, err := s.o.Enqueuer.Client.CancelRun(r.Context(), id)
	switch {
	case errors.Is(err, queues.ErrRunNotFound):
		writeJSON(w, http.StatusNotFound, RunCancelAnswer{Run: id, Error: fmt.Sprintf(
			"no run %q: a wrong ID, or a run that ended more than %d days ago (its record is kept that long)", id, int(queues.RunKeep/(24*time.Hour)))})
		return
	case err != nil:
		s.o.Logger.Error("http: cancel run", "run", id, "error", err)
		writeJSON(w, http.StatusServiceUnavailable, RunCancelAnswer{Run: id, Error: err.Error()})
		return
	}
	a := RunCancelAnswer{Run: id, Outcome: res.Outcome, Removed: res.Removed, Running: res.Running}
	switch res.Outcome {
	case "cancelled":
		a.Message = fmt.Sprintf("run %q cancelled (queued jobs taken out of their queues: %d, running jobs told to stop: %d)", id, res.Removed, res.Running)
		s.o.Logger.Info("http: run cancelled from the dashboard", "run", id, "removed", res.Removed, "running", res.Running, "remote", r.RemoteAddr)
	case "already":
		a.Message = fmt.Sprintf("run %q was cancelled before: nothing changed", id)
	case "ended":
		a.EndedAt = res.Ended
		a.Message = fmt.Sprintf("run %q had ended (at %s): nothing changed", id, res.Ended.UTC().Format("2006-01-02 15:04:05 UTC"))
	default:
		a.Message = fmt.Sprintf("run %q: %s", id, res.Outcome)
	}
	writeJSON(w, http.StatusOK, a)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
