// Package app is the command layer: it reads the worker config file
// (strictly, with the Redis and DATABASE_URL environment overrides and
// paths relative to the file), maps it onto the engine's config, connects Redis and the
// database, and registers the story's job handlers. File I/O happens here:
// Load reads every file the config names, each checked on its own, before
// it fills the defaults and validates the config as a whole; the engine
// (package queues) never reads a file.
package app

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/handlers"
	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/internal/reports"
	"github.com/lci-labs/compartment/internal/yamlx"
	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

// Defaults of the application settings.
const (
	DefaultOutputDir       = "out/reports"
	DefaultReportRetention = 24 * time.Hour
)

// File is the worker config file as written: the engine's settings
// (namespace, priorities, shutdown_timeout, delayed_check_interval, pools)
// plus Redis, the database, the reports, the schedules and the HTTP
// listener. Zero fields take the defaults docs/CONFIG.md lists, where
// every key is described.
type File struct {
	// Redis says which Redis holds the queues.
	Redis RedisConfig `yaml:"redis"`
	// Namespace prefixes every queue name. Defaults to "compartment".
	Namespace string `yaml:"namespace,omitempty"`
	// Priorities is the path of the business's priorities file, relative to
	// this file. Required when a pool has tiers.
	Priorities string `yaml:"priorities,omitempty"`
	// ShutdownTimeout bounds a graceful stop. Defaults to 30s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout,omitempty"`
	// RecoverAfter is how long a running job's lease may go unrenewed
	// before another worker takes the job back (queues.Config.RecoverAfter).
	// Defaults to 15s; at least 5s.
	RecoverAfter time.Duration `yaml:"recover_after,omitempty"`
	// DelayedCheckInterval is how often due retries, scheduled jobs and
	// jobs held back by a breaker move back to their queue
	// (queues.Config.DelayedCheckInterval). Defaults to 5s.
	DelayedCheckInterval time.Duration `yaml:"delayed_check_interval,omitempty"`
	// Pools are the worker partitions. Required.
	Pools []PoolFile `yaml:"pools"`
	// Dependencies are what the pools' jobs draw on, each with the
	// capacity the workers may hold of it at once (queues.Dependency);
	// each pool says its use (uses). database.allow_overbooking lifts the
	// budget check. Optional.
	Dependencies []DependencyFile `yaml:"dependencies,omitempty"`
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
	// Schedules are month-end plans that enqueue themselves (schedule.go).
	// Optional.
	Schedules []ScheduleFile `yaml:"schedules,omitempty"`
	// HTTP is the optional listener for metrics, probes and the dashboard.
	HTTP HTTPConfig `yaml:"http,omitempty"`
}

// PoolFile is one pool as written in the file: one key for each setting
// of queues.PoolConfig, named as the engine names it (its json tag), and
// its rates and breaker likewise; engine maps it onto a queues.PoolConfig.
// Each key means what its queues.PoolConfig field says and takes the same
// default, except max_retry: 0 means never retry (queues.NoRetry).
// docs/CONFIG.md describes every key; a test fails when the engine has a
// setting without a key here, or a key here does not reach the engine.
type PoolFile struct {
	Name         string         `yaml:"name"`
	Size         int            `yaml:"size"`
	MaxSize      int            `yaml:"max_size,omitempty"`
	JobTypes     []string       `yaml:"job_types"`
	Tiers        []string       `yaml:"tiers,omitempty"`
	QueueOrder   string         `yaml:"queue_order,omitempty"`
	Weights      map[string]int `yaml:"weights,omitempty"`
	PollInterval time.Duration  `yaml:"poll_interval,omitempty"`
	DequeueLoops int            `yaml:"dequeue_loops,omitempty"`
	JobTimeout   time.Duration  `yaml:"job_timeout,omitempty"`
	Scope        string         `yaml:"scope,omitempty"`
	JobLog       string         `yaml:"job_log,omitempty"`
	// MaxRetry: omitted means the default (25); 0 means never retry.
	MaxRetry *int `yaml:"max_retry,omitempty"`
	// The door (see queues.PoolConfig and docs/DOOR.md).
	MaxBacklog        int                 `yaml:"max_backlog,omitempty"`
	TierLimits        map[string]int      `yaml:"tier_limits,omitempty"`
	BacklogWait       time.Duration       `yaml:"backlog_wait,omitempty"`
	EnqueueRate       *RateFile           `yaml:"enqueue_rate,omitempty"`
	EnqueueRatePerKey *RateFile           `yaml:"enqueue_rate_per_key,omitempty"`
	JobTypeRates      map[string]RateFile `yaml:"job_type_rates,omitempty"`
	StartRate         *RateFile           `yaml:"start_rate,omitempty"`
	// Steering (see queues.PoolConfig and docs/STEERING.md).
	Reserved map[string]int           `yaml:"reserved,omitempty"`
	MaxWait  map[string]time.Duration `yaml:"max_wait,omitempty"`
	// Breaker is the pool's circuit breaker (docs/BREAKER.md). nil: none;
	// "breaker:" with no value, like "breaker: {}", is one with every
	// default.
	Breaker *BreakerFile `yaml:"breaker,omitempty"`
	// Dependencies (see queues.PoolConfig and docs/DEPENDENCIES.md).
	Uses     map[string]int `yaml:"uses,omitempty"`
	Adaptive *AdaptiveFile  `yaml:"adaptive,omitempty"`
}

