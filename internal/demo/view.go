package demo

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// plainEvery is how many refreshes apart the live view prints when
// stdout is not a terminal.
const plainEvery = 4

// viewRow is one row of the live view: a pool, or, in the shared pool, the
// jobs that go to one pool once the walls are up.
type viewRow struct {
	key   string // the recorder's row
	label string
	size  int
}

// limitLegend explains the third act's limit line; Run prints it after
// the legend when the act runs.
const limitLegend = "  limit    (SLOWDOWN) the adaptive pool's limit in effect, read from Redis, and its last change with the reason logged\n"

// legend explains the live view's columns; Run prints it once.
func legend(refresh, orderTimeout time.Duration) string {
	return fmt.Sprintf(`live view (redrawn every %s; every %s as plain lines when stdout is not a terminal), counted inside the job handlers:
  size     the most jobs the pool may run at once (its slots)
  active   jobs inside the pool's handlers right now
  peak     the most jobs inside at once since the previous view: short jobs show here even when "active" misses them
  done/s   jobs that finished in the last second
  held     the most database connections the pool's jobs have held at once so far (counted by the database layer;
           "-": none yet, or not counted for the shared pool as a whole)
  [###.]   peak against size
  orders   latency (enqueue to end) of the orders that ended in the last second; waiting: enqueued, not yet ended;
           timed out: not done %s after being enqueued (the customer's request gave up)
`, refresh, plainEvery*refresh, orderTimeout)
}

// liveView draws a phase's live view: on a terminal as a block redrawn in
// place, otherwise as plain lines every plainEvery.
type liveView struct {
	w        io.Writer
	terminal bool
	phase    string // BEFORE or AFTER
	rows     []viewRow
	refresh  time.Duration

	drawn     int // lines drawn last time (terminal)
	lastPlain time.Time
}

// due reports whether a draw at now would be shown; a plain view shows one
// every plainEvery refreshes, and the last one (final) always.
func (v *liveView) due(now time.Time, final bool) bool {
	return v.terminal || final || now.Sub(v.lastPlain) >= plainEvery*v.refresh-v.refresh/2
}

// note prints a line that stays: the live view is drawn again below it.
func (v *liveView) note(format string, args ...any) {
	fmt.Fprintf(v.w, format+"\n", args...)
	v.drawn = 0
}

// draw shows the snapshot, and extra lines below the pools.
func (v *liveView) draw(now time.Time, status string, s liveSnapshot, held map[string]int, dbInUse, dbMax int, reports string, extra ...string) {
	v.lastPlain = now
	lines := []string{
		fmt.Sprintf("[%s] %s", v.phase, status),
		fmt.Sprintf("  %-16s %4s %6s %5s %6s %5s", "pool", "size", "active", "peak", "done/s", "held"),
	}
	for _, r := range v.rows {
		rs := s.rows[r.key]
		h := "-"
		if n, ok := held[r.key]; ok {
			h = fmt.Sprint(n)
		}
		lines = append(lines, fmt.Sprintf("  %-16s %4d %6d %5d %6d %5s  %s", r.label, r.size, rs.active, rs.peak, rs.perSecond, h, bar(rs.peak, r.size)))
	}
	recent := "none ended in the last second"
	if s.recent.N > 0 {
		recent = fmt.Sprintf("%d ended in the last second, p50 %s p99 %s", s.recent.N, round(s.recent.P50), round(s.recent.P99))
	}
	for _, e := range extra {
		lines = append(lines, strings.Split(e, "\n")...)
	}
	lines = append(lines,
		fmt.Sprintf("  database: %d/%d connections in use now", dbInUse, dbMax),
		fmt.Sprintf("  orders: %s; waiting %d (oldest %s); so far timed out %d, errors %d", recent, s.waiting, round(s.oldest), s.timedOut, s.errors),
		"  reports: "+reports,
	)
	if !v.terminal {
		for _, l := range lines {
			fmt.Fprintln(v.w, l)
		}
		return
	}
	var b strings.Builder
	if v.drawn > 0 {
		fmt.Fprintf(&b, "\033[%dA", v.drawn)
	}
	for _, l := range lines {
		fmt.Fprintf(&b, "\033[2K%s\n", l)
	}
	v.drawn = len(lines)
	_, _ = io.WriteString(v.w, b.String())
}

func bar(n, size int) string {
	return "[" + strings.Repeat("#", min(n, size)) + strings.Repeat(".", max(0, size-n)) + strings.Repeat("!", max(0, n-size)) + "]"
}

// round rounds a duration for people: milliseconds below 10s, tenths of a
// second above.
func round(d time.Duration) time.Duration {
	if d >= 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
