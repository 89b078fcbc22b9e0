package demo

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Column widths of the side-by-side summary.
const (
	labelWidth = 40
	cellWidth  = 30
)

// Print writes the closing summary: when the AFTER phase's reports started,
// per tier; the two phases side by side; and what the run showed.
func (s Summary) Print(out io.Writer) {
	fmt.Fprintf(out, "\n=== summary ===\n")
	if len(s.Starts) > 0 {
		fmt.Fprintf(out, "AFTER: reports started per tier, in the business's order (tier inversions: %d):\n", s.Inversions)
		for _, t := range s.Tiers {
			n := 0
			var first, last time.Duration
			for _, st := range s.Starts {
				if st.Tier != t {
					continue
				}
				if n == 0 {
					first = st.At
				}
				n++
				last = st.At
			}
			if n > 0 {
				fmt.Fprintf(out, "  %-12s %3d reports, started from %s to %s into the month-end\n", t, n, first.Round(100*time.Millisecond), last.Round(100*time.Millisecond))
			}
		}
		fmt.Fprintln(out)
	}

	before := s.Outage
	after := &s.Walls
	row := func(label string, cell func(p *Phase) string) {
		b := "skipped (-skip-outage)"
		if before != nil {
			b = cell(before)
		}
		fmt.Fprintf(out, "%-*s %-*s %s\n", labelWidth, label, cellWidth, b, cell(after))
	}
	fmt.Fprintf(out, "%-*s %-*s %s\n", labelWidth, "the same load", cellWidth, "BEFORE", "AFTER")
	row("", func(p *Phase) string { return p.Setup })
	for _, part := range []struct {
		name   string
		orders func(p *Phase) Orders
	}{
		{"orders enqueued before the month-end", func(p *Phase) Orders { return p.OrderBefore }},
		{"orders enqueued during the month-end", func(p *Phase) Orders { return p.OrderDuring }},
	} {
		fmt.Fprintln(out, part.name)
		row("  orders", func(p *Phase) string { return fmt.Sprint(part.orders(p).N) })
		row("  latency p50 / p99 / max", func(p *Phase) string { return latencies(part.orders(p).Latency) })
		row(fmt.Sprintf("  timed out (> %s) / errors", s.OrderTimeout), func(p *Phase) string {
			o := part.orders(p)
			return fmt.Sprintf("%d / %d", o.TimedOut, o.Errors)
		})
	}
	row("order p99 during / before the month-end", func(p *Phase) string {
		if r := p.P99Ratio(); r > 0 {
			return fmt.Sprintf("%.1fx", r)
		}
		return "-"
	})
	row("reports done", func(p *Phase) string {
		return fmt.Sprintf("%d/%d in %s", p.ReportsDone, p.ReportsTotal, p.MonthEndTook.Round(100*time.Millisecond))
	})
	fmt.Fprintln(out, "most jobs / db connections at once, of size")
	var names []string
	for _, p := range append(poolsOf(before), s.Walls.Pools...) {
		if !slices.Contains(names, p.Name) {
			names = append(names, p.Name)
		}
	}
	for _, name := range names {
		row("  "+name, func(p *Phase) string {
			for _, r := range p.Pools {
				if r.Name != name {
					continue
				}
				conns := "-"
				if r.MaxConns != NotCounted {
					conns = fmt.Sprint(r.MaxConns)
				}
				cell := fmt.Sprintf("%d / %s of %d", r.MaxConcurrent, conns, r.Size)
				switch {
				case p != after:
				case r.Exceeded():
					cell += "  EXCEEDED"
				default:
					cell += "  held"
				}
				return cell
			}
			return "-"
		})
	}
	if a := s.Slowdown; a != nil {
		fmt.Fprintln(out)
		a.print(out, s.OrderTimeout)
	}
	fmt.Fprintln(out)
	for _, l := range s.Verdict() {
		fmt.Fprintln(out, l)
	}
}

// actCellWidth is the width of the third act's columns.
const actCellWidth = 24

