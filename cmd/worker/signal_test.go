package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/internal/testwait"
)

// TestSignals runs the real worker process: SIGTERM stops it gracefully
// with exit code 0; a second signal while it stops exits at once with exit
// code 1, saying so, instead of waiting out the shutdown timeout.
func TestSignals(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes; run without -short")
	}
	r := testredis.New(t)
	cfg := apptest.Config(t, r, "report_min_duration: 30s\n")
	loaded, err := app.Load(cfg, nil)
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(r.Client)

	start := func(t *testing.T) (*exec.Cmd, *apptest.SyncBuffer, chan int) {
		var out apptest.SyncBuffer
		cmd := exec.Command(os.Args[0], "-config", cfg)
		cmd.Env = append(os.Environ(), runAsWorker+"=1", "REDIS_URL=", "DATABASE_URL=")
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		exited := make(chan int, 1)
		go func() {
			_ = cmd.Wait()
			exited <- cmd.ProcessState.ExitCode()
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exited
		})
		testwait.For(t, 60*time.Second, "the worker's three pools to serve", func() bool {
			servers, err := insp.Servers()
			if err != nil {
				return false
			}
			n := 0
			for _, s := range servers {
				if s.PID == cmd.Process.Pid {
					n++
				}
			}
			return n == 3
		})
		return cmd, &out, exited
	}
	wait := func(t *testing.T, exited chan int, out *apptest.SyncBuffer, within time.Duration) int {
		select {
		case code := <-exited:
			exited <- code // for the cleanup
			return code
		case <-time.After(within):
			t.Fatalf("the worker did not exit within %s; output:\n%s", within, out.String())
			return 0
		}
	}

	t.Run("one signal: graceful stop, exit 0", func(t *testing.T) {
		cmd, out, exited := start(t)
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		require.Equal(t, 0, wait(t, exited, out, 30*time.Second), out.String())
		require.Contains(t, out.String(), "all pools stopped")
	})

	t.Run("second signal: exit 1 at once", func(t *testing.T) {
		cmd, out, exited := start(t)
		enq, err := app.NewEnqueuer(context.Background(), loaded)
		require.NoError(t, err)
		defer enq.Close()
		_, _, err = enq.EnqueueReport(context.Background(), "vat-return", "2026-10", "")
		require.NoError(t, err)
		testwait.For(t, 30*time.Second, "the report to run", func() bool {
			st, err := enq.Status(context.Background())
			return err == nil && st.Pools[2].Active == 1
		})
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		testwait.For(t, 10*time.Second, "the graceful stop to begin", func() bool {
			return strings.Contains(out.String(), "signal received; stopping gracefully")
		})
		began := time.Now()
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		require.Equal(t, 1, wait(t, exited, out, 10*time.Second), out.String())
		require.Less(t, time.Since(began), 3*time.Second, "it did not wait out the shutdown timeout")
		require.Contains(t, out.String(), "second signal (terminated): exiting at once")
	})
}
