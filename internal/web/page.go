package web

import (
	"cmp"
	"context"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/queues"
)

//go:embed assets
var assets embed.FS

var tmpl = template.Must(template.New("").Funcs(template.FuncMap{
	"dur":  fmtDur,
	"secs": func(s float64) string { return fmtDur(time.Duration(s * float64(time.Second))) },
	"num":  func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) },
	"pct": func(n, total int) int {
		if total == 0 {
			return 0
		}
		return n * 100 / total
	},
}).ParseFS(assets, "assets/*.html"))

// MaxFailures is how many recent failures the dashboard lists: the most
// recently archived jobs across every queue.
const MaxFailures = 10

// pageData is what the dashboard shows.
type pageData struct {
	Generated time.Time
	Refresh   int // milliseconds
	ReadOnly  bool
	Pools     []poolView
	// Dependencies are the config's dependencies: capacity against the
	// pools' claims and use, from the same read as Pools.
	Dependencies []dependencyView
	// ProgressPool is the pool that runs reports; Progress its tiers.
	ProgressPool string
	Progress     []tierProgress
	Failures     []failure
	// Runs are the MaxRuns most recent runs, newest first.
	Runs  []runView
	Error string
	// Scene is what the program wants shown above the pools, or nil.
	Scene *Scene
	// Timeline: the page draws the timeline (/api/history); Window is
	// how far back it reaches.
	Timeline bool
	Window   time.Duration
}

type poolView struct {
	app.PoolStatus
	Slots          []bool // one per slot of Capacity: in use or not
	Holders        []holder
	OperatorPaused bool
	// Door is the pool's door, nil for a pool without one.
	Door *doorView
	// Changes is an adaptive pool's latest changes of its limit and an
	// operator's sizes, newest first, at most MaxAdaptiveChanges.
	Changes []adaptiveChange
}

// MaxAdaptiveChanges is how many of an adaptive limit's latest changes the
// dashboard lists.
const MaxAdaptiveChanges = 10

// adaptiveChange is one line of an adaptive pool's timeline.
type adaptiveChange struct {
	At time.Time
	// Change is "2 → 3" for a move of the limit, "size 3" for an
	// operator's size, "reset" for an operator's reset.
	Change   string
	Reason   string
	Operator bool
}

// dependencyView is a dependency: its capacity against the pools' claims
// and use, as a bar of one segment per pool (its claim, its use filled)
// and as numbers.
type dependencyView struct {
	app.DependencyStatus
	Overbooked bool
	Uses       []dependencyUseView
}

type dependencyUseView struct {
	app.DependencyUse
	// Color picks the segment's color; ClaimedPct is its claim's share of
	// the bar (the capacity, or the claims when they exceed it), InUsePct
	// its use's share of its claim.
	Color                int
	ClaimedPct, InUsePct int
}

// doorView is a pool's door: its backlog against each tier's limit, the
// refusals by reason, the requests waiting for room, the rates.
type doorView struct {
	Backlog, MaxBacklog int
	Waiting             int64
	Tiers               []doorTier
	Rates               []string
}

type doorTier struct {
	Tier                    string
	Limit                   int // 0: none
	Pct                     int // the backlog against Limit, 0-100
	RefusedBacklog, Refused int64
	RefusedRate             int64
}

type holder struct {
	Process string
	Slots   int
}

type tierProgress struct {
	Tier                  string
	Done, Failed, Running int
	// ForSlot were taken from the queue ahead of a free slot; Waiting
	// are still in it (pending, scheduled or waiting for a retry).
	ForSlot, Waiting, Total int
	ETA                     string
}

type failure struct {
	Pool, Tier, Queue, ID, Type string
	Error                       string
	When                        time.Time
}

func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "index.html")
}

func (s *Server) live(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "live.html")
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, name string) {
	d := s.data(r.Context())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := tmpl.ExecuteTemplate(w, name, d); err != nil {
		s.o.Logger.Error("http: render", "template", name, "error", err)
	}
}

func (s *Server) static(w http.ResponseWriter, r *http.Request) {
	http.StripPrefix("/static/", http.FileServerFS(mustSub("assets/static"))).ServeHTTP(w, r)
}

