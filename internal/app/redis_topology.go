package app

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The environment variables that override the file's Redis settings.
// REDIS_URL, the REDIS_SENTINEL_* pair and REDIS_CLUSTER_ADDRS each choose
// a topology (at most one of them may be set); the passwords fill in the
// secrets of the topology in effect.
const (
	EnvRedisURL              = "REDIS_URL"
	EnvRedisSentinelMaster   = "REDIS_SENTINEL_MASTER"
	EnvRedisSentinelAddrs    = "REDIS_SENTINEL_ADDRS"
	EnvRedisSentinelPassword = "REDIS_SENTINEL_PASSWORD"
	EnvRedisClusterAddrs     = "REDIS_CLUSTER_ADDRS"
	EnvRedisPassword         = "REDIS_PASSWORD"
)

// maxPasswordFile bounds what is read of a *_password_file.
const maxPasswordFile = 4 << 10

// maxCAFile bounds what is read of redis.tls_ca_file.
const maxCAFile = 1 << 20

// SentinelConfig is a master watched by Redis Sentinel. The client asks the
// sentinels where the master is, and asks again when it fails over.
type SentinelConfig struct {
	// Master is the name the sentinels know the master by (the NAME of
	// `sentinel monitor NAME host port quorum`). Required. The
	// REDIS_SENTINEL_MASTER environment variable overrides it.
	Master string `yaml:"master"`
	// Addrs are the sentinels, host:port each. At least one is required;
	// list them all (three or more for a quorum) so the client can ask
	// another when one is down. REDIS_SENTINEL_ADDRS (comma-separated)
	// overrides it.
	Addrs []string `yaml:"addrs"`
	// SentinelUsername is the sentinels' own ACL user. Defaults to none.
	SentinelUsername string `yaml:"sentinel_username,omitempty"`
	// SentinelPasswordFile is the path (relative to the config file) of a
	// file holding the sentinels' own password (their requirepass).
	// REDIS_SENTINEL_PASSWORD overrides it. Defaults to none.
	SentinelPasswordFile string `yaml:"sentinel_password_file,omitempty"`
	// Username is the ACL user on the master. Defaults to none.
	Username string `yaml:"username,omitempty"`
	// PasswordFile is the path (relative to the config file) of a file
	// holding the master's password. REDIS_PASSWORD overrides it. Defaults
	// to none.
	PasswordFile string `yaml:"password_file,omitempty"`
	// DB is the database number on the master. Defaults to 0.
	DB int `yaml:"db,omitempty"`
	// TLS connects to the sentinels and the master over TLS (system root
	// certificates, TLS 1.2 or later). Defaults to false.
	TLS bool `yaml:"tls,omitempty"`

	// Password and SentinelPassword are read from the files or the
	// environment. They are never logged nor printed.
	Password         string `yaml:"-"`
	SentinelPassword string `yaml:"-"`
}

// ClusterConfig is a Redis Cluster. The engine lays its keys out so that
// every key of a pool shares one hash slot (see docs/CLUSTER.md, "On a
// Redis Cluster").
type ClusterConfig struct {
	// Addrs are seed nodes, host:port each; the client learns the rest.
	// At least one is required. REDIS_CLUSTER_ADDRS (comma-separated)
	// overrides it.
	Addrs []string `yaml:"addrs"`
	// Username is the ACL user. Defaults to none.
	Username string `yaml:"username,omitempty"`
	// PasswordFile is the path (relative to the config file) of a file
	// holding the password. REDIS_PASSWORD overrides it. Defaults to none.
	PasswordFile string `yaml:"password_file,omitempty"`
	// TLS connects over TLS. Defaults to false.
	TLS bool `yaml:"tls,omitempty"`
	// DB must be 0, the only database a cluster has; it is a key so that
	// a config carried over from a single node says so instead of
	// failing as an unknown key.
	DB int `yaml:"db,omitempty"`

	// Password is read from PasswordFile or the environment. It is never
	// logged nor printed.
	Password string `yaml:"-"`
}

// topologies names the topologies r sets, in a fixed order.
func (r RedisConfig) topologies() []string {
	var out []string
	if r.URL != "" {
		out = append(out, "url")
	}
	if r.Sentinel != nil {
		out = append(out, "sentinel")
	}
	if r.Cluster != nil {
		out = append(out, "cluster")
	}
	if r.Embedded {
		out = append(out, "embedded")
	}
	return out
}

