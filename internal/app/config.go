// Package app wires the project's pieces into the programs: it loads the
// whole config file (pools, database, report catalog), connects Redis and
// the database, and registers the built-in job handlers.
package app

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/yamlx"
	"github.com/lci-labs/compartment/queues"
)

// Defaults of the application settings.
const (
	DefaultOutputDir       = "out/reports"
	DefaultReportRetention = 24 * time.Hour
)

// Config is the whole config file: the runner's settings (redis, pools,
// priorities, shutdown_timeout) plus the database and the reports.
type Config struct {
	queues.Config `yaml:",inline"`

	// Database is the database the pools share.
	Database database.Config `yaml:"database"`
	// Reports is the path of the report catalog, relative to this file.
	// Required.
	Reports string `yaml:"reports"`
	// OutputDir is where report files are written, relative to the working
	// directory. Defaults to out/reports.
	OutputDir string `yaml:"output_dir,omitempty"`
	// ReportMinDuration makes every report hold its database connection at
	// least this long. It stands in for the heavy queries of a real
	// month-end on the small demo dataset. Defaults to 0 (off).
	ReportMinDuration time.Duration `yaml:"report_min_duration,omitempty"`
	// ReportRetention keeps finished report jobs visible (for status and
	// month-end -wait) this long. Defaults to 24h.
	ReportRetention time.Duration `yaml:"report_retention,omitempty"`

	// Catalog is the loaded report catalog; set by Load.
	Catalog *reports.Catalog `yaml:"-"`
	// Path is the file the config came from; set by Load.
	Path string `yaml:"-"`
	// DatabaseURLFromEnv is true when DATABASE_URL replaced the file's
	// database settings; set by Load.
	DatabaseURLFromEnv bool `yaml:"-"`
}

// Load reads the config file strictly, applies REDIS_URL and DATABASE_URL
// from getenv (nil: no environment), fills defaults and validates
// everything, returning a *queues.ConfigError that lists every problem.
func Load(path string, getenv func(string) string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &queues.ConfigError{File: path, Problems: []string{err.Error()}}
	}
	var cfg Config
	if err := yamlx.DecodeStrict(data, &cfg); err != nil {
		return nil, &queues.ConfigError{File: path, Problems: []string{err.Error()}}
	}
	cfg.Path = path
	problems := cfg.Config.Prepare(path, queues.LoadOptions{Getenv: getenv, JobTypes: handlers.BuiltinJobTypes()})
	if getenv != nil {
		if u := getenv("DATABASE_URL"); u != "" {
			cfg.Database.URL, cfg.Database.SQLitePath = u, ""
			cfg.DatabaseURLFromEnv = true
		}
	}
	cfg.setDefaults()
	problems = append(problems, cfg.Database.Problems()...)
	problems = append(problems, cfg.problems()...)
	if len(problems) > 0 {
		return nil, &queues.ConfigError{File: path, Problems: problems}
	}
	return &cfg, nil
}

func (c *Config) setDefaults() {
	c.Database.SetDefaults()
	if c.OutputDir == "" {
		c.OutputDir = DefaultOutputDir
	}
	if c.ReportRetention == 0 {
		c.ReportRetention = DefaultReportRetention
	}
}

func (c *Config) problems() []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if c.Reports == "" {
		add("reports: the report catalog file is required")
	} else if cat, err := reports.LoadCatalog(queues.RelativeTo(c.Path, c.Reports)); err != nil {
		add("%v", err)
	} else {
		c.Catalog = cat
	}
	if c.Catalog != nil && c.Policy != nil {
		for _, name := range c.Policy.Reports() {
			if _, ok := c.Catalog.Get(name); !ok {
				add("priorities: report %q has a tier but is not in the report catalog %s", name, c.Reports)
			}
		}
	}
	if c.ReportMinDuration < 0 {
		add("report_min_duration: must be >= 0, got %s", c.ReportMinDuration)
	}
	if c.ReportRetention < time.Second {
		add("report_retention: must be at least 1s, got %s", c.ReportRetention)
	}
	if p, err := c.Route(handlers.TypeReport); err == nil && p.Tiers == nil {
		add("pool %q: runs reports, so it needs tiers", p.Name)
	}

	// Every job holds one connection, inside its pool's share: the pools'
	// sizes must fit the connection pool, or jobs queue for connections.
	if need, have, over := c.Overbooked(); over && !c.Database.AllowOverbooking {
		parts := make([]string, len(c.Pools))
		for i, p := range c.Pools {
			parts[i] = fmt.Sprintf("%s %d", p.Name, p.Size)
		}
		add("pools need %d database connections (%s) but database.max_connections is %d: raise max_connections, shrink the pools, or set database.allow_overbooking: true",
			need, strings.Join(parts, " + "), have)
	}
	return out
}

// Overbooked reports whether the pools may hold more connections than the
// database pool has (allowed only with allow_overbooking).
func (c *Config) Overbooked() (need, have int, over bool) {
	for _, p := range c.Pools {
		need += p.Size
	}
	return need, c.Database.MaxConnections, need > c.Database.MaxConnections
}

// Route returns the config of the pool jobType is routed to.
func (c *Config) Route(jobType string) (queues.PoolConfig, error) {
	for _, p := range c.Pools {
		for _, jt := range p.JobTypes {
			if jt == jobType {
				return p, nil
			}
		}
	}
	return queues.PoolConfig{}, fmt.Errorf("job type %q is routed to no pool", jobType)
}
