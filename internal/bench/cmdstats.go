package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// commandCalls returns, per command, how many times Redis has run it so far
// (INFO commandstats; commands inside scripts count under their own name,
// the script call under evalsha).
func commandCalls(ctx context.Context, o *Options) (map[string]int64, error) {
	info, err := o.Redis.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("INFO commandstats: %s %q: %w", name, v, err)
				}
				out[name] = n
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("INFO commandstats is empty (is this a real Redis?)")
	}
	return out, nil
}

// perJobCalls is the difference of two commandCalls readings per job,
// leaving out INFO (the bench's own readings).
func perJobCalls(before, after map[string]int64, jobs int) map[string]float64 {
	out := map[string]float64{}
	for name, n := range after {
		if d := n - before[name]; d > 0 && name != "info" {
			out[name] = float64(d) / float64(jobs)
		}
	}
	return out
}

// topCalls formats the most frequent commands of a per-job breakdown, most
// first: "evalsha 1.02, zadd 3.10, ...".
func topCalls(calls map[string]float64, k int) string {
	names := make([]string, 0, len(calls))
	for name := range calls {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		if calls[a] != calls[b] {
			if calls[a] > calls[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	if len(names) > k {
		names = names[:k]
	}
	parts := make([]string, len(names))
	for i, name := range names {
		parts[i] = fmt.Sprintf("%s %.2f", name, calls[name])
	}
	return strings.Join(parts, ", ")
}
