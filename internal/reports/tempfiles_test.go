package reports_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"modernc.org/sqlite" // the "sqlite" driver

	"github.com/lci-labs/compartment/internal/reports"
)

// sqliteConn is one connection to a private in-memory SQLite database.
func sqliteConn(t *testing.T) *sql.Conn {
	t.Helper()
	db, err := sql.Open("sqlite", ":memory:")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	conn, err := db.Conn(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

var periodReport = reports.Report{Name: "vat", Format: reports.FormatCSV, Query: `SELECT $1 AS period_start, $2 AS period_end`}

func mustPeriod(t *testing.T, s string) reports.Period {
	t.Helper()
	p, err := reports.ParsePeriod(s)
	require.NoError(t, err)
	return p
}

// writeFile writes a file under dir and sets its modification time to age
// ago.
func writeFile(t *testing.T, dir, name string, age time.Duration) {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte("partial,row\n"), 0o644))
	at := time.Now().Add(-age)
	require.NoError(t, os.Chtimes(path, at, at))
}

// listDir returns the names in dir.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestCleanStaleTemp(t *testing.T) {
	dir := t.TempDir()
	const hour = time.Hour
	stale := []string{
		".vat_2026-10.csv.tmp-1234567",
		".trial-balance_2026-09.csv.tmp-42",
		".a.b_c-d_2026-10.csv.tmp-4294967295",
	}
	kept := []string{
		".vat_2026-10.csv.tmp-7654321", // ours but fresh: a run in progress
		"vat_2026-10.csv",              // a finished report
		"notes.txt",
		".vat_2026-10.csv.tmp-",       // no random digits: not a name Run makes
		".vat_2026-10.csv.tmp-12ab",   // nor this
		".vat_2026-10.csv.tmp-1.bak",  // nor this
		"vat_2026-10.csv.tmp-1234",    // no leading dot
		".vat_2026-10.xlsx.tmp-1234",  // another format: someone else's
		".vat_2026-1.csv.tmp-1234",    // not a period
		"..vat_2026-10.csv.tmp-1234",  // not a report name
		".vat_2026-10.csv.tmp-1234~",  // an editor's backup
		"sub/.vat_2026-10.csv.tmp-99", // in a subdirectory: not descended into
	}
	for _, name := range stale {
		writeFile(t, dir, name, hour)
	}
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	for _, name := range kept {
		age := hour
		if name == ".vat_2026-10.csv.tmp-7654321" {
			age = time.Second
		}
		writeFile(t, dir, name, age)
	}
	// A directory with our temporary-file name is not ours to remove.
	require.NoError(t, os.Mkdir(filepath.Join(dir, ".tb_2026-10.csv.tmp-5"), 0o755))
	old := time.Now().Add(-hour)
	require.NoError(t, os.Chtimes(filepath.Join(dir, ".tb_2026-10.csv.tmp-5"), old, old))

	removed, err := reports.CleanStaleTemp(dir, 10*time.Minute)
	require.NoError(t, err)
	require.Equal(t, len(stale), removed)
	for _, name := range stale {
		require.NoFileExists(t, filepath.Join(dir, name))
	}
	for _, name := range kept {
		require.FileExists(t, filepath.Join(dir, name))
	}
	require.DirExists(t, filepath.Join(dir, ".tb_2026-10.csv.tmp-5"))

	// Nothing left to do; a missing directory has nothing to clean.
	removed, err = reports.CleanStaleTemp(dir, 10*time.Minute)
	require.NoError(t, err)
	require.Zero(t, removed)
	removed, err = reports.CleanStaleTemp(filepath.Join(dir, "none"), 0)
	require.NoError(t, err)
	require.Zero(t, removed)
}

