package app

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/yamlx"
	"github.com/lci-labs/compartment/priority"
	"github.com/lci-labs/compartment/queues"
)

// configKeys is the file key of each field of queues.Config that the
// config file sets. queues.Config carries no tags (its pools' types do:
// their json tags are the engine's names for its settings).
var configKeys = map[string]string{
	"Namespace": "namespace",
	// The file names the priorities file; Load reads it into the policy.
	"Tiers":                "priorities",
	"Pools":                "pools",
	"ShutdownTimeout":      "shutdown_timeout",
	"DelayedCheckInterval": "delayed_check_interval",
	"RecoverAfter":         "recover_after",
	"Dependencies":         "dependencies",
}

// notInFile lists the engine's settings that the config file deliberately
// has no key for, each with the reason. Every other exported field of
// queues.Config and of the pool's config types needs a key.
var notInFile = map[string]string{
	"queues.Config.Handlers":         "Go code: the commands register the story's handlers (package handlers)",
	"queues.Config.Middleware":       "Go code wrapping the handlers",
	"queues.Config.Logger":           "the commands build the logger from their -log-* flags",
	"queues.Config.RetryDelay":       "a Go function; the file keeps asynq's backoff",
	"queues.Config.Clock":            "a test hook that skews one process's clock",
	"queues.Config.Observer":         "the worker sets its Prometheus metrics when it serves http",
	"queues.Config.OnBreakerChange":  "a Go function; the worker sets its metrics' counter of breaker changes when it serves http",
	"queues.Config.OnRecover":        "a Go function; the worker sets its metrics' counter of recovered jobs when it serves http",
	"queues.Config.TracerProvider":   "set from the standard OTEL_* environment variables (docs/TRACING.md), as every OpenTelemetry SDK is",
	"queues.Config.Propagator":       "W3C Trace Context; the engine is at both ends of the trip, so there is nothing to choose",
	"queues.Config.AllowOverbooking": "database.allow_overbooking sets it: one switch lifts both the connection-pool check and the dependency budgets",
}

// yamlFields maps each yaml key of the struct type t to its field.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for f := range t.Fields() {
		if name := tagName(f, "yaml"); f.IsExported() && name != "-" {
			out[name] = f
		}
	}
	return out
}

// tagName is the key a struct tag gives field f (the lower-cased field
// name when the tag names none, as yaml does).
func tagName(f reflect.StructField, tag string) string {
	name, _, _ := strings.Cut(f.Tag.Get(tag), ",")
	if name == "" {
		return strings.ToLower(f.Name)
	}
	return name
}

// valueType is what a key of type t holds one or many of: t without its
// pointers, slices and maps.
func valueType(t reflect.Type) reflect.Type {
	for {
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Map:
			t = t.Elem()
		default:
			return t
		}
	}
}

var queuesPkg = reflect.TypeFor[queues.Config]().PkgPath()

// missingKeys lists the settings of the engine's struct type engine (by
// their json tags, the engine's names for them) that the file's struct type
// file has no yaml key for, recursing into the engine's nested config
// types (rates, the breaker). prefix is the keys' path in the file.
func missingKeys(engine, file reflect.Type, prefix string, seen map[string]bool) []string {
	var out []string
	fields := yamlFields(file)
	for f := range engine.Fields() {
		if !f.IsExported() {
			continue
		}
		name := engine.String() + "." + f.Name
		if _, ok := notInFile[name]; ok {
			seen[name] = true
			continue
		}
		key := tagName(f, "json")
		if f.Tag.Get("json") == "" || key == "-" {
			out = append(out, fmt.Sprintf("%s has no json tag naming its config key", name))
			continue
		}
		ff, ok := fields[key]
		if !ok {
			out = append(out, fmt.Sprintf("%s%s (%s) has no key in the config file: add it to %s, map it onto the engine's config and document it in docs/CONFIG.md",
				prefix, key, name, file))
			continue
		}
		if et := valueType(f.Type); et.Kind() == reflect.Struct && et.PkgPath() == queuesPkg {
			sub := prefix + key + "."
			if f.Type.Kind() == reflect.Map {
				sub = prefix + key + ".*."
			}
			out = append(out, missingKeys(et, valueType(ff.Type), sub, seen)...)
		}
	}
	return out
}

