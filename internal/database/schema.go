package database

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Demo data vocabularies. Reports group by these.
var (
	Regions    = []string{"central", "east", "north", "south", "west"}
	Categories = []string{"apparel", "books", "electronics", "garden", "grocery", "toys"}
)

// Order statuses.
const (
	StatusCompleted = "completed"
	StatusRefunded  = "refunded"
	StatusCancelled = "cancelled"
)

// The schema is the same in both databases but for the key column. Times are
// stored as UTC text in RFC 3339 form ("2026-10-05T13:45:00Z"), which sorts
// and compares the same way in SQLite and PostgreSQL.
func (db *DB) schema() []string {
	id := "INTEGER PRIMARY KEY"
	if db.postgres {
		id = "BIGSERIAL PRIMARY KEY"
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS orders (
			id ` + id + `,
			ordered_at TEXT NOT NULL,
			region TEXT NOT NULL,
			category TEXT NOT NULL,
			customer_id INTEGER NOT NULL,
			amount_cents BIGINT NOT NULL,
			status TEXT NOT NULL
		)`,
		`CREATE INDEX IF NOT EXISTS orders_ordered_at ON orders (ordered_at)`,
		`CREATE TABLE IF NOT EXISTS search_index (
			product_id BIGINT PRIMARY KEY,
			title TEXT NOT NULL,
			category TEXT NOT NULL,
			version BIGINT NOT NULL,
			updated_at TEXT NOT NULL
		)`,
	}
}

// schemaLockKey is the PostgreSQL advisory lock taken, for the length of one
// transaction, around schema creation and the demo seed, so workers started
// together on a fresh database take turns. Any fixed value works as long as
// nothing else in the database uses it for another purpose; this one is
// "cmpt-db" in ASCII.
const schemaLockKey int64 = 0x636d70742d6462

// querier is what schema setup needs of a transaction: *sql.Tx on
// PostgreSQL, a *sql.Conn inside BEGIN IMMEDIATE on SQLite.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// setUpLockWait bounds how long Open waits for another process that is
// creating the schema or seeding; seeding the default 60000 orders takes a
// few seconds.
const setUpLockWait = 2 * time.Minute

// setUp creates the schema and seeds the demo data, as one transaction that
// holds a lock every other process's setUp takes, so that any number of
// processes may open the same fresh database at once. Without it, CREATE
// TABLE IF NOT EXISTS races in PostgreSQL (two creators both find the table
// absent, and the loser fails on pg_type_typname_nsp_index), and on SQLite
// two seeders both read an empty table in deferred transactions and the
// second fails with SQLITE_BUSY when it tries to write.
func (db *DB) setUp(ctx context.Context) error {
	return db.exclusive(ctx, func(q querier) error {
		if err := db.migrate(ctx, q); err != nil {
			return err
		}
		return db.seed(ctx, q)
	})
}

// exclusive runs fn in a transaction that first takes the set-up lock: the
// advisory lock schemaLockKey on PostgreSQL, the database's write lock
// (BEGIN IMMEDIATE) on SQLite. It waits up to setUpLockWait for the lock,
// then commits when fn returns nil and rolls back otherwise.
func (db *DB) exclusive(ctx context.Context, fn func(q querier) error) error {
	lockCtx, cancel := context.WithTimeout(ctx, setUpLockWait)
	defer cancel()
	lockErr := func(err error) error {
		if ctx.Err() == nil && lockCtx.Err() != nil {
			return fmt.Errorf("database: set up %s: waited %v for another process to finish creating the schema or seeding (is one stuck?): %w",
				db.Describe(), setUpLockWait, err)
		}
		return fmt.Errorf("database: set up %s: take the set-up lock: %w", db.Describe(), err)
	}
	if db.postgres {
		tx, err := db.sql.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("database: set up %s: %w", db.Describe(), err)
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(lockCtx, `SELECT pg_advisory_xact_lock($1)`, schemaLockKey); err != nil {
			return lockErr(err)
		}
		if err := fn(tx); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("database: set up %s: commit: %w", db.Describe(), err)
		}
		return nil
	}
	// database/sql has no way to ask for BEGIN IMMEDIATE, so the transaction
	// is run by hand on a connection of its own. Each attempt waits up to
	// busy_timeout; a long seed in another process takes several.
	conn, err := db.sql.Conn(ctx)
	if err != nil {
		return fmt.Errorf("database: set up %s: %w", db.Describe(), err)
	}
	defer conn.Close()
	if err := retryBusy(lockCtx, func() error {
		_, err := conn.ExecContext(lockCtx, `BEGIN IMMEDIATE`)
		return err
	}); err != nil {
		return lockErr(err)
	}
	err = fn(conn)
	if err == nil {
		if _, cerr := conn.ExecContext(ctx, `COMMIT`); cerr != nil {
			err = fmt.Errorf("database: set up %s: commit: %w", db.Describe(), cerr)
		}
	}
	if err != nil {
		if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`); rerr != nil {
			// Do not hand a connection that may still be inside the
			// transaction back to the pool.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	return err
}

func (db *DB) migrate(ctx context.Context, q querier) error {
	for _, stmt := range db.schema() {
		if _, err := q.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("database: create schema on %s: %w", db.Describe(), err)
		}
	}
	return nil
}

