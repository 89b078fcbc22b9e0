package queues

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// ArchivedJob is a job that failed for good and that asynq keeps (90 days,
// at most 10,000 per queue); asynq's inspector reads the rest of it
// (GetTaskInfo: its type, payload and last error).
type ArchivedJob struct {
	Pool, Tier, Queue, ID string
	// At is when it was archived, to the second.
	At time.Time
}

// RecentlyArchived returns the n most recently archived jobs across every
// pool's queues, newest first, in one pipelined round trip: what a
// dashboard lists as recent failures.
func (c *Client) RecentlyArchived(ctx context.Context, n int) ([]ArchivedJob, error) {
	var qs []string
	pools := map[string]*Pool{}
	for _, p := range c.pools().pools {
		for _, q := range p.queues {
			qs = append(qs, q)
			pools[q] = p
		}
	}
	per, err := rdb.NewestArchived(ctx, c.rdb, qs, n)
	if err != nil {
		return nil, err
	}
	var out []ArchivedJob
	for _, list := range per {
		for _, a := range list {
			p := pools[a.Queue]
			out = append(out, ArchivedJob{Pool: p.Name(), Tier: p.TierOf(a.Queue), Queue: a.Queue, ID: a.ID, At: a.At})
		}
	}
	slices.SortStableFunc(out, func(a, b ArchivedJob) int { return cmp.Compare(b.At.UnixNano(), a.At.UnixNano()) })
	return out[:min(n, len(out))], nil
}