// AdaptiveFile is a pool's adaptive limit as written, one key for each
// field of queues.AdaptiveConfig.
type AdaptiveFile struct {
	Min       int           `yaml:"min"`
	Window    time.Duration `yaml:"window,omitempty"`
	Tolerance float64       `yaml:"tolerance,omitempty"`
}

func (a *AdaptiveFile) engine() *queues.AdaptiveConfig {
	if a == nil {
		return nil
	}
	return &queues.AdaptiveConfig{Min: a.Min, Window: a.Window, Tolerance: a.Tolerance}
}

// DependencyFile is a dependency as written (queues.Dependency).
type DependencyFile struct {
	Name     string `yaml:"name"`
	Capacity int    `yaml:"capacity"`
}

// RateFile is a rate limit as written, one key for each field of
// queues.Rate: at most limit per interval, with bursts of up to burst
// (default: limit).
type RateFile struct {
	Limit int           `yaml:"limit"`
	Per   time.Duration `yaml:"per"`
	Burst int           `yaml:"burst,omitempty"`
}

func (r *RateFile) engine() *queues.Rate {
	if r == nil {
		return nil
	}
	return &queues.Rate{Limit: r.Limit, Per: r.Per, Burst: r.Burst}
}

// engine maps the pool onto the engine's config.
func (p PoolFile) engine() queues.PoolConfig {
	pc := queues.PoolConfig{
		Name: p.Name, Size: p.Size, MaxSize: p.MaxSize, JobTypes: p.JobTypes, Tiers: p.Tiers,
		QueueOrder: queues.QueueOrder(p.QueueOrder), Weights: p.Weights,
		PollInterval: p.PollInterval, DequeueLoops: p.DequeueLoops, JobTimeout: p.JobTimeout, Scope: queues.Scope(p.Scope),
		JobLog:     queues.JobLog(p.JobLog),
		MaxBacklog: p.MaxBacklog, TierLimits: p.TierLimits, BacklogWait: p.BacklogWait,
		EnqueueRate: p.EnqueueRate.engine(), EnqueueRatePerKey: p.EnqueueRatePerKey.engine(),
		StartRate: p.StartRate.engine(), Breaker: p.Breaker.engine(),
		Reserved: p.Reserved, MaxWait: p.MaxWait,
		Uses: p.Uses, Adaptive: p.Adaptive.engine(),
	}
	if p.JobTypeRates != nil {
		pc.JobTypeRates = map[string]queues.Rate{}
		for jt, r := range p.JobTypeRates {
			pc.JobTypeRates[jt] = *r.engine()
		}
	}
	switch {
	case p.MaxRetry == nil:
	case *p.MaxRetry == 0:
		pc.MaxRetry = queues.NoRetry
	case *p.MaxRetry < 0:
		// Reported by appProblems; the engine sees the default.
	default:
		pc.MaxRetry = *p.MaxRetry
	}
	return pc
}