// data reads everything the page shows. A failed read shows as an error
// on the page, with what could be read.
func (s *Server) data(ctx context.Context) pageData {
	d := pageData{Generated: time.Now(), Refresh: int(s.o.Refresh.Milliseconds()), ReadOnly: s.o.CurrentToken() == "", Timeline: s.o.History != nil}
	if s.o.History != nil {
		d.Window = s.o.History.window()
	}
	if s.o.Scene != nil {
		sc := s.o.Scene()
		d.Scene = &sc
	}
	e := s.o.Enqueuer
	st, err := e.Status(ctx)
	if err != nil {
		d.Error = "status: " + err.Error()
		return d
	}
	// Every number below comes from st: one read of the pools' counts,
	// their adaptive limits and the dependencies (Enqueuer.Status).
	for _, p := range st.Pools {
		v := poolView{PoolStatus: p, Changes: adaptiveChanges(p.Adaptive)}
		for _, q := range p.Queues {
			v.OperatorPaused = v.OperatorPaused || q.PausedByOperator
		}
		for i := range max(p.Capacity, p.Active) {
			v.Slots = append(v.Slots, i < p.Active)
		}
		for name, n := range p.Holders {
			v.Holders = append(v.Holders, holder{name, n})
		}
		sort.Slice(v.Holders, func(i, j int) bool { return v.Holders[i].Process < v.Holders[j].Process })
		if pool, err := e.Client.Pool(p.Name); err == nil && pool.Config().HasDoor() {
			v.Door = door(p)
		}
		d.Pools = append(d.Pools, v)
	}
	for _, dep := range st.Dependencies {
		d.Dependencies = append(d.Dependencies, dependency(dep))
	}
	if rp, err := e.Client.Route(handlers.TypeReport); err == nil {
		d.ProgressPool = rp.Name()
		for _, p := range st.Pools {
			if p.Name == rp.Name() {
				d.Progress = s.eta.progress(p.Queues, time.Now())
			}
		}
	}
	if d.Runs, err = recentRuns(ctx, e.Client, d.Generated); err != nil && d.Error == "" {
		d.Error = "runs: " + err.Error()
	}
	if d.Failures, err = recentFailures(ctx, e, MaxFailures); err != nil && d.Error == "" {
		d.Error = "recent failures: " + err.Error()
	}
	return d
}

// dependency is a dependency's part of the status, drawn.
func dependency(d app.DependencyStatus) dependencyView {
	v := dependencyView{DependencyStatus: d, Overbooked: d.Claimed > d.Capacity}
	scale := max(d.Capacity, d.Claimed, 1)
	for i, u := range d.Pools {
		uv := dependencyUseView{DependencyUse: u, Color: i % dependencyColors, ClaimedPct: u.Claimed * 100 / scale}
		if u.Claimed > 0 {
			uv.InUsePct = min(100, u.InUse*100/u.Claimed)
		}
		v.Uses = append(v.Uses, uv)
	}
	return v
}

// dependencyColors is how many colors the dependency bars' segments
// cycle through (style.css: .seg.c0 to .seg.c5).
const dependencyColors = 6

// adaptiveChanges is the newest MaxAdaptiveChanges of an adaptive limit's
// log (nil for a pool without one), each said as the page shows it.
func adaptiveChanges(a *queues.AdaptiveStatus) []adaptiveChange {
	if a == nil {
		return nil
	}
	var out []adaptiveChange
	for _, c := range a.Log[:min(len(a.Log), MaxAdaptiveChanges)] {
		ch := adaptiveChange{At: c.At, Reason: c.Reason}
		switch {
		case c.From > 0:
			ch.Change = fmt.Sprintf("%d → %d", c.From, c.To)
		case c.To > 0:
			ch.Change, ch.Operator = fmt.Sprintf("size %d", c.To), true
		default:
			ch.Change, ch.Operator = "reset", true
		}
		out = append(out, ch)
	}
	return out
}

