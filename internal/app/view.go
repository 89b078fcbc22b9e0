package app

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// ProgressView draws a plan's progress per tier: on a terminal as a block
// redrawn in place, otherwise as one plain line whenever something changed.
type ProgressView struct {
	W        io.Writer
	Terminal bool

	drawn int    // lines drawn last time (terminal)
	last  string // last plain line
}

// Draw shows counts after elapsed, below the extra lines (if any).
func (v *ProgressView) Draw(counts []TierCount, elapsed time.Duration, extra ...string) {
	total, finished := 0, 0
	for _, c := range counts {
		total += c.Total
		finished += c.Done + c.Failed + c.Missing
	}
	// Tiers finish in order, so a tier is done when everything up to and
	// including it is: its ETA is the time for that cumulative work at the
	// rate seen so far.
	var rate float64
	if finished > 0 {
		rate = float64(finished) / elapsed.Seconds()
	}
	if !v.Terminal {
		parts := make([]string, 0, len(counts))
		for _, c := range counts {
			parts = append(parts, fmt.Sprintf("%s %d/%d", c.Tier, c.Done+c.Failed, c.Total))
		}
		line := fmt.Sprintf("progress: %s", strings.Join(parts, ", "))
		if line != v.last {
			for _, e := range extra {
				fmt.Fprintln(v.W, e)
			}
			fmt.Fprintf(v.W, "%s (elapsed %s)\n", line, elapsed.Round(100*time.Millisecond))
			v.last = line
		}
		return
	}
	var b strings.Builder
	if v.drawn > 0 {
		fmt.Fprintf(&b, "\033[%dA", v.drawn)
	}
	for _, e := range extra {
		fmt.Fprintf(&b, "\033[2K%s\n", e)
	}
	remaining := 0
	for _, c := range counts {
		remaining += c.Total - (c.Done + c.Failed + c.Missing)
		eta := "-"
		switch {
		case c.Finished():
			eta = "done"
		case rate > 0:
			eta = (time.Duration(float64(remaining) / rate * float64(time.Second))).Round(time.Second).String()
		}
		fmt.Fprintf(&b, "\033[2K  %-12s %4d/%-4d %s  %3d%%  running %d  retry %d  failed %d  ETA %s\n",
			c.Tier, c.Done+c.Failed, c.Total, bar(c.Done+c.Failed, c.Total, 24), percent(c.Done+c.Failed, c.Total),
			c.Running, c.Retry, c.Failed, eta)
	}
	fmt.Fprintf(&b, "\033[2K  elapsed %s, %d/%d finished\n", elapsed.Round(100*time.Millisecond), finished, total)
	v.drawn = len(extra) + len(counts) + 1
	_, _ = io.WriteString(v.W, b.String())
}

func bar(n, total, width int) string {
	if total == 0 {
		return "[" + strings.Repeat("-", width) + "]"
	}
	full := n * width / total
	return "[" + strings.Repeat("#", full) + strings.Repeat("-", width-full) + "]"
}

func percent(n, total int) int {
	if total == 0 {
		return 100
	}
	return n * 100 / total
}