// Config is a loaded and validated config file.
type Config struct {
	// File is the file as read, with the Redis environment variables and
	// DATABASE_URL applied, the Redis password files read, and
	// its own defaults filled.
	File
	// Path is the file the config came from.
	Path string
	// Engine is the engine's part, defaults filled, without handlers.
	Engine queues.Config
	// Policy is the loaded priorities file, or nil.
	Policy *priority.Policy
	// Catalog is the loaded report catalog.
	Catalog *reports.Catalog
	// Schedules are the loaded schedules, with their plans (File.Schedules
	// as written).
	Schedules []*Schedule
	// RedisURLFromEnv is true when REDIS_URL replaced the file's Redis
	// settings; DatabaseURLFromEnv when DATABASE_URL replaced its database.
	RedisURLFromEnv bool
	// RedisFromEnv names the Redis environment variables that were applied
	// (REDIS_URL, REDIS_SENTINEL_*, REDIS_CLUSTER_ADDRS, REDIS_PASSWORD).
	RedisFromEnv       []string
	DatabaseURLFromEnv bool
}

// Load reads the config file at path strictly (unknown keys, and a number
// such as 2.9 for an integer setting, are errors),
// applies the Redis environment variables (REDIS_URL, REDIS_SENTINEL_*,
// REDIS_CLUSTER_ADDRS, REDIS_PASSWORD) and DATABASE_URL from getenv (nil: no
// environment), reads every file it names (relative to it: the Redis
// password and CA files, the HTTP token file, the priorities file, the
// report catalog and the schedules' plans), then fills defaults and
// validates everything. Any problem is returned as
// a *queues.ConfigError that lists all of them, naming the file.
func Load(path string, getenv func(string) string) (*Config, error) {
	cfg, problems, _, err := load(path, getenv)
	if err != nil {
		return nil, err
	}
	if len(problems) > 0 {
		return nil, &queues.ConfigError{Source: path, Problems: problems}
	}
	return cfg, nil
}

// LoadForReading loads the config at path as Load does, for a command that
// only reads the queues' state (enqueue status, schedules, a breaker's
// state). Problems that concern only running jobs or their database (the
// database settings and the connection budget, the report settings,
// max_retry, the HTTP listener) do not stop it: it returns the config with
// them as warnings, and the caller must then only read with it, never
// enqueue, change a pool or run a worker. Any other problem (the Redis
// settings, an unknown key, invalid YAML, pools that cannot be built, a
// priorities file, report catalog or schedule that cannot be read) is an
// error, as from Load, that lists every problem of both kinds.
func LoadForReading(path string, getenv func(string) string) (*Config, []string, error) {
	cfg, problems, notReading, err := load(path, getenv)
	switch {
	case err != nil:
		return nil, nil, err
	case len(problems) > len(notReading):
		return nil, nil, &queues.ConfigError{Source: path, Problems: problems}
	}
	return cfg, notReading, nil
}

// load reads and checks the config at path (see Load). It returns every
// problem in the file's order, and, among them, those that do not concern
// reading the queues' state (see LoadForReading); err is a
// *queues.ConfigError when the file cannot be read or parsed at all.
func load(path string, getenv func(string) string) (_ *Config, problems, notReading []string, _ error) {
	fail := func(problems ...string) (*Config, []string, []string, error) {
		return nil, nil, nil, &queues.ConfigError{Source: path, Problems: problems}
	}
	data, err := yamlx.ReadFile(path)
	if err != nil {
		return fail(err.Error())
	}
	cfg := &Config{Path: path}
	// Unknown keys, and numbers not written as integers for integer
	// settings, are problems like any other: the rest of the file is still
	// checked, so the user sees every problem at once.
	problems, err = yamlx.DecodeStrictAll(data, &cfg.File)
	if err != nil {
		return fail(err.Error())
	}
	// "breaker:" with no value turns the breaker on with its defaults, as
	// "breaker: {}" does: yaml alone reads it as no breaker at all.
	empty := yamlx.EmptyKeys(data)
	for i := range cfg.Pools {
		if cfg.Pools[i].Breaker == nil && empty[fmt.Sprintf("pools[%d].breaker", i)] {
			cfg.Pools[i].Breaker = &BreakerFile{}
		}
	}
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	used, envProblems := cfg.Redis.applyEnv(getenv)
	problems = append(problems, envProblems...)
	cfg.RedisFromEnv = used
	cfg.RedisURLFromEnv = cfg.Redis.URL != "" && getenv(EnvRedisURL) != ""
	problems = append(problems, cfg.Redis.loadSecrets(path)...)
	problems = append(problems, cfg.Redis.loadTLS(path)...)
	if u := getenv("DATABASE_URL"); u != "" {
		cfg.Database.URL, cfg.Database.SQLitePath = u, ""
		cfg.DatabaseURLFromEnv = true
	}

	// Every file the config names is read (and checked on its own) before
	// the config is validated as a whole. The listener's problems concern
	// the worker only, not reading the queues' state.
	httpProblems := cfg.HTTP.load(path)
	problems = append(problems, httpProblems...)
	notReading = append(notReading, httpProblems...)
	if cfg.Priorities != "" {
		if cfg.Policy, err = reports.LoadPriorities(relativeTo(path, cfg.Priorities)); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if cfg.Reports == "" {
		problems = append(problems, "reports: the report catalog file is required")
	} else if cfg.Catalog, err = reports.LoadCatalog(relativeTo(path, cfg.Reports)); err != nil {
		problems = append(problems, err.Error())
	}
	problems = append(problems, cfg.loadSchedules()...)

	cfg.fillDefaults()
	problems = append(problems, cfg.Redis.problems()...)
	// The database, the report settings and the listener matter to the
	// jobs and the worker only, not to reading the queues' state.
	db := cfg.Database.Problems()
	notReading = append(notReading, db...)
	problems = append(problems, db...)
	problems = append(problems, cfg.engineProblems()...)
	app := cfg.appProblems()
	notReading = append(notReading, app...)
	problems = append(problems, app...)
	return cfg, problems, notReading, nil
}

// relativeTo resolves p against the directory of the file at path, unless p
// is absolute.
func relativeTo(path, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(path), p)
}

