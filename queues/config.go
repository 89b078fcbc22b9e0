package queues

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/internal/yamlx"
	"github.com/lci-labs/compartment/priority"
)

// Defaults and limits of the worker configuration.
const (
	DefaultNamespace       = "compartment"
	DefaultShutdownTimeout = 30 * time.Second
	DefaultPollInterval    = time.Second // asynq's TaskCheckInterval default
	DefaultJobTimeout      = 30 * time.Minute
	DefaultMaxRetry        = 25
	DefaultEmbeddedAddr    = "127.0.0.1:16379"

	QueueOrderStrict   = "strict"
	QueueOrderWeighted = "weighted"

	// MinPollInterval keeps an idle pool from spinning on Redis.
	MinPollInterval = 10 * time.Millisecond
)

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Config is the worker's configuration: where Redis is, the business's
// priorities file, and the pools. Load it with Load, which fills defaults and
// validates; nothing should be built from a Config that did not pass Validate.
type Config struct {
	// Redis says which Redis holds the queues.
	Redis RedisConfig `yaml:"redis"`
	// Namespace prefixes every queue name, so several deployments (or tests)
	// can share one Redis. Defaults to "compartment".
	Namespace string `yaml:"namespace"`
	// Priorities is the path of the business's priorities file, relative to
	// this config file. Required when a pool has tiers.
	Priorities string `yaml:"priorities,omitempty"`
	// ShutdownTimeout bounds a graceful stop: jobs still running after it are
	// cancelled and go back to the head of their queue. Defaults to 30s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// Pools are the worker partitions, each its own bulkhead. Required.
	Pools []PoolConfig `yaml:"pools"`

	// Policy is the loaded priorities file; set by Load.
	Policy *priority.Policy `yaml:"-"`
	// RedisURLFromEnv is true when REDIS_URL replaced the file's Redis
	// settings; set by Load.
	RedisURLFromEnv bool `yaml:"-"`
}

// RedisConfig says which Redis to use: a URL, or an embedded in-process
// Redis that must be asked for explicitly.
type RedisConfig struct {
	// URL is a Redis URL: redis://[:password@]host:port[/db], or rediss://
	// for TLS. The REDIS_URL environment variable overrides it.
	URL string `yaml:"url,omitempty"`
	// Embedded runs an in-memory Redis inside the worker process, for trying
	// the project out. Everything in it is lost when the worker exits. It is
	// never used as a fallback for an unreachable real Redis. Defaults to
	// false.
	Embedded bool `yaml:"embedded,omitempty"`
	// EmbeddedAddr is where the embedded Redis listens (loopback only), so
	// cmd/enqueue in another terminal can reach it. Defaults to
	// 127.0.0.1:16379.
	EmbeddedAddr string `yaml:"embedded_addr,omitempty"`
	// WaitAtStart makes the worker retry an unreachable Redis at start, once
	// a second, for this long before it gives up. Defaults to 0: give up at
	// once, exit code 1. cmd/enqueue never waits.
	WaitAtStart time.Duration `yaml:"wait_at_start,omitempty"`
}

// PoolConfig describes one pool: a bulkhead with its own asynq server.
type PoolConfig struct {
	// Name identifies the pool in logs, queue names and errors. Required.
	Name string `yaml:"name"`
	// Size is the most jobs of this pool that run at once in one worker
	// process: the pool's bulkhead size and its asynq concurrency. Required;
	// must be >= 1.
	Size int `yaml:"size"`
	// JobTypes are the job types routed to this pool. Each job type belongs
	// to exactly one pool. Required.
	JobTypes []string `yaml:"job_types"`
	// Tiers are the business priority tiers this pool serves, each its own
	// queue. Their order comes from the priorities file, not from this list.
	// Omit for a pool with a single queue; an empty list is an error.
	Tiers []string `yaml:"tiers,omitempty"`
	// QueueOrder is "strict" (a higher tier is always taken first; lower
	// tiers wait while higher ones have work) or "weighted" (each tier's
	// queue is tried first with probability proportional to its weight, so
	// lower tiers are never starved but a higher tier can be overtaken).
	// Defaults to "strict".
	QueueOrder string `yaml:"queue_order,omitempty"`
	// Weights gives each tier its weight when QueueOrder is "weighted";
	// every tier needs one, each >= 1. Not allowed with "strict".
	Weights map[string]int `yaml:"weights,omitempty"`
	// PollInterval is how long an idle pool waits before looking for work
	// again (asynq's TaskCheckInterval; the actual wait is jittered between
	// half and one and a half times it). Lower it for latency-sensitive
	// pools. Defaults to 1s; at least 10ms.
	PollInterval time.Duration `yaml:"poll_interval"`
	// JobTimeout is how long one job may run before its context is
	// cancelled. asynq stores whole seconds, so it must be a whole number of
	// seconds, at least 1s. Defaults to 30m.
	JobTimeout time.Duration `yaml:"job_timeout"`
	// Scope says where Size holds: "cluster" (across every worker process
	// connected to the same Redis, through a gate in Redis, see
	// docs/CLUSTER.md) or "process" (per worker process, asynq's own
	// concurrency; two processes then run up to twice Size). Defaults to
	// "cluster".
	Scope string `yaml:"scope,omitempty"`
	// MaxRetry is how many times a failed job is retried before it is
	// archived. 0 means never retry. A worker crash while the job runs does
	// not count (up to CrashRetries crashes). Defaults to 25 when omitted.
	MaxRetry *int `yaml:"max_retry"`
}

