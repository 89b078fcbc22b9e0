// Package reports is the month-end report catalog and the code that runs a
// report: a SQL query over one month, written atomically as a CSV file.
package reports

import (
	"context"
	"database/sql"
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/lci-labs/compartment/internal/quote"
	"github.com/lci-labs/compartment/internal/yamlx"
)

// FormatCSV is the only output format so far.
const FormatCSV = "csv"

// Report is one entry of the catalog.
type Report struct {
	// Name identifies the report; it becomes part of file names and job IDs.
	Name string `yaml:"name"`
	// Description says what the report is for.
	Description string `yaml:"description,omitempty"`
	// Format is the output format. Defaults to csv (the only one so far).
	Format string `yaml:"format,omitempty"`
	// Query is the SQL. $1 is the first instant of the month and $2 the
	// first instant of the next month, both as RFC 3339 UTC text.
	Query string `yaml:"query"`
}

// Catalog is a validated set of reports.
type Catalog struct {
	list   []Report
	byName map[string]Report
}

type catalogFile struct {
	Reports []Report `yaml:"reports"`
}

// LoadCatalog reads and validates a catalog file. A file larger than
// yamlx.MaxFileSize is refused unread.
func LoadCatalog(path string) (*Catalog, error) {
	data, err := yamlx.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("report catalog: %w", err)
	}
	c, err := ParseCatalog(data)
	if err != nil {
		return nil, fmt.Errorf("report catalog %s: %w", path, err)
	}
	return c, nil
}

