// Package handlers is the story's application on top of the engine: the
// three functions that shared one database (orders, search and the
// month-end report batch), their job types, payloads and handlers. The
// engine (package queues) knows nothing of them; it runs whatever job types
// an application registers.
package handlers

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/internal/quote"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/queues"
)

// The story's job types.
const (
	// TypeReport runs one month-end report (the batch pool).
	TypeReport = "report:run"
	// TypeOrder records an order (the order pool).
	TypeOrder = "order:create"
	// TypeSearch refreshes a product's search entry (the search pool).
	TypeSearch = "search:index"
)

// The story's jobs, each a job type with its payload type: a handler and an
// enqueue of the same job agree on the payload at compile time.
var (
	Report = queues.NewJob[ReportPayload](TypeReport)
	Order  = queues.NewJob[OrderPayload](TypeOrder)
	Search = queues.NewJob[SearchPayload](TypeSearch)
)

// JobTypes lists the job types Register handles.
func JobTypes() []string { return []string{TypeOrder, TypeSearch, TypeReport} }

// ReportPayload is the payload of a TypeReport job. The doc tag of each
// field says what it means, for enqueue job -example (see Payloads).
type ReportPayload struct {
	Report string `json:"report" doc:"report name from the report catalog (configs/reports.yaml), such as vat-return"`
	Period string `json:"period" doc:"the month the report covers, YYYY-MM"`
}

// Example returns a valid payload, for people (see Payloads).
func (ReportPayload) Example() ReportPayload {
	return ReportPayload{Report: "vat-return", Period: "2026-10"}
}

// Validate checks the report name and the period's form. Like every
// payload's Validate, its error quotes a value cut to quote.Max bytes: it
// is stored with the job and logged, and a payload's values can be huge.
func (p *ReportPayload) Validate() error {
	if err := reports.ValidateName(p.Report); err != nil {
		return err
	}
	_, err := reports.ParsePeriod(p.Period)
	return err
}

// ReportJobID is the job ID of a report for a period: the same report for
// the same period is one job while it is queued or running.
func ReportJobID(report, period string) string { return "report:" + report + ":" + period }

// OrderPayload is the payload of a TypeOrder job. The doc tag of each
// field says what it means, for enqueue job -example (see Payloads).
type OrderPayload struct {
	Region      string `json:"region" doc:"sales region: central, east, north, south or west"`
	Category    string `json:"category" doc:"product category: apparel, books, electronics, garden, grocery or toys"`
	CustomerID  int    `json:"customer_id" doc:"the customer's number, >= 1"`
	AmountCents int64  `json:"amount_cents" doc:"the order's amount in cents, >= 1"`
}

// Example returns a valid payload, for people (see Payloads).
func (OrderPayload) Example() OrderPayload {
	return OrderPayload{Region: "north", Category: "books", CustomerID: 7, AmountCents: 1299}
}

// Validate checks the order's fields.
func (p *OrderPayload) Validate() error {
	var errs []error
	if !slices.Contains(database.Regions, p.Region) {
		errs = append(errs, fmt.Errorf("region %s is not one of %q", quote.Value(p.Region), database.Regions))
	}
	if !slices.Contains(database.Categories, p.Category) {
		errs = append(errs, fmt.Errorf("category %s is not one of %q", quote.Value(p.Category), database.Categories))
	}
	if p.CustomerID < 1 {
		errs = append(errs, fmt.Errorf("customer_id must be >= 1, got %d", p.CustomerID))
	}
	if p.AmountCents < 1 {
		errs = append(errs, fmt.Errorf("amount_cents must be >= 1, got %d", p.AmountCents))
	}
	return errors.Join(errs...)
}

// SearchPayload is the payload of a TypeSearch job. The doc tag of each
// field says what it means, for enqueue job -example (see Payloads).
type SearchPayload struct {
	ProductID int64  `json:"product_id" doc:"the product's number, >= 1; indexing it again refreshes its entry"`
	Title     string `json:"title" doc:"the product's title, not empty"`
	Category  string `json:"category" doc:"product category: apparel, books, electronics, garden, grocery or toys"`
}

// Example returns a valid payload, for people (see Payloads).
func (SearchPayload) Example() SearchPayload {
	return SearchPayload{ProductID: 42, Title: "Garden teapot", Category: "garden"}
}

// Validate checks the product's fields.
func (p *SearchPayload) Validate() error {
	var errs []error
	if p.ProductID < 1 {
		errs = append(errs, fmt.Errorf("product_id must be >= 1, got %d", p.ProductID))
	}
	if p.Title == "" {
		errs = append(errs, errors.New("title is required"))
	}
	if !slices.Contains(database.Categories, p.Category) {
		errs = append(errs, fmt.Errorf("category %s is not one of %q", quote.Value(p.Category), database.Categories))
	}
	return errors.Join(errs...)
}

