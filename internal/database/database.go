// Package database is the database the three functions of the story share:
// orders, search and the report batch. It opens embedded SQLite (pure Go, no
// cgo) by default or PostgreSQL when a URL is given, creates the schema, seeds
// a demo dataset on first use (never into a database that holds other
// tables), and hands out connections only inside a
// per-pool bulkhead, so no pool can hold more connections than its share.
package database

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	"modernc.org/sqlite"               // registers the "sqlite" driver; Error
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/lci-labs/compartment/bulkhead"
)

// Defaults of Config.
const (
	DefaultSQLitePath     = "out/compartment.db"
	DefaultMaxConnections = 20
	DefaultSeedOrders     = 60000
	DefaultSeedMonths     = 6
)

// Config says which database to use and how large its shared connection
// pool is.
type Config struct {
	// URL is a PostgreSQL URL (postgres://user@host:5432/db). The
	// DATABASE_URL environment variable overrides it. Empty means embedded
	// SQLite at SQLitePath. Special characters in the user name or password
	// are percent-encoded: "@" as %40, "/" as %2F, "%" as %25.
	URL string `yaml:"url,omitempty"`
	// SQLitePath is the SQLite file, relative to the working directory.
	// Defaults to out/compartment.db.
	SQLitePath string `yaml:"sqlite_path,omitempty"`
	// MaxConnections is the size of the connection pool all pools share.
	// Defaults to 20.
	MaxConnections int `yaml:"max_connections,omitempty"`
	// AllowOverbooking lets the pools' sizes add up to more than
	// MaxConnections (jobs then wait for connections, as in the outage the
	// bulkheads prevent). Defaults to false.
	AllowOverbooking bool `yaml:"allow_overbooking,omitempty"`
	// Dependency names the dependency (the config's dependencies) this
	// database is: the handlers then hold their pool's share of it while
	// they use a connection, so an adaptive pool sees their wait for it
	// (docs/DEPENDENCIES.md). Defaults to none.
	Dependency string `yaml:"dependency,omitempty"`
	// SeedOrders is the number of demo orders written when the orders table
	// is empty. 0 means the default, 60000; -1 seeds nothing. Demo orders
	// are written only into a database that holds no table but this
	// package's own: Open refuses to seed any other (ErrHoldsOtherTables).
	SeedOrders int `yaml:"seed_orders,omitempty"`
	// SeedMonths is how many months, ending with the last full month before
	// SeedUntil, the demo orders span. Defaults to 6.
	SeedMonths int `yaml:"seed_months,omitempty"`
	// SeedUntil is the first day after the seeded data, as YYYY-MM. Defaults
	// to the current month, so the previous months are complete.
	SeedUntil string `yaml:"seed_until,omitempty"`
}

// SetDefaults fills zero fields with their defaults.
func (c *Config) SetDefaults() {
	if c.URL == "" && c.SQLitePath == "" {
		c.SQLitePath = DefaultSQLitePath
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.SeedOrders == 0 {
		c.SeedOrders = DefaultSeedOrders
	}
	if c.SeedMonths == 0 {
		c.SeedMonths = DefaultSeedMonths
	}
	if c.SeedUntil == "" {
		c.SeedUntil = time.Now().UTC().Format("2006-01")
	}
}

// Problems lists what is wrong with a config whose defaults are filled. No
// problem quotes a password: a URL is quoted only as Redact returns it.
func (c *Config) Problems() []string {
	var out []string
	if c.URL != "" {
		if p := urlProblem(c.URL); p != "" {
			out = append(out, fmt.Sprintf("database: url %q %s", Redact(c.URL), p))
		}
		if c.SQLitePath != "" {
			out = append(out, "database: set either url (PostgreSQL) or sqlite_path, not both")
		}
	}
	if c.MaxConnections < 1 {
		out = append(out, fmt.Sprintf("database: max_connections must be >= 1, got %d", c.MaxConnections))
	}
	if c.SeedOrders < -1 {
		out = append(out, fmt.Sprintf("database: seed_orders must be -1 (none), 0 (default) or more, got %d", c.SeedOrders))
	}
	if c.SeedMonths < 1 {
		out = append(out, fmt.Sprintf("database: seed_months must be >= 1, got %d", c.SeedMonths))
	}
	if _, err := time.Parse("2006-01", c.SeedUntil); err != nil {
		out = append(out, fmt.Sprintf("database: seed_until must be YYYY-MM, got %q", c.SeedUntil))
	}
	return out
}

// Describe names the database for logs and messages, without a password.
func (c *Config) Describe() string {
	if c.URL != "" {
		return "PostgreSQL " + Redact(c.URL)
	}
	return "SQLite " + c.SQLitePath
}

// ErrNoShare is matched when a pool asks for a connection but was given no
// share of the database.
var ErrNoShare = errors.New("database: pool has no share of the connections")

// DB is the shared database. Connections are taken with Conn, inside the
// calling pool's share.
type DB struct {
	sql      *sql.DB
	postgres bool
	cfg      Config
	shares   *bulkhead.Registry

	mu   sync.Mutex
	peak map[string]int

	server serverModel // the report server model (SetSlowdown)
}

// Open connects to the database, creates the schema and seeds the demo data
// when the orders table is empty and the database holds no other table; a
// database with other tables and no orders is refused with an error
// matching ErrHoldsOtherTables, and left as it was. shares gives each pool its number of
// connections (normally the pool's size); a pool's handlers can never hold
// more than that many at once. Its errors do not quote the URL's password:
// it refuses a URL that Config.Problems finds wrong before the driver sees
// it, and cuts the password out of the driver's errors.
func Open(ctx context.Context, cfg Config, shares map[string]int) (_ *DB, err error) {
	defer func() { err = scrub(err, cfg.URL) }()
	driver, dsn := "sqlite", ""
	if cfg.URL != "" {
		if p := urlProblem(cfg.URL); p != "" {
			return nil, fmt.Errorf("database: url %q %s", Redact(cfg.URL), p)
		}
		driver, dsn = "pgx", cfg.URL
	} else {
		if dir := filepath.Dir(cfg.SQLitePath); dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("database: %w", err)
			}
		}
		// WAL lets report reads run beside order writes; busy_timeout makes
		// a writer wait for the file lock instead of failing at once.
		dsn = "file:" + cfg.SQLitePath + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	}
	sdb, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, fmt.Errorf("database: open %s: %w", cfg.Describe(), err)
	}
	sdb.SetMaxOpenConns(cfg.MaxConnections)
	sdb.SetMaxIdleConns(cfg.MaxConnections)
	db := &DB{sql: sdb, postgres: cfg.URL != "", cfg: cfg, shares: bulkhead.NewRegistry(), peak: map[string]int{}}
	for _, name := range slices.Sorted(maps.Keys(shares)) {
		if _, err := db.shares.Register(bulkhead.Config{Name: "db:" + name, MaxConcurrent: shares[name]}); err != nil {
			_ = sdb.Close()
			return nil, err
		}
	}
	if err := db.ping(ctx); err != nil {
		_ = sdb.Close()
		return nil, fmt.Errorf("database: %s is unreachable: %w", cfg.Describe(), err)
	}
	if err := db.setUp(ctx); err != nil {
		_ = sdb.Close()
		return nil, err
	}
	return db, nil
}

