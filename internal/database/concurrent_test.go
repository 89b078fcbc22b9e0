package database_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/database"
	"github.com/lci-labs/compartment/internal/testdb"
)

// TestConcurrentFirstOpen starts three workers at once on a database whose
// tables do not exist yet, as a deploy does: each opens its own *DB. All
// must succeed, and the demo data must be seeded exactly once. Before the
// schema lock, PostgreSQL failed with "duplicate key value violates unique
// constraint pg_type_typname_nsp_index" and SQLite with SQLITE_BUSY.
func TestConcurrentFirstOpen(t *testing.T) {
	const workers, rounds = 3, 4
	backends := []struct {
		name   string
		config func(t *testing.T) database.Config
	}{
		{"sqlite", func(t *testing.T) database.Config {
			cfg := database.Config{SQLitePath: filepath.Join(t.TempDir(), "fresh.db"), SeedMonths: 4, SeedUntil: "2026-11"}
			cfg.SetDefaults()
			return cfg
		}},
		{"postgres", func(t *testing.T) database.Config {
			if !testdb.Postgres() {
				t.Skipf("set %s to test against PostgreSQL", testdb.EnvVar)
			}
			return testdb.Config(t) // a fresh schema of this test's own
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			// A few rounds, each on a fresh database, so that a lost race
			// shows; without the locks the first round already fails almost
			// every time.
			for round := range rounds {
				cfg := b.config(t)
				cfg.SeedOrders = 300 // enough to seed in several batches, and quick under -race
				dbs, errs := openAtOnce(cfg, workers)
				for i, err := range errs {
					require.NoErrorf(t, err, "round %d, worker %d", round, i)
				}
				var n int
				require.NoError(t, dbs[0].SQL().QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&n))
				require.Equalf(t, cfg.SeedOrders, n, "round %d: the orders are seeded exactly once", round)
				for _, db := range dbs {
					require.NoError(t, db.Close())
				}
			}
		})
	}
}

// openAtOnce opens n databases with cfg from n goroutines released together.
// It returns each one's *DB and error; the *DBs that opened are closed by the
// caller, or here if any failed.
func openAtOnce(cfg database.Config, n int) ([]*database.DB, []error) {
	start := make(chan struct{})
	dbs := make([]*database.DB, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			dbs[i], errs[i] = database.Open(context.Background(), cfg, map[string]int{"batch": 1})
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			for _, db := range dbs {
				if db != nil {
					_ = db.Close()
				}
			}
			return nil, errs
		}
	}
	return dbs, errs
}
