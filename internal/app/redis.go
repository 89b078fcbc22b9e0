package app

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// DefaultEmbeddedAddr is where the embedded Redis listens unless
// redis.embedded_addr says otherwise.
const DefaultEmbeddedAddr = "127.0.0.1:16379"

// RedisPingTimeout bounds the reachability check at start.
const RedisPingTimeout = 5 * time.Second

// RedisConfig says which Redis to use: one of a URL (a single node), a
// Sentinel-managed master, a Redis Cluster, or an embedded in-process Redis
// that must be asked for explicitly.
type RedisConfig struct {
	// URL is a Redis URL: redis://[:password@]host:port[/db], or rediss://
	// for TLS. The REDIS_URL environment variable overrides it.
	URL string `yaml:"url,omitempty"`
	// Sentinel names a master that Redis Sentinel watches and fails over;
	// the worker and cmd/enqueue follow a failover without a restart. The
	// REDIS_SENTINEL_* environment variables override it.
	Sentinel *SentinelConfig `yaml:"sentinel,omitempty"`
	// Cluster is a Redis Cluster: seed nodes, the client learns the rest.
	// Every key of one pool shares a hash slot, so each pool's load sits
	// on one node and different pools spread over the nodes. The
	// REDIS_CLUSTER_ADDRS environment variable overrides it.
	Cluster *ClusterConfig `yaml:"cluster,omitempty"`
	// Embedded runs an in-memory Redis inside the worker process, for trying
	// the project out. Everything in it is lost when the worker exits. It is
	// never used as a fallback for an unreachable real Redis. Defaults to
	// false.
	Embedded bool `yaml:"embedded,omitempty"`
	// EmbeddedAddr is where the embedded Redis listens (loopback only), so
	// cmd/enqueue in another terminal can reach it. Defaults to
	// 127.0.0.1:16379.
	EmbeddedAddr string `yaml:"embedded_addr,omitempty"`
	// TLSCAFile is the path (relative to the config file) of a PEM file of
	// the certificate authorities to trust for Redis's TLS certificates,
	// in place of the system's roots: for a Redis whose certificate a
	// private CA signed. It applies to whichever topology uses TLS (a
	// rediss:// URL, or tls: true under sentinel or cluster); setting it
	// without TLS is a config error. Defaults to the system's roots.
	TLSCAFile string `yaml:"tls_ca_file,omitempty"`
	// TLSServerName is the name Redis's certificates must carry, when it is
	// not the host the client connects to (an IP address, or a node a
	// cluster or the sentinels announce). Defaults to that host. Needs TLS,
	// like TLSCAFile.
	TLSServerName string `yaml:"tls_server_name,omitempty"`
	// WaitAtStart makes the worker retry an unreachable Redis at start, once
	// a second, for this long before it gives up. Defaults to 0: give up at
	// once, exit code 1. cmd/enqueue never waits.
	WaitAtStart time.Duration `yaml:"wait_at_start,omitempty"`

	// tlsRoots holds the certificates of TLSCAFile, read by loadTLS, and
	// tlsCASum the file's SHA-256, to tell a changed file at a reload.
	tlsRoots *x509.CertPool
	tlsCASum [32]byte
}

// settings is r without the parsed certificates, for comparing two loads
// of a config (a CertPool does not compare by value; the file's sum does).
func (r RedisConfig) settings() RedisConfig {
	r.tlsRoots = nil
	return r
}

func (r RedisConfig) withDefaults() RedisConfig {
	if r.Embedded && r.EmbeddedAddr == "" {
		r.EmbeddedAddr = DefaultEmbeddedAddr
	}
	return r
}

