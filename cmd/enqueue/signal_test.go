package main

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
)

// TestInterrupted: a SIGTERM (or SIGINT) to enqueue says that enqueue
// stops, in its own words (not the worker's about running jobs), exits
// 128 + the signal's number, and leaves what it enqueued queued; a second
// signal exits at once, saying only that.
func TestInterrupted(t *testing.T) {
	t.Parallel()
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "")
	// No worker runs: month-end -wait watches until it is interrupted.
	start := func(t *testing.T, period string) (chan os.Signal, *apptest.SyncBuffer, *apptest.SyncBuffer, chan int, chan int) {
		t.Helper()
		sigs := make(chan os.Signal, 2)
		var stdout, stderr apptest.SyncBuffer
		exited, done := make(chan int, 1), make(chan int, 1)
		env := cli.Env{Args: []string{"-config", cfg, "month-end", "-plan", apptest.RepoPath("configs/month-end.yaml"), "-period", period, "-wait", "-poll", "20ms"},
			Stdout: &stdout, Stderr: &stderr, Getenv: noEnv}
		go func() {
			done <- cli.RunWithSignals("enqueue", interrupt, sigs, func(code int) { exited <- code }, run, env)
		}()
		testwait.For(t, 10*time.Second, "the progress to show", func() bool { return strings.Contains(stdout.String(), "progress: ") })
		return sigs, &stdout, &stderr, exited, done
	}

	// terminated starts month-end -wait for period, stops it with one
	// SIGTERM and checks it ended as a stop does; it returns its stdout.
	terminated := func(t *testing.T, period string) string {
		t.Helper()
		sigs, stdout, stderr, exited, done := start(t, period)
		sigs <- syscall.SIGTERM
		select {
		case code := <-done:
			require.Equal(t, 143, code, stdout.String()+stderr.String())
		case <-time.After(10 * time.Second):
			t.Fatalf("enqueue did not stop; output:\n%s%s", stdout.String(), stderr.String())
		}
		require.Equal(t, "enqueue: interrupted (terminated); stopping\n", stderr.String())
		require.Empty(t, exited)
		return stdout.String()
	}
	t.Run("one signal", func(t *testing.T) {
		stdout := terminated(t, "2026-09")
		require.True(t, strings.HasSuffix(stdout, "stopped watching; the run goes on, its jobs stay queued\n"), stdout)
	})
	t.Run("one signal, the plan enqueued again", func(t *testing.T) {
		// Its reports are still queued from a first command: this one
		// watches them, and a signal stops it the same way.
		code, _, stderr := enqueue(t, "-config", cfg, "month-end", "-plan", apptest.RepoPath("configs/month-end.yaml"), "-period", "2026-07")
		require.Equal(t, 0, code, stderr)
		stdout := terminated(t, "2026-07")
		require.Contains(t, stdout, "10 reports already queued or running before this command: watching them too\n")
		require.True(t, strings.HasSuffix(stdout, "stopped watching; the reports stay queued; the same command again watches them\n"), stdout)
	})
	t.Run("second signal", func(t *testing.T) {
		// The first signal's stop is quick (nothing runs), so on a loaded
		// machine it may end before the second signal is read: then the
		// command ends as after one signal, and the second-signal path was
		// not taken. Such a run is tried again; the assertions are on the
		// run that took it.
		for attempt := 1; attempt <= 5; attempt++ {
			sigs, _, stderr, exited, done := start(t, "2026-08")
			sigs <- syscall.SIGINT
			sigs <- syscall.SIGINT
			select {
			case code := <-exited:
				require.Equal(t, 1, code)
				<-done
				require.Equal(t, "enqueue: interrupted (interrupt); stopping\nenqueue: second signal (interrupt): exiting at once\n", stderr.String())
				require.NotContains(t, stderr.String(), "jobs still running")
				return
			case code := <-done:
				require.Equal(t, 130, code, stderr.String())
				t.Logf("attempt %d: the stop ended before the second signal was read; again", attempt)
			case <-time.After(10 * time.Second):
				t.Fatalf("enqueue neither exited nor stopped; stderr:\n%s", stderr.String())
			}
		}
		t.Fatal("in 5 attempts the stop always ended before the second signal was read")
	})
	require.Equal(t, 30, pendingReports(status(t, cfg)), "the three plans stay queued")
}