// Deps is what the handlers need.
type Deps struct {
	// DB is the shared database.
	DB *database.DB
	// Catalog is the report catalog.
	Catalog *reports.Catalog
	// OutputDir receives the report files.
	OutputDir string
	// PoolOf names the pool a job type runs in, whose database share the
	// handler draws its connection from.
	PoolOf func(jobType string) string
	// Dependency names the dependency the database is
	// (queues.Dependency): each handler whose pool uses it holds its
	// pool's share of it (queues.DependencyOf) while it holds a
	// connection. Defaults to none.
	Dependency string
	// ReportMinDuration makes a report hold its connection at least this
	// long (a stand-in for heavy queries in demos). Defaults to 0.
	ReportMinDuration time.Duration
	// OnReportDone, when set, is called after each report is written.
	OnReportDone func(p ReportPayload, r reports.Result)
	// OnBundleDone, when set, is called after a month-end's manifest is
	// written (TypeBundle), with its path: the place to tell finance.
	OnBundleDone func(p BundlePayload, path string)
	// Now returns the current time. Defaults to time.Now.
	Now func() time.Time
}

// Register registers the three job types on h, and TypeBundle when a pool
// serves it (PoolOf says a pool).
func Register(h *queues.Handlers, d Deps) error {
	if d.DB == nil || d.Catalog == nil || d.PoolOf == nil || d.OutputDir == "" {
		return errors.New("handlers: Register needs DB, Catalog, PoolOf and OutputDir")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	reportPool, orderPool, searchPool := d.PoolOf(TypeReport), d.PoolOf(TypeOrder), d.PoolOf(TypeSearch)

	queues.AddHandler(h, Report, func(ctx context.Context, p ReportPayload) error {
		r, ok := d.Catalog.Get(p.Report)
		if !ok {
			return queues.Permanent(fmt.Errorf("unknown report %s (catalog: %q)", quote.Value(p.Report), d.Catalog.Names()))
		}
		period, _ := reports.ParsePeriod(p.Period) // checked by Validate
		var res reports.Result
		err := d.conn(ctx, reportPool, func(ctx context.Context, conn *sql.Conn) error {
			end := d.DB.BeginReport()
			defer end()
			start := time.Now()
			// Before the file is published: the report's least duration
			// (the demo's slow reports, stretched when the database is
			// made slow: database.SetSlowdown), then the fence, so that a
			// run another worker took over while this one was stalled
			// writes nothing over the new run's file.
			commit := func(ctx context.Context) error {
				if err := d.DB.HoldReport(ctx, start, d.ReportMinDuration); err != nil {
					return err
				}
				return queues.CheckFence(ctx)
			}
			var err error
			res, err = reports.RunWith(ctx, conn, r, period, d.OutputDir, commit)
			return err
		})
		if err != nil {
			return err
		}
		if d.OnReportDone != nil {
			d.OnReportDone(p, res)
		}
		return nil
	})
	if d.PoolOf(TypeBundle) != "" {
		queues.AddHandler(h, Bundle, func(ctx context.Context, p BundlePayload) error {
			path, err := writeBundle(ctx, d.OutputDir, p)
			if err != nil {
				return err
			}
			if d.OnBundleDone != nil {
				d.OnBundleDone(p, path)
			}
			return nil
		})
	}
	queues.AddHandler(h, Order, func(ctx context.Context, p OrderPayload) error {
		return d.conn(ctx, orderPool, func(ctx context.Context, conn *sql.Conn) error {
			_, err := database.InsertOrder(ctx, conn, d.Now(), p.Region, p.Category, p.CustomerID, p.AmountCents)
			return err
		})
	})
	queues.AddHandler(h, Search, func(ctx context.Context, p SearchPayload) error {
		return d.conn(ctx, searchPool, func(ctx context.Context, conn *sql.Conn) error {
			return database.IndexProduct(ctx, conn, p.ProductID, p.Title, p.Category, d.Now())
		})
	})
	return nil
}

// conn runs fn with a connection of pool's share, holding the job's share
// of the database's dependency meanwhile when the job's pool uses it.
func (d Deps) conn(ctx context.Context, pool string, fn func(ctx context.Context, conn *sql.Conn) error) error {
	if d.Dependency != "" {
		dep, err := queues.DependencyOf(ctx, d.Dependency)
		switch {
		case errors.Is(err, queues.ErrNoDependency):
			// The pool does not use it: its connections are its share.
		case err != nil:
			return err
		default:
			release, err := dep.Acquire(ctx)
			if err != nil {
				return err
			}
			defer release()
		}
	}
	return d.DB.Conn(ctx, pool, fn)
}

// Check decodes and validates payload as jobType's payload, exactly as the
// job's handler will, so a command can refuse a payload that would only be
// archived as malformed. An unknown job type is an error too.
func Check(jobType string, payload []byte) error {
	var err error
	switch jobType {
	case TypeReport:
		_, err = Report.Decode(payload)
	case TypeOrder:
		_, err = Order.Decode(payload)
	case TypeSearch:
		_, err = Search.Decode(payload)
	case TypeBundle:
		return checkBundle(payload)
	default:
		return fmt.Errorf("unknown job type %s (job types: %s)", quote.Value(jobType), strings.Join(JobTypes(), ", "))
	}
	return err
}