// print writes the third act's part of the summary: the orders before,
// during and after the slowdown side by side, then the limit.
func (a SlowdownAct) print(out io.Writer, orderTimeout time.Duration) {
	parts := []Orders{a.OrderBefore, a.OrderDuring, a.OrderAfter}
	row := func(label string, cell func(o Orders) string) {
		fmt.Fprintf(out, "%-*s", labelWidth, label)
		for i, o := range parts {
			if i == len(parts)-1 {
				fmt.Fprintf(out, " %s\n", cell(o))
				continue
			}
			fmt.Fprintf(out, " %-*s", actCellWidth, cell(o))
		}
	}
	fmt.Fprintf(out, "%-*s %-*s %-*s %s\n", labelWidth, "SLOWDOWN: the report database slows", actCellWidth, "before the slowdown",
		actCellWidth, fmt.Sprintf("during it (%s)", tenths(a.SlowFor)), "after the recovery")
	fmt.Fprintf(out, "%-*s %gx slower for %s; pool %s adaptive (min %d, max %d, every %s, tolerance %gx)\n",
		labelWidth, "", a.Factor, tenths(a.SlowFor), a.Pool, a.Min, a.Max, a.Window, a.Tolerance)
	fmt.Fprintln(out, "orders enqueued")
	row("  orders", func(o Orders) string { return fmt.Sprint(o.N) })
	row("  latency p50 / p99 / max", func(o Orders) string { return latencies(o.Latency) })
	row(fmt.Sprintf("  timed out (> %s) / errors", orderTimeout), func(o Orders) string { return fmt.Sprintf("%d / %d", o.TimedOut, o.Errors) })
	lost := "none lost"
	if t, f := a.OrdersTimedOut(), a.OrdersFailed(); t+f != 0 {
		var parts []string
		if t != 0 {
			parts = append(parts, fmt.Sprintf("%d timed out", t))
		}
		if f != 0 {
			parts = append(parts, fmt.Sprintf("%d FAILED", f))
		}
		lost = strings.Join(parts, ", ")
	}
	fmt.Fprintf(out, "%-*s %d enqueued, %d completed: %s\n", labelWidth, "orders in the act", a.OrdersEnqueued, a.OrdersCompleted, lost)
	fmt.Fprintf(out, "%-*s %d at the start, lowest %d, %d at the end\n", labelWidth, fmt.Sprintf("the %s pool's limit", a.Pool), a.StartLimit, a.Lowest, a.EndLimit)
	fell := "did NOT fall while the database was slow"
	if a.Fell() {
		fell = fmt.Sprintf("%s after the database slowed", tenths(a.FellAfter))
	}
	back := "was NOT back after the database recovered"
	if a.Back() {
		back = fmt.Sprintf("%s after the database recovered", tenths(a.BackAfter))
	}
	fmt.Fprintf(out, "%-*s %s\n", labelWidth, fmt.Sprintf("  fell below %d", a.Max), fell)
	fmt.Fprintf(out, "%-*s %s\n", labelWidth, fmt.Sprintf("  back at %d", a.Max), back)
	fmt.Fprintf(out, "%-*s most %d of %d at once; %d of %d starts beyond the limit\n", labelWidth, fmt.Sprintf("  %s jobs, counted inside", a.Pool),
		a.MostAtOnce, a.Max, a.OverLimit, a.Starts)
	fmt.Fprintf(out, "%-*s %d/%d in %s\n", labelWidth, "reports done", a.ReportsDone, a.ReportsTotal, tenths(a.Took))
}

// Verdict says, one line per phase, what the run showed against the
// thresholds.
func (s Summary) Verdict() []string {
	var out []string
	switch o := s.Outage; {
	case o == nil:
		out = append(out, "BEFORE: skipped (-skip-outage): the exit code does not cover it.")
	default:
		ratio := "no p99 to compare (no orders before or during the month-end)"
		if r := o.P99Ratio(); r > 0 {
			ratio = fmt.Sprintf("%.1fx its p99 before", r)
		}
		facts := fmt.Sprintf("order p99 during the month-end was %s (threshold %.0fx) and %d orders enqueued during it timed out (threshold %d; an order times out after %s)",
			ratio, OutageP99Ratio, o.OrderDuring.TimedOut, OutageTimeouts, s.OrderTimeout)
		switch {
		case s.OutageReproduced():
			out = append(out, "BEFORE: the outage reproduced: "+facts+".")
		case len(o.Pools) > 0 && o.ReportsTotal < o.Pools[0].Size:
			out = append(out, "BEFORE: the outage did NOT reproduce: "+facts+fmt.Sprintf(
				". The month-end has %d reports, fewer than the shared pool's %d slots, so they never took them all: run it for more months (-periods).",
				o.ReportsTotal, o.Pools[0].Size))
		default:
			out = append(out, "BEFORE: the outage did NOT reproduce: "+facts+
				". Without it this run shows nothing about the walls; try again on a quieter machine, or with more -orders-per-sec.")
		}
	}
	w := s.Walls
	var bad []string
	if w.ReportsDone != w.ReportsTotal || w.ReportsFailed > 0 {
		bad = append(bad, fmt.Sprintf("only %d of %d reports completed", w.ReportsDone, w.ReportsTotal))
	}
	for _, p := range w.Pools {
		if p.Exceeded() {
			bad = append(bad, fmt.Sprintf("pool %s went past its size %d (%d jobs, %d connections at once)", p.Name, p.Size, p.MaxConcurrent, p.MaxConns))
		}
	}
	if s.Inversions > 0 {
		bad = append(bad, fmt.Sprintf("%d reports overtook a higher tier", s.Inversions))
	}
	if len(bad) == 0 {
		out = append(out, fmt.Sprintf("AFTER: the walls held: %d/%d reports completed, no pool went past its size, no tier was overtaken; %d orders enqueued during the month-end timed out.",
			w.ReportsDone, w.ReportsTotal, w.OrderDuring.TimedOut))
		for _, r := range w.Runs {
			out = append(out, "  "+r)
		}
	} else {
		out = append(out, "AFTER: the walls did NOT hold: "+strings.Join(bad, "; ")+".")
		for _, f := range w.Failures {
			out = append(out, "  FAILED "+f)
		}
	}
	if a := s.Slowdown; a == nil {
		out = append(out, "SLOWDOWN: skipped (-skip-slowdown): the exit code does not cover it.")
	} else {
		out = append(out, a.verdict(s.OrderTimeout))
	}
	return out
}

