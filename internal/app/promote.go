package app

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/queues"
)

// PromotedReport is what PromoteReport did to one report.
type PromotedReport struct {
	Report string `json:"report"`
	Period string `json:"period"`
	queues.PromoteResult
}

// PromoteReport moves the waiting report for period (its job: the one
// EnqueueReport made for that report and period) to tier, in one step
// (see queues.Client.Promote). A report that already runs or finished is
// not moved, and the result says so. An unknown report, a bad period, a
// tier the priorities file or the batch pool does not have are usage
// errors found before Redis is touched; a report no queue holds is a usage
// error too. On any error nothing moved.
func (e *Enqueuer) PromoteReport(ctx context.Context, report, period, tier string) (PromotedReport, error) {
	if err := e.Config.CheckPromote(report, period, tier); err != nil {
		return PromotedReport{}, err
	}
	res, err := e.Client.Promote(ctx, handlers.TypeReport, handlers.ReportJobID(report, period), tier)
	switch {
	case errors.Is(err, queues.ErrJobNotFound):
		return PromotedReport{}, cli.Usagef("report %s for %s is not queued (never enqueued, or finished and no longer kept); nothing moved", cli.Quote(report), period)
	case errors.Is(err, queues.ErrInvalidPromote):
		return PromotedReport{}, cli.Usagef("%v", err)
	case err != nil:
		return PromotedReport{}, err
	}
	return PromotedReport{Report: report, Period: period, PromoteResult: res}, nil
}

// CheckPromote checks a promote request against the config alone, so
// that a command can refuse it before it connects to Redis: the report is
// in the catalog, the period is a month, and the tier is in the priorities
// file and served by the pool that runs reports. It returns a usage error.
func (c *Config) CheckPromote(report, period, tier string) error {
	if _, ok := c.Catalog.Get(report); !ok {
		return cli.Usagef("unknown report %s (catalog: %s)", cli.Quote(report), strings.Join(c.Catalog.Names(), ", "))
	}
	if _, err := reports.ParsePeriod(period); err != nil {
		return cli.Usagef("%v", err)
	}
	if c.Policy == nil {
		return cli.Usagef("no priorities file is configured, so there are no tiers to move a report between")
	}
	if !c.Policy.Has(tier) {
		return cli.Usagef("priority: unknown tier %s (tiers, highest first: %q)", cli.Quote(tier), c.Policy.Tiers())
	}
	for _, p := range c.Engine.Pools {
		if slices.Contains(p.JobTypes, handlers.TypeReport) && !slices.Contains(p.Tiers, tier) {
			return cli.Usagef("pool %q does not serve tier %q (its tiers: %q)", p.Name, tier, p.Tiers)
		}
	}
	return nil
}

// PromoteText says what PromoteReport did, in one line for people.
func PromoteText(r PromotedReport) string {
	what := "report " + r.Report + " for " + r.Period
	switch {
	case r.Moved:
		s := what + ": moved from tier " + r.From + " to " + r.To
		switch r.State {
		case "pending":
			s += ", at the end of its queue"
		case "scheduled":
			s += ", still scheduled for its time"
		case "retry":
			s += ", still waiting for its retry"
		}
		return s + " (queue " + r.Queue + ", id " + r.ID + ")"
	case r.State == "active":
		return what + " is already running; nothing moved"
	case r.State == "completed":
		return what + " is already done; nothing moved"
	case r.State == "archived":
		return what + " already failed for good (archived); nothing moved"
	case r.From == r.To:
		return what + " is already in tier " + r.To + " (" + r.State + "); nothing moved"
	}
	return what + " is " + r.State + "; nothing moved"
}