func (c *Config) fillDefaults() {
	c.Redis = c.Redis.withDefaults()
	c.Database.SetDefaults()
	if c.OutputDir == "" {
		c.OutputDir = DefaultOutputDir
	}
	if c.ReportRetention == 0 {
		c.ReportRetention = DefaultReportRetention
	}
	pools := make([]queues.PoolConfig, len(c.Pools))
	for i, p := range c.Pools {
		pools[i] = p.engine()
	}
	c.Engine = queues.Config{
		Namespace: c.Namespace, Tiers: c.Policy, Pools: pools, ShutdownTimeout: c.ShutdownTimeout,
		DelayedCheckInterval: c.DelayedCheckInterval, RecoverAfter: c.RecoverAfter,
		AllowOverbooking: c.Database.AllowOverbooking,
	}.WithDefaults()
	for _, d := range c.Dependencies {
		c.Engine.Dependencies = append(c.Engine.Dependencies, queues.Dependency{Name: d.Name, Capacity: d.Capacity})
	}
	c.Engine.Logger = nil // the commands set their own
}

// engineProblems validates the engine's part. Without a priorities policy
// (none configured, or the file failed to load, which is reported already),
// pools with tiers are checked without their tiers, and the missing file is
// said in the file's own words.
func (c *Config) engineProblems() []string {
	e := c.Engine
	var out []string
	if c.Policy == nil {
		e.Pools = append([]queues.PoolConfig(nil), e.Pools...)
		for i, p := range e.Pools {
			if p.Tiers == nil {
				continue
			}
			if c.Priorities == "" {
				out = append(out, fmt.Sprintf("pool %q: tiers need a priorities file (set priorities: FILE)", p.Name))
			}
			e.Pools[i].Tiers, e.Pools[i].Weights, e.Pools[i].QueueOrder = nil, nil, queues.QueueOrderStrict
			e.Pools[i].Reserved, e.Pools[i].MaxWait = nil, nil
		}
	}
	e.Handlers = c.handlerSet()
	return append(out, e.WithDefaults().Problems()...)
}

// handlerSet is a Handlers with the story's job types, for validation: the
// config must route each of them, and only them (an optional one, such as
// the month-end bundle, when a pool serves it).
func (c *Config) handlerSet() *queues.Handlers {
	h := queues.NewHandlers()
	for _, jt := range handlers.JobTypes() {
		h.HandleFunc(jt, func(context.Context, *asynq.Task) error { return nil })
	}
	for _, jt := range handlers.OptionalJobTypes() {
		if _, ok := c.route(jt); ok {
			h.HandleFunc(jt, func(context.Context, *asynq.Task) error { return nil })
		}
	}
	return h
}