// pingTimeout bounds how long Open waits for the database to answer.
const pingTimeout = 10 * time.Second

// ping checks that the database answers, for up to pingTimeout. On SQLite
// the first connection to a fresh file switches it to WAL, which needs the
// file to itself; when several processes open a fresh file at once, SQLite
// answers SQLITE_BUSY at once instead of waiting (a wait could deadlock), so
// ping tries again until pingTimeout.
func (db *DB) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	return retryBusy(ctx, func() error { return db.sql.PingContext(ctx) })
}

// retryBusy calls fn until it returns anything but SQLite's SQLITE_BUSY, a
// little later each time, or until ctx is done; it returns fn's last error.
func retryBusy(ctx context.Context, fn func() error) error {
	wait := 5 * time.Millisecond
	for {
		err := fn()
		if !isBusy(err) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// isBusy reports whether err is SQLite's SQLITE_BUSY ("database is locked"),
// with any extended code.
func isBusy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}

// Close closes the connection pool.
func (db *DB) Close() error { return db.sql.Close() }

// SQL returns the underlying pool, for tests and tools that check data.
// Work done on behalf of a pool must use Conn.
func (db *DB) SQL() *sql.DB { return db.sql }

// Postgres reports whether the database is PostgreSQL.
func (db *DB) Postgres() bool { return db.postgres }

// Describe names the database without a password.
func (db *DB) Describe() string { return db.cfg.Describe() }

// Conn runs fn with one connection taken inside pool's share. When the share
// is used up, it fails at once with a *bulkhead.FullError naming the share,
// so a handler that tries to hold two connections is caught instead of
// starving the others.
func (db *DB) Conn(ctx context.Context, pool string, fn func(ctx context.Context, conn *sql.Conn) error) error {
	share, err := db.shares.Get("db:" + pool)
	if err != nil {
		return fmt.Errorf("%w: %q", ErrNoShare, pool)
	}
	return share.Execute(ctx, func(ctx context.Context) error {
		db.notePeak(pool, share.Active())
		conn, err := db.sql.Conn(ctx)
		if err != nil {
			return scrub(fmt.Errorf("database: get a connection for pool %q: %w", pool, err), db.cfg.URL)
		}
		defer conn.Close()
		return fn(ctx, conn)
	})
}

func (db *DB) notePeak(pool string, n int) {
	db.mu.Lock()
	if n > db.peak[pool] {
		db.peak[pool] = n
	}
	db.mu.Unlock()
}

// PeakConnections returns, per pool, the most connections it held at once.
func (db *DB) PeakConnections() map[string]int {
	db.mu.Lock()
	defer db.mu.Unlock()
	out := make(map[string]int, len(db.peak))
	for k, v := range db.peak {
		out[k] = v
	}
	return out
}