// splitAddrs splits a comma-separated list of addresses, dropping blanks.
func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// applyEnv applies the Redis environment variables to r: a topology given
// in the environment replaces the file's (keeping the file's settings of
// that same topology that the environment does not name, such as a
// sentinel section's password_file), and the passwords fill in the
// secrets. It returns the names of the variables used and the problems of
// their combination. No problem quotes a value.
func (r *RedisConfig) applyEnv(getenv func(string) string) (used, problems []string) {
	var groups []string
	if getenv(EnvRedisURL) != "" {
		groups = append(groups, EnvRedisURL)
	}
	if getenv(EnvRedisSentinelMaster) != "" || getenv(EnvRedisSentinelAddrs) != "" {
		groups = append(groups, "REDIS_SENTINEL_MASTER/REDIS_SENTINEL_ADDRS")
	}
	if getenv(EnvRedisClusterAddrs) != "" {
		groups = append(groups, EnvRedisClusterAddrs)
	}
	if len(groups) > 1 {
		return nil, []string{fmt.Sprintf("environment: set only one of REDIS_URL, REDIS_SENTINEL_MASTER/REDIS_SENTINEL_ADDRS and REDIS_CLUSTER_ADDRS (set: %s)", strings.Join(groups, ", "))}
	}
	keep := RedisConfig{WaitAtStart: r.WaitAtStart, TLSCAFile: r.TLSCAFile, TLSServerName: r.TLSServerName}
	switch {
	case getenv(EnvRedisURL) != "":
		keep.URL = getenv(EnvRedisURL)
		*r = keep
		used = append(used, EnvRedisURL)
	case len(groups) == 1 && groups[0] != EnvRedisClusterAddrs:
		s := SentinelConfig{}
		if r.Sentinel != nil {
			s = *r.Sentinel
		}
		for _, v := range []struct {
			name string
			set  func(string)
		}{
			{EnvRedisSentinelMaster, func(x string) { s.Master = strings.TrimSpace(x) }},
			{EnvRedisSentinelAddrs, func(x string) { s.Addrs = splitAddrs(x) }},
		} {
			if x := getenv(v.name); x != "" {
				v.set(x)
				used = append(used, v.name)
			}
		}
		keep.Sentinel = &s
		*r = keep
	case len(groups) == 1:
		c := ClusterConfig{}
		if r.Cluster != nil {
			c = *r.Cluster
		}
		c.Addrs = splitAddrs(getenv(EnvRedisClusterAddrs))
		used = append(used, EnvRedisClusterAddrs)
		keep.Cluster = &c
		*r = keep
	}
	if pw := getenv(EnvRedisPassword); pw != "" {
		used = append(used, EnvRedisPassword)
		switch {
		case r.Sentinel != nil:
			r.Sentinel.Password = pw
		case r.Cluster != nil:
			r.Cluster.Password = pw
		default:
			problems = append(problems, "environment: REDIS_PASSWORD is for redis.sentinel and redis.cluster; a Redis URL carries its own password (redis://:PASSWORD@host:port)")
		}
	}
	if pw := getenv(EnvRedisSentinelPassword); pw != "" {
		used = append(used, EnvRedisSentinelPassword)
		if r.Sentinel != nil {
			r.Sentinel.SentinelPassword = pw
		} else {
			problems = append(problems, "environment: REDIS_SENTINEL_PASSWORD is set but redis is not configured for Sentinel")
		}
	}
	return used, problems
}

// loadSecrets reads the password files the config names (relative to the
// config file at cfgPath), unless the environment gave that password
// already. A problem names the key and the file, never the content.
func (r *RedisConfig) loadSecrets(cfgPath string) []string {
	var out []string
	read := func(key, file string, into *string) {
		if file == "" || *into != "" {
			return
		}
		pw, problem := readPasswordFile(key, relativeTo(cfgPath, file))
		if problem != "" {
			out = append(out, problem)
			return
		}
		*into = pw
	}
	if s := r.Sentinel; s != nil {
		read("redis.sentinel.password_file", s.PasswordFile, &s.Password)
		read("redis.sentinel.sentinel_password_file", s.SentinelPasswordFile, &s.SentinelPassword)
	}
	if c := r.Cluster; c != nil {
		read("redis.cluster.password_file", c.PasswordFile, &c.Password)
	}
	return out
}

// readPasswordFile reads a password: the file's first line, surrounding
// white space trimmed. It must be a single non-empty line.
func readPasswordFile(key, path string) (string, string) {
	data, err := readSmall(path, maxPasswordFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Sprintf("%s: %s does not exist", key, path)
	case err != nil:
		return "", fmt.Sprintf("%s: %v", key, err)
	}
	pw := strings.TrimSpace(string(data))
	switch {
	case pw == "":
		return "", fmt.Sprintf("%s: %s is empty", key, path)
	case strings.ContainsAny(pw, "\r\n"):
		return "", fmt.Sprintf("%s: %s must hold the password on one line", key, path)
	}
	return pw, ""
}

