// Package apptest writes complete config files for tests: the test's own
// Redis namespace, database and output directory, with the shipped
// priorities and report catalog.
package apptest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/lci-labs/compartment/internal/testdb"
	"github.com/lci-labs/compartment/internal/testredis"
)

// RepoPath returns the path of a file in the repository.
func RepoPath(rel string) string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", rel)
}

// Config writes a config file for t on r and returns its path. Pools: order
// 3, search 2, batch 2 (tiers regulatory, close, management, adhoc; max
// retry 2) on 10 connections, polling every 20ms. extra is appended as is.
func Config(t testing.TB, r *testredis.Redis, extra string) string {
	t.Helper()
	db := testdb.Config(t)
	dbYAML := fmt.Sprintf("  sqlite_path: %q\n", db.SQLitePath)
	if db.URL != "" {
		dbYAML = fmt.Sprintf("  url: %q\n", db.URL)
	}
	body := fmt.Sprintf(`redis:
  url: %q
namespace: %s
priorities: %s
reports: %s
output_dir: %s
shutdown_timeout: 5s
database:
%s  max_connections: 10
  seed_orders: 3000
  seed_months: 4
  seed_until: "2026-11"
pools:
  - name: order
    size: 3
    job_types: [order:create]
    poll_interval: 20ms
  - name: search
    size: 2
    job_types: [search:index]
    poll_interval: 20ms
  - name: batch
    size: 2
    job_types: [report:run, report:bundle]
    tiers: [regulatory, close, management, adhoc]
    poll_interval: 20ms
    max_retry: 2
%s`, r.URL, r.Namespace(t), RepoPath("configs/priorities.yaml"), RepoPath("configs/reports.yaml"),
		filepath.Join(t.TempDir(), "reports"), dbYAML, extra)
	path := filepath.Join(t.TempDir(), "worker.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// SyncBuffer collects a process's or a command's output; it is safe to
// write from one goroutine and read from another.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// ReplaceInConfig rewrites the config file at path, replacing old (which
// must be there) with new, once.
func ReplaceInConfig(t testing.TB, path, old, new string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		t.Fatalf("config %s has no %q to replace", path, old)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), old, new, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
}