func (r RedisConfig) problems() []string {
	var out []string
	if r.WaitAtStart < 0 {
		out = append(out, fmt.Sprintf("redis: wait_at_start must be >= 0, got %s", r.WaitAtStart))
	}
	switch set := r.topologies(); {
	case len(set) == 2 && r.Embedded && r.URL != "":
		out = append(out, "redis: set either url or embedded: true, not both")
	case len(set) > 1:
		out = append(out, fmt.Sprintf("redis: set only one of url, sentinel, cluster and embedded (this config sets %s)", strings.Join(set, " and ")))
	case r.Sentinel != nil:
		out = append(out, r.Sentinel.problems()...)
	case r.Cluster != nil:
		out = append(out, r.Cluster.problems()...)
	case r.Embedded:
		host, _, err := net.SplitHostPort(r.EmbeddedAddr)
		if err != nil {
			return append(out, fmt.Sprintf("redis: embedded_addr %q: %v", r.EmbeddedAddr, err))
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			out = append(out, fmt.Sprintf("redis: embedded_addr %q must be a loopback address (the embedded Redis has no password)", r.EmbeddedAddr))
		}
	case r.URL == "":
		out = append(out, "redis: set url (or the REDIS_URL environment variable), or embedded: true to try it out in memory; for Sentinel set sentinel (master, addrs)")
	default:
		if _, err := redis.ParseURL(r.URL); err != nil {
			out = append(out, fmt.Sprintf("redis: url %s: %s", RedactURL(r.URL), urlProblem(err)))
		}
	}
	if len(r.topologies()) == 1 {
		out = append(out, r.tlsProblems()...)
	}
	return out
}

// urlProblem says what is wrong with a URL that did not parse, without
// quoting any part of it: url.Parse's own errors quote the whole URL, or the
// bad escape, which may be part of a password.
func urlProblem(err error) string {
	var ue *url.Error
	if !errors.As(err, &ue) {
		// go-redis's own checks (scheme, port, database number) name the
		// part that is wrong, never the password.
		return strings.TrimPrefix(err.Error(), "redis: ")
	}
	var esc url.EscapeError
	var host url.InvalidHostError
	switch {
	case errors.As(ue.Err, &esc):
		return "it is not a valid URL: a %-escape is malformed (write special characters of a password as %XX)"
	case errors.As(ue.Err, &host):
		return "it is not a valid URL: the host is malformed"
	case strings.Contains(ue.Err.Error(), "port"):
		return "it is not a valid URL: the port is malformed"
	default:
		return "it is not a valid URL"
	}
}

// Addr returns where the worker connects, for messages: an address, or
// the Sentinel master's name and the sentinels. It never holds a password.
func (r RedisConfig) Addr() string {
	switch {
	case r.Embedded:
		return r.EmbeddedAddr
	case r.Sentinel != nil:
		return r.Sentinel.describe()
	case r.Cluster != nil:
		return "cluster " + strings.Join(r.Cluster.Addrs, ",")
	}
	if o, err := redis.ParseURL(r.URL); err == nil {
		return o.Addr
	}
	return RedactURL(r.URL)
}

// Options returns go-redis options for a single-node config (a URL or the
// embedded Redis); Sentinel and Cluster configs have NewClient.
func (r RedisConfig) Options() (*redis.Options, error) {
	if r.Embedded {
		return &redis.Options{Addr: r.EmbeddedAddr}, nil
	}
	if r.Sentinel != nil || r.Cluster != nil {
		return nil, errors.New("redis: a sentinel or cluster config has no single-node options")
	}
	o, err := redis.ParseURL(r.URL)
	if err != nil {
		return nil, fmt.Errorf("redis: url %s: %s", RedactURL(r.URL), urlProblem(err))
	}
	if o.TLSConfig != nil {
		r.applyTLS(o.TLSConfig)
	}
	return o, nil
}

// NewClient returns a go-redis client for the config, without connecting:
// a failover client for Sentinel (it follows a failover by itself), a
// cluster client for a Cluster (the engine lays its keys out for a
// cluster when it is handed one), a plain client otherwise.
func (r RedisConfig) NewClient() (redis.UniversalClient, error) {
	switch {
	case r.Sentinel != nil:
		o := r.Sentinel.FailoverOptions()
		if o.TLSConfig != nil {
			r.applyTLS(o.TLSConfig)
		}
		return redis.NewFailoverClient(o), nil
	case r.Cluster != nil:
		o := r.Cluster.ClusterOptions()
		if o.TLSConfig != nil {
			r.applyTLS(o.TLSConfig)
		}
		return redis.NewClusterClient(o), nil
	}
	opts, err := r.Options()
	if err != nil {
		return nil, err
	}
	return redis.NewClient(opts), nil
}

// tlsOn says whether the config asks for TLS, for the hint on a timeout.
func (r RedisConfig) tlsOn() bool {
	switch {
	case r.Sentinel != nil:
		return r.Sentinel.TLS
	case r.Cluster != nil:
		return r.Cluster.TLS
	}
	o, err := redis.ParseURL(r.URL)
	return err == nil && o.TLSConfig != nil
}

