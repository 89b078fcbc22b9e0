// Package testdb gives tests a database config: PostgreSQL in a schema of
// their own when TEST_DATABASE_URL is set (CI sets it), otherwise an embedded
// SQLite file in the test's temp dir.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver

	"github.com/lci-labs/compartment/internal/database"
)

// EnvVar names the environment variable with the test PostgreSQL URL.
const EnvVar = "TEST_DATABASE_URL"

// Postgres reports whether tests run against PostgreSQL.
func Postgres() bool { return os.Getenv(EnvVar) != "" }

// Config returns a database config for t with a small seeded dataset: 3000
// orders over July to October 2026 (SeedUntil 2026-11).
func Config(t testing.TB) database.Config {
	t.Helper()
	cfg := database.Config{MaxConnections: 20, SeedOrders: 3000, SeedMonths: 4, SeedUntil: "2026-11"}
	if raw := os.Getenv(EnvVar); raw != "" {
		cfg.URL = schemaURL(t, raw)
		t.Logf("testdb: PostgreSQL (%s)", EnvVar)
	} else {
		cfg.SQLitePath = filepath.Join(t.TempDir(), "test.db")
		t.Logf("testdb: embedded SQLite; set %s to test against PostgreSQL", EnvVar)
	}
	cfg.SetDefaults()
	return cfg
}

// schemaURL creates a schema of the test's own and returns raw with its
// search_path set to it; the schema is dropped when t ends.
func schemaURL(t testing.TB, raw string) string {
	t.Helper()
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])
	admin, err := sql.Open("pgx", raw)
	if err != nil {
		t.Fatalf("%s: %v", EnvVar, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		_ = admin.Close()
		t.Fatalf("%s: create schema: %v", EnvVar, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Logf("testdb: drop schema %s: %v", schema, err)
		}
		_ = admin.Close()
	})
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s: %v", EnvVar, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