func (c *Config) appProblems() []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if c.Catalog != nil && c.Policy != nil {
		for _, name := range c.Policy.Names() {
			if _, ok := c.Catalog.Get(name); !ok {
				add("priorities: report %q has a tier but is not in the report catalog %s", name, c.Reports)
			}
		}
	}
	for _, p := range c.Pools {
		if p.MaxRetry != nil && *p.MaxRetry < 0 {
			add("pool %q: max_retry must be >= 0 (0: never retry), got %d", p.Name, *p.MaxRetry)
		}
	}
	if c.ReportMinDuration < 0 {
		add("report_min_duration: must be >= 0, got %s", c.ReportMinDuration)
	}
	if c.ReportRetention < time.Second {
		add("report_retention: must be at least 1s, got %s", c.ReportRetention)
	}
	if p, ok := c.route(handlers.TypeReport); ok {
		switch {
		case p.Tiers == nil:
			add("pool %q: runs reports, so it needs tiers", p.Name)
		case c.Policy != nil:
			// Every tier a report can be given must be served by the pool,
			// or the report is refused at enqueue; say so at start.
			served := map[string]bool{}
			for _, t := range p.Tiers {
				served[t] = true
			}
			for _, name := range c.Policy.Names() {
				if t, _ := c.Policy.Assigned(name); !served[t] {
					add("pool %q: report %q has tier %q in the priorities file, which the pool does not serve (its tiers: %q)", p.Name, name, t, p.Tiers)
				}
			}
		}
	}

	if d := c.Database.Dependency; d != "" && !slices.ContainsFunc(c.Dependencies, func(f DependencyFile) bool { return f.Name == d }) {
		names := make([]string, len(c.Dependencies))
		for i, f := range c.Dependencies {
			names[i] = f.Name
		}
		add("database: dependency %q is not one of the dependencies (%q)", d, names)
	}
	// Every job holds one connection, inside its pool's share: the pools'
	// sizes must fit the connection pool, or jobs queue for connections.
	if need, have, over := c.Overbooked(); over && !c.Database.AllowOverbooking {
		parts := make([]string, len(c.Pools))
		for i, p := range c.Pools {
			parts[i] = fmt.Sprintf("%s %d", p.Name, p.engine().Concurrency())
		}
		add("pools need %d database connections (%s) but database.max_connections is %d: raise max_connections, shrink the pools, or set database.allow_overbooking: true",
			need, strings.Join(parts, " + "), have)
	}
	return out
}

// Overbooked reports whether the pools may hold more connections than the
// database pool has (allowed only with allow_overbooking). A pool needs as
// many as it may run at once in one process: its max_size for a
// cluster-scoped pool (it may be resized up to that), its size otherwise.
func (c *Config) Overbooked() (need, have int, over bool) {
	for _, n := range c.Shares() {
		need += n
	}
	return need, c.Database.MaxConnections, need > c.Database.MaxConnections
}

// Shares gives each pool its share of the database connections: as many
// as it may run at once in one process (queues.PoolConfig.Concurrency).
func (c *Config) Shares() map[string]int {
	out := map[string]int{}
	for _, p := range c.Pools {
		out[p.Name] = p.engine().Concurrency()
	}
	return out
}

// StepProblems names what is wrong with a run's step (a plan's or a
// schedule's on_complete or on_failure) for these pools: a job type no
// pool serves, a tier its pool does not serve. Each prefixed with label.
func (c *Config) StepProblems(label string, s *reports.Step) []string {
	if strings.TrimSpace(s.JobType) == "" {
		return nil // said by Step.Problems
	}
	p, ok := c.route(s.JobType)
	switch {
	case !ok:
		var types []string
		for _, p := range c.Pools {
			types = append(types, p.JobTypes...)
		}
		return []string{fmt.Sprintf("%s: job type %q is routed to no pool (job types: %q)", label, s.JobType, types)}
	case s.Tier != "" && p.Tiers == nil:
		return []string{fmt.Sprintf("%s: tier %q: pool %q has no tiers", label, s.Tier, p.Name)}
	case s.Tier != "" && !slices.Contains(p.Tiers, s.Tier):
		return []string{fmt.Sprintf("%s: tier %q: pool %q does not serve it (its tiers: %q)", label, s.Tier, p.Name, p.Tiers)}
	}
	return nil
}

func (c *Config) route(jobType string) (PoolFile, bool) {
	for _, p := range c.Pools {
		for _, jt := range p.JobTypes {
			if jt == jobType {
				return p, true
			}
		}
	}
	return PoolFile{}, false
}