// door is the door part of a pool's status.
func door(p app.PoolStatus) *doorView {
	d := &doorView{Backlog: p.Backlog, MaxBacklog: p.MaxBacklog, Waiting: p.WaitingForRoom}
	for _, q := range p.Queues {
		t := doorTier{Tier: cmp.Or(q.Tier, "-"), Limit: q.BacklogLimit, RefusedBacklog: q.Refused["backlog"], RefusedRate: q.Refused["rate"]}
		t.Refused = t.RefusedBacklog + t.RefusedRate
		if t.Limit > 0 {
			t.Pct = min(100, p.Backlog*100/t.Limit)
		}
		d.Tiers = append(d.Tiers, t)
	}
	for _, r := range p.Rates {
		what := r.Limit
		if r.JobType != "" {
			what += " " + r.JobType
		}
		d.Rates = append(d.Rates, what+": "+r.Rate)
	}
	return d
}

// recentFailures returns the n most recently archived jobs across every
// queue: one pipelined read of each queue's newest n archive entries, then
// one read per job shown (at most n).
func recentFailures(ctx context.Context, e *app.Enqueuer, n int) ([]failure, error) {
	jobs, err := e.Client.RecentlyArchived(ctx, n)
	if err != nil {
		return nil, err
	}
	out := make([]failure, 0, len(jobs))
	for _, j := range jobs {
		info, err := e.Insp.GetTaskInfo(j.Queue, j.ID)
		if err != nil {
			continue // retried or deleted meanwhile
		}
		out = append(out, failure{Pool: j.Pool, Tier: j.Tier, Queue: j.Queue, ID: j.ID, Type: info.Type, Error: cli.Readable(info.LastErr), When: j.At})
	}
	return out, nil
}

// etaTracker remembers how many of the report pool's jobs had finished
// when, to estimate the rate and so each tier's ETA.
type etaTracker struct {
	mu      sync.Mutex
	samples []etaSample
}

type etaSample struct {
	at       time.Time
	finished int
}

// etaWindow is how far back the rate is measured.
const etaWindow = time.Minute

func newETATracker() *etaTracker { return &etaTracker{} }

// progress turns the report pool's queues into per-tier progress. A
// tier's jobs are all the jobs Redis holds for it: finished ones stay
// visible for report_retention. Tiers run in order, so a tier is done
// when every job up to and including it is: its ETA is that cumulative
// work at the rate of the last minute.
func (t *etaTracker) progress(qs []app.QueueStatus, now time.Time) []tierProgress {
	var out []tierProgress
	finished := 0
	for _, q := range qs {
		p := tierProgress{
			Tier: cmp.Or(q.Tier, q.Queue), Done: q.Completed, Failed: q.Archived, Running: q.Active,
			ForSlot: q.WaitingForSlot, Waiting: q.Pending + q.Scheduled + q.Retry,
		}
		p.Total = p.Done + p.Failed + p.Running + p.ForSlot + p.Waiting
		finished += p.Done + p.Failed
		out = append(out, p)
	}
	rate := t.rate(now, finished)
	remaining := 0
	for i := range out {
		p := &out[i]
		remaining += p.Total - p.Done - p.Failed
		switch {
		case p.Total == 0:
			p.ETA = "-"
		case p.Done+p.Failed == p.Total:
			p.ETA = "done"
		case rate > 0:
			p.ETA = fmtDur(time.Duration(float64(remaining) / rate * float64(time.Second)))
		default:
			p.ETA = "…"
		}
	}
	return out
}

// rate records a sample and returns jobs finished per second over the
// window, or 0 when it cannot tell yet.
func (t *etaTracker) rate(now time.Time, finished int) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.samples = append(t.samples, etaSample{now, finished})
	cut := 0
	for cut < len(t.samples)-1 && now.Sub(t.samples[cut].at) > etaWindow {
		cut++
	}
	t.samples = slices.Delete(t.samples, 0, cut)
	first := t.samples[0]
	dt := now.Sub(first.at).Seconds()
	if dt < 1 || finished <= first.finished {
		return 0
	}
	return float64(finished-first.finished) / dt
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	default:
		return d.Round(time.Second).String()
	}
}

func mustSub(dir string) fs.FS {
	sub, err := fs.Sub(assets, dir)
	if err != nil {
		panic(err)
	}
	return sub
}