// LoadOptions tune Load.
type LoadOptions struct {
	// Getenv reads environment variables (REDIS_URL). Defaults to no
	// environment; cmd/worker passes os.Getenv.
	Getenv func(string) string
	// JobTypes are the job types that have handlers. When set, a handler
	// whose job type no pool routes, and a routed job type without a
	// handler, are errors.
	JobTypes []string
}

// ConfigError lists every problem found in a config file.
type ConfigError struct {
	File     string
	Problems []string
}

func (e *ConfigError) Error() string {
	noun := "problems"
	if len(e.Problems) == 1 {
		noun = "problem"
	}
	return fmt.Sprintf("config %s: %d %s:\n  - %s", e.File, len(e.Problems), noun, strings.Join(e.Problems, "\n  - "))
}

// Load reads the config file at path strictly (unknown keys are errors),
// applies REDIS_URL, loads the priorities file it names, fills defaults and
// validates. Any problem is returned as a *ConfigError listing all of them.
func Load(path string, opts LoadOptions) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{File: path, Problems: []string{err.Error()}}
	}
	return Parse(data, path, opts)
}

// Parse is Load for config text already read; path names the file in errors
// and anchors the relative priorities path.
func Parse(data []byte, path string, opts LoadOptions) (*Config, error) {
	var cfg Config
	if err := yamlx.DecodeStrict(data, &cfg); err != nil {
		return nil, &ConfigError{File: path, Problems: []string{err.Error()}}
	}
	if problems := cfg.Prepare(path, opts); len(problems) > 0 {
		return nil, &ConfigError{File: path, Problems: problems}
	}
	return &cfg, nil
}

// Prepare finishes a decoded config: it applies REDIS_URL, loads the
// priorities file (relative to path), fills defaults and validates. It
// returns every problem found; the config is usable only when there are
// none. Programs that embed Config in a larger file call it after decoding.
func (c *Config) Prepare(path string, opts LoadOptions) []string {
	if opts.Getenv != nil {
		if u := opts.Getenv("REDIS_URL"); u != "" {
			c.Redis = RedisConfig{URL: u, WaitAtStart: c.Redis.WaitAtStart}
			c.RedisURLFromEnv = true
		}
	}
	var problems []string
	if c.Priorities != "" {
		pol, err := priority.Load(RelativeTo(path, c.Priorities))
		if err != nil {
			problems = append(problems, err.Error())
		} else {
			c.Policy = pol
		}
	}
	c.SetDefaults()
	return append(problems, c.problems(opts.JobTypes)...)
}

// RelativeTo resolves p against the directory of the file at path, unless p
// is absolute.
func RelativeTo(path, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(path), p)
}

// SetDefaults fills every zero field that has a default. It is the one place
// defaults are applied.
func (c *Config) SetDefaults() {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Redis.Embedded && c.Redis.EmbeddedAddr == "" {
		c.Redis.EmbeddedAddr = DefaultEmbeddedAddr
	}
	for i := range c.Pools {
		c.Pools[i].SetDefaults()
	}
}

