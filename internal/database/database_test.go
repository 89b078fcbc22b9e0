package database_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/bulkhead"
	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/internal/testdb"
)

func open(t *testing.T, shares map[string]int) *database.DB {
	t.Helper()
	db, err := database.Open(context.Background(), testdb.Config(t), shares)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func TestSeedIsDeterministic(t *testing.T) {
	sum := func(db *database.DB) (n, total int64) {
		require.NoError(t, db.SQL().QueryRow(`SELECT COUNT(*), CAST(SUM(amount_cents) AS BIGINT) FROM orders`).Scan(&n, &total))
		return
	}
	a := open(t, map[string]int{"batch": 1})
	b := open(t, map[string]int{"batch": 1})
	n, total := sum(a)
	require.EqualValues(t, 3000, n)
	n2, total2 := sum(b)
	require.Equal(t, n, n2)
	require.Equal(t, total, total2, "the same config seeds the same data")

	var minAt, maxAt string
	require.NoError(t, a.SQL().QueryRow(`SELECT MIN(ordered_at), MAX(ordered_at) FROM orders`).Scan(&minAt, &maxAt))
	require.GreaterOrEqual(t, minAt, "2026-07-01T00:00:00Z")
	require.Less(t, maxAt, "2026-11-01T00:00:00Z")

	// Opening again does not seed twice.
	cfg := testdb.Config(t)
	db1, err := database.Open(context.Background(), cfg, nil)
	require.NoError(t, err)
	_ = db1.Close()
	db2, err := database.Open(context.Background(), cfg, nil)
	require.NoError(t, err)
	defer db2.Close()
	n3, _ := sum(db2)
	require.EqualValues(t, 3000, n3)
}

func TestConnStaysInsideThePoolsShare(t *testing.T) {
	db := open(t, map[string]int{"batch": 2, "order": 1})
	ctx := context.Background()

	// A handler that tries to hold a second connection is caught.
	err := db.Conn(ctx, "order", func(ctx context.Context, _ *sql.Conn) error {
		return db.Conn(ctx, "order", func(context.Context, *sql.Conn) error { return nil })
	})
	require.EqualError(t, err, `bulkhead "db:order" is full (1/1)`)
	require.True(t, errors.Is(err, bulkhead.ErrFull))

	err = db.Conn(ctx, "search", func(context.Context, *sql.Conn) error { return nil })
	require.ErrorIs(t, err, database.ErrNoShare)
	require.EqualError(t, err, `database: pool has no share of the connections: "search"`)

	// Many goroutines on the batch share: never more than 2 connections.
	var inside, peak atomic.Int64
	var wg sync.WaitGroup
	var accepted, rejected atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				err := db.Conn(ctx, "batch", func(ctx context.Context, conn *sql.Conn) error {
					n := inside.Add(1)
					defer inside.Add(-1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					var one int
					return conn.QueryRowContext(ctx, `SELECT 1`).Scan(&one)
				})
				if errors.Is(err, bulkhead.ErrFull) {
					rejected.Add(1)
				} else {
					require.NoError(t, err)
					accepted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, peak.Load(), int64(2))
	require.EqualValues(t, 16*20, accepted.Load()+rejected.Load())
	require.LessOrEqual(t, db.PeakConnections()["batch"], 2)
	require.Positive(t, db.PeakConnections()["batch"])
}

func TestOrderAndSearchWrites(t *testing.T) {
	db := open(t, map[string]int{"order": 1, "search": 1})
	ctx := context.Background()
	at := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	var id int64
	require.NoError(t, db.Conn(ctx, "order", func(ctx context.Context, c *sql.Conn) error {
		var err error
		id, err = database.InsertOrder(ctx, c, at, "north", "books", 7, 1234)
		return err
	}))
	var amount int64
	var orderedAt string
	require.NoError(t, db.SQL().QueryRow(`SELECT amount_cents, ordered_at FROM orders WHERE id = $1`, id).Scan(&amount, &orderedAt))
	require.EqualValues(t, 1234, amount)
	require.Equal(t, "2026-11-30T09:00:00Z", orderedAt)

	for range 3 {
		require.NoError(t, db.Conn(ctx, "search", func(ctx context.Context, c *sql.Conn) error {
			return database.IndexProduct(ctx, c, 42, "teapot", "garden", at)
		}))
	}
	var version int64
	require.NoError(t, db.SQL().QueryRow(`SELECT version FROM search_index WHERE product_id = 42`).Scan(&version))
	require.EqualValues(t, 3, version, "each refresh bumps the version")
}

func TestConfigProblems(t *testing.T) {
	cfg := database.Config{URL: "mysql://x", SQLitePath: "a.db", MaxConnections: -1, SeedOrders: -5, SeedUntil: "2026"}
	cfg.SetDefaults()
	require.Equal(t, []string{
		`database: url "mysql://x" must be a postgres:// URL`,
		"database: set either url (PostgreSQL) or sqlite_path, not both",
		"database: max_connections must be >= 1, got -1",
		"database: seed_orders must be -1 (none), 0 (default) or more, got -5",
		`database: seed_until must be YYYY-MM, got "2026"`,
	}, cfg.Problems())
	require.Equal(t, "postgres://app:xxxxx@db:5432/x", database.Redact("postgres://app:pw@db:5432/x"))
}

func TestUnreachablePostgres(t *testing.T) {
	cfg := database.Config{URL: "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"}
	cfg.SetDefaults()
	_, err := database.Open(context.Background(), cfg, nil)
	require.ErrorContains(t, err, "database: PostgreSQL postgres://nobody@127.0.0.1:1/none?connect_timeout=2 is unreachable")
}

// TestNoDemoDataIntoOtherData: a database that already holds other tables
// (someone's application) and no orders is not seeded: Open refuses, says
// which tables and what to do, and leaves the database as it was; with
// seed_orders -1 it opens without writing a row.
func TestNoDemoDataIntoOtherData(t *testing.T) {
	cfg := testdb.Config(t)
	driver, dsn := "sqlite", cfg.SQLitePath
	if cfg.URL != "" {
		driver, dsn = "pgx", cfg.URL
	}
	other, err := sql.Open(driver, dsn)
	require.NoError(t, err)
	defer other.Close()
	_, err = other.Exec(`CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)`)
	require.NoError(t, err)
	tables := func() []string {
		t.Helper()
		q := `SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`
		if cfg.URL != "" {
			q = `SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1`
		}
		rows, err := other.Query(q)
		require.NoError(t, err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var n string
			require.NoError(t, rows.Scan(&n))
			out = append(out, n)
		}
		require.NoError(t, rows.Err())
		return out
	}

	_, err = database.Open(context.Background(), cfg, map[string]int{"batch": 1})
	require.ErrorIs(t, err, database.ErrHoldsOtherTables)
	require.EqualError(t, err, "database: will not write demo orders into "+cfg.Describe()+
		`: it holds other tables ("customers") and no orders; give compartment a database of its own `+
		"(an empty one: its tables are created and seeded), or set database.seed_orders: -1 to use this one without demo data; nothing was written")
	require.Equal(t, []string{"customers"}, tables(), "the refused open created nothing")

	cfg.SeedOrders = -1
	db, err := database.Open(context.Background(), cfg, map[string]int{"batch": 1})
	require.NoError(t, err)
	defer db.Close()
	var n int
	require.NoError(t, db.SQL().QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&n))
	require.Zero(t, n, "seed_orders -1: no demo orders")
	require.Equal(t, []string{"customers", "orders", "search_index"}, tables())
}