// Every setting of the engine a file can express has a key in the config
// file: a setting added to queues.PoolConfig, its rates or its breaker,
// or to queues.Config, fails here until the file accepts it (or it is
// listed in notInFile with the reason).
func TestFileHasEveryEngineSetting(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	var missing []string
	top := yamlFields(reflect.TypeFor[File]())
	ct := reflect.TypeFor[queues.Config]()
	for f := range ct.Fields() {
		if !f.IsExported() {
			continue
		}
		name := ct.String() + "." + f.Name
		if _, ok := notInFile[name]; ok {
			seen[name] = true
			continue
		}
		key, ok := configKeys[f.Name]
		if !ok {
			missing = append(missing, fmt.Sprintf("%s has no key in the config file: add it to File and to configKeys, or to notInFile with the reason", name))
			continue
		}
		if _, ok := top[key]; !ok {
			missing = append(missing, fmt.Sprintf("%s: the config file has no key %s", name, key))
		}
	}
	missing = append(missing, missingKeys(reflect.TypeFor[queues.PoolConfig](), reflect.TypeFor[PoolFile](), "pools[].", seen)...)
	require.Emptyf(t, missing, "engine settings without a key in the config file:\n%s", strings.Join(missing, "\n"))

	for name := range notInFile {
		require.Truef(t, seen[name], "notInFile names %s, which the engine does not have", name)
	}
	for name := range configKeys {
		_, ok := ct.FieldByName(name)
		require.Truef(t, ok, "configKeys names queues.Config.%s, which the engine does not have", name)
	}
}

// everyKey sets every engine key of the config file to a value that is
// neither zero nor the default, each different from its neighbours, so a
// key dropped or crossed on its way to the engine shows.
const everyKey = `
namespace: every-key
priorities: priorities.yaml
shutdown_timeout: 41s
delayed_check_interval: 3s
recover_after: 12s
dependencies: [{name: db, capacity: 30}]
pools:
  - name: all
    size: 3
    max_size: 9
    job_types: [alpha, beta]
    tiers: [high, low]
    queue_order: weighted
    weights: {high: 5, low: 2}
    poll_interval: 250ms
    dequeue_loops: 4
    job_timeout: 90s
    scope: process
    job_log: "off"
    max_retry: 7
    max_backlog: 50
    tier_limits: {low: 30}
    backlog_wait: 2s
    enqueue_rate: {limit: 10, per: 1s, burst: 12}
    enqueue_rate_per_key: {limit: 3, per: 1m, burst: 4}
    job_type_rates:
      alpha: {limit: 100, per: 1h, burst: 5}
    start_rate: {limit: 6, per: 2s, burst: 2}
    reserved: {high: 1}
    max_wait: {low: 10m}
    breaker: {failure_ratio: 0.25, min_calls: 4, window: 2m, slow_call: 3s, cool_down: 7s, max_cool_down: 9m, probes: 2}
    uses: {db: 2}
    adaptive: {min: 2, window: 3s, tolerance: 1.8}
`