// SetDefaults fills the pool's zero fields that have defaults.
func (p *PoolConfig) SetDefaults() {
	if p.Scope == "" {
		p.Scope = ScopeCluster
	}
	if p.QueueOrder == "" {
		p.QueueOrder = QueueOrderStrict
	}
	if p.PollInterval == 0 {
		p.PollInterval = DefaultPollInterval
	}
	if p.JobTimeout == 0 {
		p.JobTimeout = DefaultJobTimeout
	}
	if p.MaxRetry == nil {
		n := DefaultMaxRetry
		p.MaxRetry = &n
	}
}

// Validate checks a config whose defaults are filled and returns a
// *ConfigError listing every problem, or nil. jobTypes, when not nil, are the
// job types that have handlers.
func (c *Config) Validate(jobTypes []string) error {
	if p := c.problems(jobTypes); len(p) > 0 {
		return &ConfigError{File: "(in memory)", Problems: p}
	}
	return nil
}

func (c *Config) problems(jobTypes []string) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	out = append(out, c.Redis.problems()...)
	if !namePattern.MatchString(c.Namespace) {
		add("namespace: %q must match %s", c.Namespace, namePattern)
	}
	if c.ShutdownTimeout < 0 {
		add("shutdown_timeout: must be >= 0, got %s", c.ShutdownTimeout)
	}
	if len(c.Pools) == 0 {
		add("pools: at least one pool is required")
	}

	seenPool := map[string]bool{}
	routedTo := map[string]string{} // job type -> pool name
	routedAt := map[string]int{}    // job type -> pool index
	for i, p := range c.Pools {
		out = append(out, poolProblems(i, p, c.Priorities != "", c.Policy)...)
		if p.Name != "" && seenPool[p.Name] {
			add("pool %q: duplicate pool name", p.Name)
		}
		seenPool[p.Name] = true
		for _, jt := range p.JobTypes {
			if strings.TrimSpace(jt) == "" {
				continue // reported by poolProblems
			}
			if other, ok := routedTo[jt]; ok {
				if routedAt[jt] == i {
					add("pool %q: job type %q is listed twice", p.Name, jt)
				} else {
					add("job type %q is routed to two pools: %q and %q", jt, other, p.Name)
				}
				continue
			}
			routedTo[jt] = p.Name
			routedAt[jt] = i
		}
	}

	if jobTypes != nil {
		have := map[string]bool{}
		for _, jt := range jobTypes {
			have[jt] = true
			if _, ok := routedTo[jt]; !ok {
				add("job type %q has a handler but is routed to no pool", jt)
			}
		}
		for _, jt := range sortedKeys(routedTo) {
			if !have[jt] {
				add("pool %q: job type %q has no handler (known job types: %q)", routedTo[jt], jt, jobTypes)
			}
		}
	}
	return out
}