// ParseCatalog decodes a catalog strictly and validates every entry,
// reporting all problems at once.
func ParseCatalog(data []byte) (*Catalog, error) {
	var f catalogFile
	if err := yamlx.DecodeStrict(data, &f); err != nil {
		return nil, err
	}
	var errs []error
	if len(f.Reports) == 0 {
		errs = append(errs, errors.New("reports: the catalog lists no reports"))
	}
	c := &Catalog{byName: map[string]Report{}}
	for i, r := range f.Reports {
		label := fmt.Sprintf("report %q", r.Name) // only used as is once the name is valid
		if err := ValidateName(r.Name); err != nil {
			label = fmt.Sprintf("reports[%d]", i)
			errs = append(errs, fmt.Errorf("%s: %w", label, err))
		}
		if _, dup := c.byName[r.Name]; dup {
			errs = append(errs, fmt.Errorf("%s: listed twice", label))
		}
		if r.Format == "" {
			r.Format = FormatCSV
		}
		if r.Format != FormatCSV {
			errs = append(errs, fmt.Errorf("%s: format must be %q, got %s", label, FormatCSV, quote.Value(r.Format)))
		}
		if strings.TrimSpace(r.Query) == "" {
			errs = append(errs, fmt.Errorf("%s: query is required", label))
		} else if !strings.Contains(r.Query, "$1") || !strings.Contains(r.Query, "$2") {
			errs = append(errs, fmt.Errorf("%s: query must use $1 (start of the month) and $2 (start of the next month)", label))
		}
		c.byName[r.Name] = r
		c.list = append(c.list, r)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// Get returns the report called name.
func (c *Catalog) Get(name string) (Report, bool) {
	r, ok := c.byName[name]
	return r, ok
}

// Names returns the report names in catalog order.
func (c *Catalog) Names() []string {
	out := make([]string, len(c.list))
	for i, r := range c.list {
		out[i] = r.Name
	}
	return out
}

// Period is one calendar month.
type Period struct{ start time.Time }

// ParsePeriod parses YYYY-MM. The error quotes s cut to quote.Max bytes.
func ParsePeriod(s string) (Period, error) {
	t, err := time.Parse("2006-01", s)
	if err != nil || len(s) != 7 {
		return Period{}, fmt.Errorf("period %s must be a month written YYYY-MM, like 2026-10", quote.Value(s))
	}
	return Period{start: t.UTC()}, nil
}

// String returns YYYY-MM.
func (p Period) String() string { return p.start.Format("2006-01") }

// Start is the first instant of the month.
func (p Period) Start() time.Time { return p.start }

// End is the first instant of the next month.
func (p Period) End() time.Time { return p.start.AddDate(0, 1, 0) }

// FileName is the output file of report for period; a rerun writes the same
// name.
func FileName(report string, p Period) string { return report + "_" + p.String() + ".csv" }

// Result describes a written report.
type Result struct {
	Path string
	Rows int
	// LeftoversRemoved counts the temporary files of earlier runs of the
	// same report and period, killed mid-report, that this run removed.
	LeftoversRemoved int
}

// Run executes report over period on conn and writes the result to dir.
// The file appears whole or not at all: rows go to a temporary file in dir,
// which is synced and then renamed, so a crash mid-report leaves no partial
// output, and a rerun replaces the file with the same content. After the
// rename dir is synced too, so the file is still there after a power cut.
//
// A run killed mid-report (kill -9) leaves its temporary file behind; the
// next run of the same report and period removes it before writing, and
// CleanStaleTemp removes those of any report. The file is created with the
// mode os.Create would give it, 0666 less the umask (0644 under the usual
// umask 022), not os.CreateTemp's 0600.
func Run(ctx context.Context, conn *sql.Conn, r Report, period Period, dir string) (Result, error) {
	return RunWith(ctx, conn, r, period, dir, nil)
}

// RunWith is Run with a last word before the file is published: commit,
// when not nil, is called once the temporary file is whole and synced,
// just before the rename; if it returns an error, the temporary file is
// removed, no file is published and Run returns that error. A handler
// uses it to check that its run still counts (queues.CheckFence), so that
// a run another worker took over writes nothing over that worker's file.
func RunWith(ctx context.Context, conn *sql.Conn, r Report, period Period, dir string, commit func(context.Context) error) (Result, error) {
	rows, err := conn.QueryContext(ctx, r.Query, period.Start().Format(time.RFC3339), period.End().Format(time.RFC3339))
	if err != nil {
		return Result{}, fmt.Errorf("report %q: query: %w", r.Name, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return Result{}, fmt.Errorf("report %q: %w", r.Name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Result{}, fmt.Errorf("report %q: output directory: %w", r.Name, err)
	}
	leftovers := removeLeftovers(dir, r.Name, period)
	tmp, err := createTemp(dir, r.Name, period)
	if err != nil {
		return Result{}, fmt.Errorf("report %q: output directory: %w", r.Name, err)
	}
	defer func() {
		if tmp != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	w := csv.NewWriter(tmp)
	if err := w.Write(cols); err != nil {
		return Result{}, fmt.Errorf("report %q: write: %w", r.Name, err)
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	record := make([]string, len(cols))
	n := 0
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return Result{}, fmt.Errorf("report %q: scan: %w", r.Name, err)
		}
		for i, v := range vals {
			record[i] = formatValue(v)
		}
		if err := w.Write(record); err != nil {
			return Result{}, fmt.Errorf("report %q: write: %w", r.Name, err)
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return Result{}, fmt.Errorf("report %q: query: %w", r.Name, err)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return Result{}, fmt.Errorf("report %q: write: %w", r.Name, err)
	}
	if err := tmp.Sync(); err != nil {
		return Result{}, fmt.Errorf("report %q: sync: %w", r.Name, err)
	}
	if err := tmp.Close(); err != nil {
		return Result{}, fmt.Errorf("report %q: close: %w", r.Name, err)
	}
	if commit != nil {
		if err := commit(ctx); err != nil {
			return Result{}, fmt.Errorf("report %q: not published: %w", r.Name, err)
		}
	}
	final := filepath.Join(dir, FileName(r.Name, period))
	if err := os.Rename(tmp.Name(), final); err != nil {
		return Result{}, fmt.Errorf("report %q: %w", r.Name, err)
	}
	tmp = nil
	if err := syncDir(dir); err != nil {
		return Result{}, fmt.Errorf("report %q: sync output directory: %w", r.Name, err)
	}
	return Result{Path: final, Rows: n, LeftoversRemoved: leftovers}, nil
}

func formatValue(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case []byte:
		return string(x)
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	default:
		return fmt.Sprint(x)
	}
}