// zeroes lists the settings of v (a config struct) that are zero, with
// their path: a pointer, slice or map counts as set when it holds
// something, and what it holds is looked into.
func zeroes(v reflect.Value, path string) []string {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return []string{path}
		}
		return zeroes(v.Elem(), path)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			break
		}
		var out []string
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				out = append(out, zeroes(v.Field(i), path+"."+f.Name)...)
			}
		}
		return out
	case reflect.Slice, reflect.Map:
		if v.Len() == 0 {
			return []string{path}
		}
		var out []string
		if v.Kind() == reflect.Map {
			for it := v.MapRange(); it.Next(); {
				out = append(out, zeroes(it.Value(), fmt.Sprintf("%s[%v]", path, it.Key()))...)
			}
		} else {
			for i := range v.Len() {
				out = append(out, zeroes(v.Index(i), fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
		return out
	}
	if v.IsZero() {
		return []string{path}
	}
	return nil
}

// Every engine key of the file lands in the engine's config, with its
// value: a key accepted by the loader but dropped (or crossed with
// another) on the way to queues.Config fails here. The file is decoded and
// mapped as Load does, without the validation (no valid pool sets every
// key: weights need weighted order, max_wait strict order).
func TestFileKeysReachTheEngine(t *testing.T) {
	t.Parallel()
	cfg := &Config{Path: "every-key.yaml"}
	unknown, err := yamlx.DecodeStrictAll([]byte(everyKey), &cfg.File)
	require.NoError(t, err)
	require.Empty(t, unknown)
	// The document sets every key of a pool: a key added to PoolFile must
	// be set above, so that the checks below see it.
	require.Empty(t, zeroes(reflect.ValueOf(cfg.Pools[0]), "pools[0]"), "everyKey leaves these pool keys unset")
	top := yamlFields(reflect.TypeFor[File]())
	for _, key := range configKeys {
		require.Falsef(t, reflect.ValueOf(cfg.File).FieldByIndex(top[key].Index).IsZero(), "everyKey leaves %s unset", key)
	}

	policy, err := priority.New(priority.Config{Tiers: []string{"high", "low"}, Default: "low"})
	require.NoError(t, err)
	cfg.Policy = policy // what Load reads from the priorities file
	cfg.fillDefaults()

	rate := func(limit int, per time.Duration, burst int) *queues.Rate {
		return &queues.Rate{Limit: limit, Per: per, Burst: burst}
	}
	wantPool := queues.PoolConfig{
		Name: "all", Size: 3, MaxSize: 9, JobTypes: []string{"alpha", "beta"}, Tiers: []string{"high", "low"},
		QueueOrder: queues.QueueOrderWeighted, Weights: map[string]int{"high": 5, "low": 2},
		PollInterval: 250 * time.Millisecond, DequeueLoops: 4, JobTimeout: 90 * time.Second,
		Scope: queues.ScopeProcess, JobLog: queues.JobLogOff, MaxRetry: 7,
		MaxBacklog: 50, TierLimits: map[string]int{"low": 30}, BacklogWait: 2 * time.Second,
		EnqueueRate:       rate(10, time.Second, 12),
		EnqueueRatePerKey: rate(3, time.Minute, 4),
		JobTypeRates:      map[string]queues.Rate{"alpha": *rate(100, time.Hour, 5)},
		StartRate:         rate(6, 2*time.Second, 2),
		Breaker: &queues.BreakerConfig{
			FailureRatio: 0.25, MinCalls: 4, Window: 2 * time.Minute, SlowCall: 3 * time.Second,
			CoolDown: 7 * time.Second, MaxCoolDown: 9 * time.Minute, Probes: 2,
		},
		Reserved: map[string]int{"high": 1},
		MaxWait:  map[string]time.Duration{"low": 10 * time.Minute},
		Uses:     map[string]int{"db": 2},
		Adaptive: &queues.AdaptiveConfig{Min: 2, Window: 3 * time.Second, Tolerance: 1.8},
	}
	require.Empty(t, zeroes(reflect.ValueOf(wantPool), "wantPool"), "the expected pool must set every setting")
	require.Len(t, cfg.Engine.Pools, 1)
	require.Equal(t, wantPool, cfg.Engine.Pools[0])

	want := queues.Config{
		Namespace: "every-key", Tiers: policy, Pools: []queues.PoolConfig{wantPool},
		ShutdownTimeout: 41 * time.Second, DelayedCheckInterval: 3 * time.Second, RecoverAfter: 12 * time.Second,
		Dependencies: []queues.Dependency{{Name: "db", Capacity: 30}},
	}
	for name, key := range configKeys {
		w := reflect.ValueOf(want).FieldByName(name)
		require.Falsef(t, w.IsZero(), "want must set %s", name)
		require.Equalf(t, w.Interface(), reflect.ValueOf(cfg.Engine).FieldByName(name).Interface(), "key %s", key)
	}
}
