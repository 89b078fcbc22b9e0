package cli_test

import (
	"bytes"
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
)

// Durations in logs read as durations, in text and in JSON.
func TestLogDurationsAsText(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		log, err := cli.NewLogger(&buf, format, "info")
		require.NoError(t, err)
		log.Info("pool started", "poll_interval", 100*time.Millisecond)
		require.Contains(t, buf.String(), "100ms", format)
		require.NotContains(t, buf.String(), "100000000", format)
	}
}

// TestRunWithSignals: the first signal cancels the command's context with
// the signal as its cause and prints the command's own words; a second one
// prints its own and exits at once with code 1.
func TestRunWithSignals(t *testing.T) {
	t.Parallel()
	it := cli.Interrupt{First: "interrupted (%s); stopping", Second: "second signal (%s): exiting at once"}
	// run waits for its context, tells the test its cause, then waits to
	// be let go and returns the interrupted exit code.
	start := func(t *testing.T, it cli.Interrupt) (sigs chan os.Signal, stderr *apptest.SyncBuffer, exited chan int, canceled chan error, release chan struct{}, done chan int) {
		t.Helper()
		sigs, stderr = make(chan os.Signal, 2), &apptest.SyncBuffer{}
		exited, canceled, release, done = make(chan int, 1), make(chan error, 1), make(chan struct{}), make(chan int, 1)
		run := func(ctx context.Context, env cli.Env) int {
			<-ctx.Done()
			canceled <- context.Cause(ctx)
			<-release
			code, _ := cli.InterruptedCode(ctx)
			return code
		}
		go func() {
			done <- cli.RunWithSignals("enqueue", it, sigs, func(code int) { exited <- code }, run, cli.Env{Stderr: stderr})
		}()
		return sigs, stderr, exited, canceled, release, done
	}

	t.Run("one signal", func(t *testing.T) {
		sigs, stderr, exited, canceled, release, done := start(t, it)
		sigs <- syscall.SIGTERM
		require.EqualError(t, <-canceled, "interrupted (terminated)")
		close(release)
		require.Equal(t, 143, <-done, "128 + SIGTERM's number")
		require.Equal(t, "enqueue: interrupted (terminated); stopping\n", stderr.String())
		require.Empty(t, exited)
	})
	t.Run("SIGINT", func(t *testing.T) {
		sigs, _, _, canceled, release, done := start(t, it)
		sigs <- syscall.SIGINT
		<-canceled
		close(release)
		require.Equal(t, 130, <-done)
	})
	t.Run("second signal", func(t *testing.T) {
		sigs, stderr, exited, canceled, release, done := start(t, it)
		sigs <- syscall.SIGINT
		<-canceled
		sigs <- syscall.SIGTERM
		require.Equal(t, 1, <-exited)
		require.Equal(t, "enqueue: interrupted (interrupt); stopping\nenqueue: second signal (terminated): exiting at once\n", stderr.String())
		close(release)
		<-done
	})
	t.Run("the worker's words", func(t *testing.T) {
		sigs, stderr, exited, canceled, release, done := start(t, cli.RunnerInterrupt)
		sigs <- syscall.SIGTERM
		<-canceled
		require.Empty(t, stderr.String(), "the worker logs its graceful stop itself")
		sigs <- syscall.SIGTERM
		require.Equal(t, 1, <-exited)
		require.Equal(t, "enqueue: second signal (terminated): exiting at once; jobs still running go back to their queue when their lease lapses\n", stderr.String())
		close(release)
		<-done
	})
	t.Run("no signal", func(t *testing.T) {
		var stderr apptest.SyncBuffer
		code := cli.RunWithSignals("enqueue", it, make(chan os.Signal), func(int) { t.Error("exit called") },
			func(ctx context.Context, env cli.Env) int {
				_, ok := cli.InterruptedCode(ctx)
				require.False(t, ok)
				return 3
			}, cli.Env{Stderr: &stderr})
		require.Equal(t, 3, code)
		require.Empty(t, stderr.String())
	})
}
