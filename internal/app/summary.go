package app

import (
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// DefaultConfigPath is the config file cmd/worker and cmd/enqueue read
// when -config is not given, relative to the working directory.
const DefaultConfigPath = "configs/worker.yaml"

// DefaultConfigSummary is Config.Summary of DefaultConfigPath as shipped,
// read with no environment: what the commands' -h says the default points
// at. A test keeps the two equal.
const DefaultConfigSummary = "a real Redis at 127.0.0.1:6379 DB 1, embedded SQLite out/compartment.db"

// Summary says in a few words which Redis and which database the config
// uses, for help texts and logs: "a real Redis at 127.0.0.1:6379 DB 1,
// embedded SQLite out/compartment.db". It never holds a password.
func (c *Config) Summary() string {
	db := "embedded SQLite " + c.Database.SQLitePath
	if c.Database.URL != "" {
		db = c.Database.Describe()
	}
	return c.Redis.summary() + ", " + db
}

func (r RedisConfig) summary() string {
	switch {
	case r.Embedded:
		return "an embedded in-memory Redis at " + r.EmbeddedAddr
	case r.Sentinel != nil:
		return "a Redis " + r.Sentinel.describe()
	case r.Cluster != nil:
		return "a Redis Cluster at " + strings.Join(r.Cluster.Addrs, ",")
	}
	o, err := redis.ParseURL(r.URL)
	if err != nil {
		return "Redis " + RedactURL(r.URL)
	}
	s := fmt.Sprintf("a real Redis at %s DB %d", o.Addr, o.DB)
	if o.TLSConfig != nil {
		s += " over TLS"
	}
	return s
}