// RedactURL returns a URL fit for messages and logs: the password of its
// user info and the values of password-like query options are replaced by
// "***", whether or not the URL parses.
func RedactURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		if strings.ContainsAny(raw, "@:=") {
			return "(not a URL; not shown)"
		}
		return raw
	}
	// Everything up to the last "@" before the path is user info.
	hostEnd := len(rest)
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		hostEnd = i
	}
	if at := strings.LastIndex(rest[:hostEnd], "@"); at >= 0 {
		user := rest[:at]
		if c := strings.Index(user, ":"); c >= 0 {
			user = user[:c+1] + "***"
		} else if user != "" {
			user = "***"
		}
		rest = user + rest[at:]
	} else if at := strings.LastIndex(rest, "@"); at >= 0 {
		// An "@" after a "/" or "?": a password that contains one, most
		// likely. Show nothing before it.
		rest = "***" + rest[at:]
	}
	if q := strings.Index(rest, "?"); q >= 0 {
		rest = rest[:q+1] + redactQuery(rest[q+1:])
	}
	return scheme + "://" + rest
}

// redactQuery hides the values of query options that may hold a secret.
func redactQuery(q string) string {
	parts := strings.Split(q, "&")
	for i, p := range parts {
		k, _, ok := strings.Cut(p, "=")
		lk := strings.ToLower(k)
		if ok && (strings.Contains(lk, "pass") || strings.Contains(lk, "secret") || strings.Contains(lk, "token") || strings.Contains(lk, "key")) {
			parts[i] = k + "=***"
		}
	}
	return strings.Join(parts, "&")
}

// Redis is a connected Redis, embedded or real.
type Redis struct {
	Client redis.UniversalClient
	// Addr is where it listens, for messages.
	Addr string
	mini *miniredis.Miniredis
}

// Close closes the client and stops an embedded server: what OpenRedis
// opened.
func (r *Redis) Close() {
	if r.Client != nil {
		_ = r.Client.Close()
	}
	if r.mini != nil {
		r.mini.Close()
	}
}

// OpenRedis connects to the configured Redis and checks that it answers.
// With an embedded config, serve decides whether this process runs the
// embedded server (the worker) or connects to one another process runs
// (cmd/enqueue). An unreachable Redis is an error naming its address; there
// is never a fallback to an embedded one.
//
// With redis.wait_at_start set, an unreachable Redis is retried every second
// for that long (onRetry, when not nil, hears of each failed attempt).
func OpenRedis(ctx context.Context, cfg RedisConfig, serve bool, onRetry func(attempt int, err error)) (*Redis, error) {
	r := &Redis{Addr: cfg.Addr()}
	if cfg.Embedded && serve {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true) // expire keys by the wall clock, as a real Redis does
		if err := m.StartAddr(cfg.EmbeddedAddr); err != nil {
			return nil, fmt.Errorf("embedded Redis: cannot listen on %s (is another worker running?): %w", cfg.EmbeddedAddr, err)
		}
		r.mini = m
		r.Addr = m.Addr() // the real port when embedded_addr asked for port 0
	}
	if r.mini != nil {
		cfg.EmbeddedAddr = r.mini.Addr()
	}
	client, err := cfg.NewClient()
	if err != nil {
		r.Close()
		return nil, err
	}
	r.Client = client
	deadline := time.Now().Add(cfg.WaitAtStart)
	for attempt := 1; ; attempt++ {
		pingCtx, cancel := context.WithTimeout(ctx, RedisPingTimeout)
		err := r.Client.Ping(pingCtx).Err()
		cancel()
		if err == nil {
			return r, nil
		}
		if time.Now().Before(deadline) && ctx.Err() == nil {
			if onRetry != nil {
				onRetry(attempt, err)
			}
			t := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		r.Close()
		hint := ""
		if cfg.Embedded {
			hint = " (the embedded Redis runs inside cmd/worker: start the worker with this config first)"
		}
		if cfg.tlsOn() && errors.Is(err, context.DeadlineExceeded) {
			if cfg.URL != "" {
				hint += " (the URL asks for TLS, rediss://: is the server's port a TLS port?)"
			} else {
				hint += " (tls: true: are the servers' ports TLS ports?)"
			}
		}
		if cfg.WaitAtStart > 0 {
			hint += fmt.Sprintf(" (waited %s)", cfg.WaitAtStart)
		}
		return nil, fmt.Errorf("redis at %s is unreachable%s: %w", r.Addr, hint, err)
	}
}