// seed writes the demo orders when the orders table is empty. The data is
// the same for the same config, so reports over it are reproducible. It runs
// inside setUp's transaction, so the check for an empty table and the
// inserts are one step: two workers starting at once never both seed.
//
// Demo data goes only into a database that holds nothing but this
// package's tables: when the schema it writes into (PostgreSQL's current
// schema, the SQLite file) has any other table or view, seed returns an
// error naming them, and setUp rolls back, so the database is left as it
// was (the tables it just created included). SeedOrders -1 opens such a
// database without demo data.
func (db *DB) seed(ctx context.Context, q querier) error {
	if db.cfg.SeedOrders < 0 {
		return nil
	}
	var n int
	if err := q.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders`).Scan(&n); err != nil {
		return fmt.Errorf("database: seed: %w", err)
	}
	if n > 0 {
		return nil
	}
	others, err := db.otherTables(ctx, q)
	if err != nil {
		return fmt.Errorf("database: seed: list the tables of %s: %w", db.Describe(), err)
	}
	if len(others) > 0 {
		return fmt.Errorf("database: will not write demo orders into %s: it %w (%s) and no orders; "+
			"give compartment a database of its own (an empty one: its tables are created and seeded), "+
			"or set database.seed_orders: -1 to use this one without demo data; nothing was written",
			db.Describe(), ErrHoldsOtherTables, listNames(others, 5))
	}
	until, _ := time.Parse("2006-01", db.cfg.SeedUntil)
	from := until.AddDate(0, -db.cfg.SeedMonths, 0)
	span := until.Sub(from)
	rng := rand.New(rand.NewPCG(20261130, uint64(db.cfg.SeedOrders)))

	const batch = 400
	rows := make([]any, 0, batch*6)
	flush := func(count int) error {
		if count == 0 {
			return nil
		}
		var b strings.Builder
		b.WriteString(`INSERT INTO orders (ordered_at, region, category, customer_id, amount_cents, status) VALUES `)
		for i := range count {
			if i > 0 {
				b.WriteString(", ")
			}
			p := i * 6
			fmt.Fprintf(&b, "($%d, $%d, $%d, $%d, $%d, $%d)", p+1, p+2, p+3, p+4, p+5, p+6)
		}
		_, err := q.ExecContext(ctx, b.String(), rows...)
		rows = rows[:0]
		return err
	}
	pending := 0
	for range db.cfg.SeedOrders {
		at := from.Add(time.Duration(rng.Int64N(int64(span)))).Truncate(time.Second)
		status := StatusCompleted
		switch r := rng.IntN(100); {
		case r < 7:
			status = StatusRefunded
		case r < 15:
			status = StatusCancelled
		}
		// Most baskets are small, a few are large.
		amount := 500 + rng.Int64N(4500) + rng.Int64N(2)*rng.Int64N(45000)
		rows = append(rows, at.Format(time.RFC3339), Regions[rng.IntN(len(Regions))],
			Categories[rng.IntN(len(Categories))], 1+rng.IntN(2000), amount, status)
		pending++
		if pending == batch {
			if err := flush(pending); err != nil {
				return fmt.Errorf("database: seed: %w", err)
			}
			pending = 0
		}
	}
	if err := flush(pending); err != nil {
		return fmt.Errorf("database: seed: %w", err)
	}
	return nil
}

// ErrHoldsOtherTables is matched by the error Open returns instead of
// seeding demo orders into a database that holds tables other than its own.
var ErrHoldsOtherTables = errors.New("holds other tables")

// ourTables are the tables the schema creates.
var ourTables = []string{"orders", "search_index"}

// otherTables lists, sorted, the tables and views other than ourTables in
// the schema the database writes into: PostgreSQL's current schema (the
// first of search_path that exists), or the SQLite file.
func (db *DB) otherTables(ctx context.Context, q querier) ([]string, error) {
	// querier has no Query, so the names come back joined in one row.
	query := `SELECT string_agg(table_name::text, E'\n') FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_name::text NOT IN ($1, $2)`
	if !db.postgres {
		query = `SELECT group_concat(name, char(10)) FROM sqlite_master
			WHERE type IN ('table', 'view') AND name NOT IN ($1, $2) AND name NOT LIKE 'sqlite\_%' ESCAPE '\'`
	}
	var list sql.NullString
	if err := q.QueryRowContext(ctx, query, ourTables[0], ourTables[1]).Scan(&list); err != nil {
		return nil, err
	}
	if !list.Valid || list.String == "" {
		return nil, nil
	}
	names := strings.Split(list.String, "\n")
	slices.Sort(names)
	return names, nil
}

// listNames quotes up to limit names and says how many more there are.
func listNames(names []string, limit int) string {
	quoted := make([]string, 0, limit)
	for i, n := range names {
		if i == limit {
			return strings.Join(quoted, ", ") + fmt.Sprintf(" and %d more", len(names)-limit)
		}
		quoted = append(quoted, fmt.Sprintf("%q", n))
	}
	return strings.Join(quoted, ", ")
}

// InsertOrder records a new order; the order pool's job.
func InsertOrder(ctx context.Context, conn *sql.Conn, at time.Time, region, category string, customer int, amountCents int64) (int64, error) {
	var id int64
	err := conn.QueryRowContext(ctx,
		`INSERT INTO orders (ordered_at, region, category, customer_id, amount_cents, status) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`,
		at.UTC().Format(time.RFC3339), region, category, customer, amountCents, StatusCompleted).Scan(&id)
	return id, err
}

// IndexProduct creates or refreshes a product's search entry; the search
// pool's job. Each refresh bumps the entry's version.
func IndexProduct(ctx context.Context, conn *sql.Conn, productID int64, title, category string, at time.Time) error {
	_, err := conn.ExecContext(ctx,
		`INSERT INTO search_index (product_id, title, category, version, updated_at) VALUES ($1, $2, $3, 1, $4)
		 ON CONFLICT (product_id) DO UPDATE SET title = excluded.title, category = excluded.category,
		 version = search_index.version + 1, updated_at = excluded.updated_at`,
		productID, title, category, at.UTC().Format(time.RFC3339))
	return err
}