// TestRunRemovesLeftoversOfTheSameReport: a rerun cleans up the temporary
// files an earlier run of the same report and period left when it was
// killed, however recent, and touches nothing else.
func TestRunRemovesLeftoversOfTheSameReport(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, ".vat_2026-10.csv.tmp-111", time.Hour)
	writeFile(t, dir, ".vat_2026-10.csv.tmp-222", 0)
	others := []string{
		".vat_2026-09.csv.tmp-333",        // another period
		".vat-return_2026-10.csv.tmp-444", // another report
		".vat_2026-10.csv.tmp-555.bak",    // not ours
		"vat_2026-09.csv",
		"notes.txt",
	}
	for _, name := range others {
		writeFile(t, dir, name, time.Hour)
	}

	res, err := reports.Run(context.Background(), sqliteConn(t), periodReport, mustPeriod(t, "2026-10"), dir)
	require.NoError(t, err)
	require.Equal(t, 2, res.LeftoversRemoved)
	require.Equal(t, filepath.Join(dir, "vat_2026-10.csv"), res.Path)
	data, err := os.ReadFile(res.Path)
	require.NoError(t, err)
	require.Equal(t, "period_start,period_end\n2026-10-01T00:00:00Z,2026-11-01T00:00:00Z\n", string(data))
	require.ElementsMatch(t, append([]string{"vat_2026-10.csv"}, others...), listDir(t, dir))
}

// helperDirEnv tells the test binary, run again as a child process, to act
// as a worker stuck in the middle of a report; see TestHelperStuckReport.
const helperDirEnv = "REPORTS_TEST_STUCK_REPORT_DIR"

// TestHelperStuckReport is not a test: TestKilledRunLeavesATempFileTheRerunRemoves
// runs the test binary again with helperDirEnv set, and this function then
// runs a report whose query hangs after some rows, until it is killed.
func TestHelperStuckReport(t *testing.T) {
	dir := os.Getenv(helperDirEnv)
	if dir == "" {
		t.Skip("run as a child process by TestKilledRunLeavesATempFileTheRerunRemoves")
	}
	// hang stands for a slow query; the parent kills this process long
	// before it returns.
	require.NoError(t, sqlite.RegisterScalarFunction("hang", 0, func(*sqlite.FunctionContext, []driver.Value) (driver.Value, error) {
		<-time.After(time.Minute)
		return int64(0), nil
	}))
	r := reports.Report{Name: "vat", Format: reports.FormatCSV, Query: `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
		SELECT i, $1 AS period_start, $2 AS period_end, CASE WHEN i = 1000 THEN hang() ELSE 0 END AS x FROM n`}
	_, err := reports.Run(context.Background(), sqliteConn(t), r, mustPeriod(t, "2026-10"), dir)
	t.Fatalf("the report was meant to hang, but returned %v", err)
}

// TestKilledRunLeavesATempFileTheRerunRemoves kills (SIGKILL) a process in
// the middle of writing a report, checks it left its temporary file, and
// that the rerun removes it and writes the report.
func TestKilledRunLeavesATempFileTheRerunRemoves(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	dir := t.TempDir()
	cmd := exec.Command(exe, "-test.run=^TestHelperStuckReport$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperDirEnv+"="+dir)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	// Wait until the child is writing the report.
	var leftover string
	deadline := time.Now().Add(30 * time.Second)
	for leftover == "" {
		for _, name := range listDir(t, dir) {
			if strings.HasPrefix(name, ".vat_2026-10.csv.tmp-") {
				leftover = name
			}
		}
		if leftover != "" {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the child exited before writing (%v):\n%s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "no temporary file after 30s:\n%s", out.String())
	}
	require.NoError(t, cmd.Process.Kill())
	require.Error(t, <-exited, "killed")
	exited <- nil // for the cleanup
	require.Equal(t, []string{leftover}, listDir(t, dir), "kill -9 leaves the temporary file")

	res, err := reports.Run(context.Background(), sqliteConn(t), periodReport, mustPeriod(t, "2026-10"), dir)
	require.NoError(t, err)
	require.Equal(t, 1, res.LeftoversRemoved)
	require.Equal(t, []string{"vat_2026-10.csv"}, listDir(t, dir))
}