// verdict says in a line what the third act showed; orderTimeout is how
// long an order request waited.
func (a SlowdownAct) verdict(orderTimeout time.Duration) string {
	p99 := fmt.Sprintf("order p99 %s before the slowdown, %s during it, %s after", round(a.OrderBefore.P99), round(a.OrderDuring.P99), round(a.OrderAfter.P99))
	if a.Held() {
		orders := fmt.Sprintf("all %d orders completed (%s)", a.OrdersEnqueued, p99)
		if t := a.OrdersTimedOut(); t != 0 {
			orders = fmt.Sprintf("%d of %d orders completed and %d waited past the %s order timeout (%s; a machine busy with other work alone can make an order that late)",
				a.OrdersCompleted, a.OrdersEnqueued, t, orderTimeout, p99)
		}
		return fmt.Sprintf("SLOWDOWN: the adaptive limit followed the database: with the report database %gx slower, the %s pool's limit fell below %d %s after (lowest %d) and was back at %d %s after it recovered; no job started beyond the limit; %s and %d/%d reports.",
			a.Factor, a.Pool, a.Max, tenths(a.FellAfter), a.Lowest, a.Max, tenths(a.BackAfter), orders, a.ReportsDone, a.ReportsTotal)
	}
	var bad []string
	if a.FellBeforeSlowdown {
		bad = append(bad, fmt.Sprintf("the limit was below %d before the database slowed, with the reports at full speed (its baseline was off: see the limit's timeline)", a.Max))
	}
	if !a.Fell() {
		bad = append(bad, fmt.Sprintf("the limit did not fall below %d while the database was %gx slower for %s", a.Max, a.Factor, tenths(a.SlowFor)))
	}
	if !a.Back() {
		bad = append(bad, fmt.Sprintf("the limit was not back at %d after the database recovered (it ended at %d)", a.Max, a.EndLimit))
	}
	if a.OverLimit > 0 || a.MostAtOnce > a.Max {
		bad = append(bad, fmt.Sprintf("%d of %d jobs started beyond the limit (most at once: %d)", a.OverLimit, a.Starts, a.MostAtOnce))
	}
	if n := a.OrdersFailed(); n != 0 {
		bad = append(bad, fmt.Sprintf("%d of %d orders failed or never ended", n, a.OrdersEnqueued))
	}
	if a.ReportsFailed > 0 || a.ReportsDone != a.ReportsTotal {
		bad = append(bad, fmt.Sprintf("only %d of %d reports completed", a.ReportsDone, a.ReportsTotal))
	}
	tail := p99
	if t := a.OrdersTimedOut(); t != 0 {
		tail += fmt.Sprintf("; %d orders waited past the %s order timeout", t, orderTimeout)
	}
	return "SLOWDOWN: the adaptive limit did NOT do its part: " + strings.Join(bad, "; ") + "; " + tail + "."
}

func poolsOf(p *Phase) []PoolResult {
	if p == nil {
		return nil
	}
	return p.Pools
}

func latencies(l Latency) string {
	if l.N == 0 {
		return "no orders"
	}
	return fmt.Sprintf("%s / %s / %s", round(l.P50), round(l.P99), round(l.Max))
}