// poolProblems checks one pool on its own (defaults filled): index i names a
// pool without a name; hasPriorities says whether a priorities file is
// configured, and policy is the loaded one (nil if it failed to load).
func poolProblems(i int, p PoolConfig, hasPriorities bool, policy *priority.Policy) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	label := fmt.Sprintf("pool %q", p.Name)
	if p.Name == "" {
		label = fmt.Sprintf("pools[%d]", i)
		add("%s: name is required", label)
	} else if !namePattern.MatchString(p.Name) {
		add("%s: name must match %s", label, namePattern)
	}
	if p.Size < 1 {
		add("%s: size must be >= 1, got %d", label, p.Size)
	}
	if len(p.JobTypes) == 0 {
		add("%s: job_types must list at least one job type", label)
	}
	for _, jt := range p.JobTypes {
		if strings.TrimSpace(jt) == "" {
			add("%s: job_types: an empty job type", label)
		}
	}
	if p.PollInterval < MinPollInterval {
		add("%s: poll_interval must be >= %s, got %s", label, MinPollInterval, p.PollInterval)
	}
	switch {
	case p.JobTimeout < time.Second:
		add("%s: job_timeout must be at least 1s, got %s (asynq stores whole seconds and would silently use its 30m default)", label, p.JobTimeout)
	case p.JobTimeout%time.Second != 0:
		add("%s: job_timeout must be a whole number of seconds, got %s (asynq stores whole seconds)", label, p.JobTimeout)
	}
	if p.MaxRetry != nil && *p.MaxRetry < 0 {
		add("%s: max_retry must be >= 0, got %d", label, *p.MaxRetry)
	}
	if p.Scope != ScopeCluster && p.Scope != ScopeProcess {
		add("%s: scope must be %q or %q, got %q", label, ScopeCluster, ScopeProcess, p.Scope)
	}
	switch p.QueueOrder {
	case QueueOrderStrict:
		if len(p.Weights) > 0 {
			add("%s: weights are only used with queue_order: weighted", label)
		}
	case QueueOrderWeighted:
		if p.Tiers == nil {
			add("%s: queue_order: weighted needs tiers", label)
		}
	default:
		add("%s: queue_order must be %q or %q, got %q", label, QueueOrderStrict, QueueOrderWeighted, p.QueueOrder)
	}
	if p.Tiers == nil {
		return out
	}
	if len(p.Tiers) == 0 {
		add("%s: tiers: the list is empty (omit tiers for a pool with a single queue)", label)
		return out
	}
	if policy == nil {
		if !hasPriorities {
			add("%s: tiers need a priorities file (set priorities: FILE)", label)
		}
		return out // the priorities file failed to load; that is reported already
	}
	seen := map[string]bool{}
	for _, t := range p.Tiers {
		if seen[t] {
			add("%s: tier %q is listed twice", label, t)
		}
		seen[t] = true
		if !policy.Has(t) {
			add("%s: unknown tier %q (the priorities file defines %q)", label, t, policy.Tiers())
		}
	}
	if !seen[policy.Default()] {
		add("%s: tiers must include the default tier %q, where reports without a tier go", label, policy.Default())
	}
	if p.QueueOrder == QueueOrderWeighted {
		for _, t := range p.Tiers {
			if w, ok := p.Weights[t]; !ok {
				add("%s: weights: tier %q needs a weight", label, t)
			} else if w < 1 {
				add("%s: weights: tier %q must be >= 1, got %d", label, t, w)
			}
		}
		for _, t := range sortedKeys(p.Weights) {
			if !seen[t] {
				add("%s: weights: tier %q is not one of the pool's tiers", label, t)
			}
		}
	}
	return out
}

func (r RedisConfig) problems() []string {
	if r.WaitAtStart < 0 {
		return []string{fmt.Sprintf("redis: wait_at_start must be >= 0, got %s", r.WaitAtStart)}
	}
	switch {
	case r.Embedded && r.URL != "":
		return []string{"redis: set either url or embedded: true, not both"}
	case r.Embedded:
		host, _, err := net.SplitHostPort(r.EmbeddedAddr)
		if err != nil {
			return []string{fmt.Sprintf("redis: embedded_addr %q: %v", r.EmbeddedAddr, err)}
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return []string{fmt.Sprintf("redis: embedded_addr %q must be a loopback address (the embedded Redis has no password)", r.EmbeddedAddr)}
		}
	case r.URL == "":
		return []string{"redis: set url (or the REDIS_URL environment variable), or embedded: true to try it out in memory"}
	default:
		if _, err := redis.ParseURL(r.URL); err != nil {
			return []string{fmt.Sprintf("redis: url %q: %v", RedactURL(r.URL), err)}
		}
	}
	return nil
}

// Addr returns the address the worker connects to, for messages.
func (r RedisConfig) Addr() string {
	if r.Embedded {
		return r.EmbeddedAddr
	}
	if o, err := redis.ParseURL(r.URL); err == nil {
		return o.Addr
	}
	return RedactURL(r.URL)
}

// RedisOptions returns go-redis options for the configured Redis.
func (r RedisConfig) RedisOptions() (*redis.Options, error) {
	if r.Embedded {
		return &redis.Options{Addr: r.EmbeddedAddr}, nil
	}
	return redis.ParseURL(r.URL)
}

// RedactURL hides the password in a Redis URL so it can be logged.
func RedactURL(raw string) string {
	i := strings.Index(raw, "://")
	at := strings.LastIndex(raw, "@")
	if i < 0 || at < i {
		return raw
	}
	userinfo := raw[i+3 : at]
	if c := strings.Index(userinfo, ":"); c >= 0 {
		userinfo = userinfo[:c+1] + "***"
	} else {
		userinfo = "***"
	}
	return raw[:i+3] + userinfo + raw[at:]
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