// addrProblems checks a list of host:port addresses under key.
func addrProblems(key string, addrs []string) []string {
	var out []string
	seen := map[string]bool{}
	for i, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		n, perr := strconv.Atoi(port)
		switch {
		case err != nil || host == "":
			out = append(out, fmt.Sprintf("%s[%d]: %q is not host:port (for example 10.0.0.5:26379)", key, i, a))
		case perr != nil || n < 1 || n > 65535:
			out = append(out, fmt.Sprintf("%s[%d]: %q: port must be a number from 1 to 65535", key, i, a))
		case seen[a]:
			out = append(out, fmt.Sprintf("%s[%d]: %q is listed twice", key, i, a))
		}
		seen[a] = true
	}
	return out
}

func (s *SentinelConfig) problems() []string {
	var out []string
	if s.Master == "" {
		out = append(out, "redis.sentinel.master: required: the name the sentinels know the master by (sentinel monitor NAME ...)")
	} else if strings.ContainsAny(s.Master, " \t\r\n") {
		out = append(out, fmt.Sprintf("redis.sentinel.master: %q must not contain white space", s.Master))
	}
	if len(s.Addrs) == 0 {
		out = append(out, "redis.sentinel.addrs: at least one sentinel host:port is required (list them all: three or more for a quorum)")
	}
	out = append(out, addrProblems("redis.sentinel.addrs", s.Addrs)...)
	if s.DB < 0 {
		out = append(out, fmt.Sprintf("redis.sentinel.db: must be >= 0, got %d", s.DB))
	}
	return out
}

func (c *ClusterConfig) problems() []string {
	var out []string
	if len(c.Addrs) == 0 {
		out = append(out, "redis.cluster.addrs: at least one node host:port is required")
	}
	out = append(out, addrProblems("redis.cluster.addrs", c.Addrs)...)
	if c.DB != 0 {
		out = append(out, fmt.Sprintf("redis.cluster.db: a Redis Cluster has only database 0, got %d", c.DB))
	}
	return out
}

// loadTLS reads redis.tls_ca_file (relative to the config file at
// cfgPath). A problem names the key and the file.
func (r *RedisConfig) loadTLS(cfgPath string) []string {
	if r.TLSCAFile == "" {
		return nil
	}
	path := relativeTo(cfgPath, r.TLSCAFile)
	data, err := readSmall(path, maxCAFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return []string{fmt.Sprintf("redis.tls_ca_file: %s does not exist", path)}
	case err != nil:
		return []string{fmt.Sprintf("redis.tls_ca_file: %v", err)}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return []string{fmt.Sprintf("redis.tls_ca_file: %s holds no PEM certificate", path)}
	}
	r.tlsRoots, r.tlsCASum = pool, sha256.Sum256(data)
	return nil
}

// tlsProblems checks the TLS keys against the topology: they need TLS.
func (r RedisConfig) tlsProblems() []string {
	var out []string
	for _, k := range []struct{ key, val string }{{"tls_ca_file", r.TLSCAFile}, {"tls_server_name", r.TLSServerName}} {
		switch {
		case k.val == "":
		case r.Embedded:
			out = append(out, fmt.Sprintf("redis.%s: the embedded Redis has no TLS", k.key))
		case !r.tlsOn():
			out = append(out, fmt.Sprintf("redis.%s: set, but the connection does not use TLS: use a rediss:// URL, or tls: true under sentinel or cluster", k.key))
		}
	}
	return out
}

// applyTLS puts the trusted roots and the server name of the config into
// c, a TLS config go-redis built or tlsConfig returned.
func (r RedisConfig) applyTLS(c *tls.Config) {
	if r.tlsRoots != nil {
		c.RootCAs = r.tlsRoots
	}
	if r.TLSServerName != "" {
		c.ServerName = r.TLSServerName
	}
}

func tlsConfig(on bool) *tls.Config {
	if !on {
		return nil
	}
	return &tls.Config{MinVersion: tls.VersionTLS12}
}

// FailoverOptions returns go-redis options for the Sentinel config.
func (s *SentinelConfig) FailoverOptions() *redis.FailoverOptions {
	return &redis.FailoverOptions{
		MasterName: s.Master, SentinelAddrs: append([]string(nil), s.Addrs...),
		SentinelUsername: s.SentinelUsername, SentinelPassword: s.SentinelPassword,
		Username: s.Username, Password: s.Password, DB: s.DB, TLSConfig: tlsConfig(s.TLS),
	}
}

// ClusterOptions returns go-redis options for the cluster config. The
// engine takes the cluster key layout for the *redis.ClusterClient they
// build (queues.NewClient).
func (c *ClusterConfig) ClusterOptions() *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs: append([]string(nil), c.Addrs...), Username: c.Username, Password: c.Password, TLSConfig: tlsConfig(c.TLS),
	}
}

// describe is where a Sentinel config connects, for messages: the master's
// name and the sentinels (addresses carry no secret).
func (s *SentinelConfig) describe() string {
	return fmt.Sprintf("sentinel master %q via %s", s.Master, strings.Join(s.Addrs, ","))
}
