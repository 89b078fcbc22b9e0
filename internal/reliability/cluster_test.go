package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/queues"
)

// TestClusterSlotsFreedAfterKill runs three worker processes on one Redis
// with a cluster-wide batch pool of 2, kills the one holding slots with
// SIGKILL, and checks that its slots are free again within the lease time,
// that the other processes take them, that the pool never holds more than 2
// slots, and that every report completes.
func TestClusterSlotsFreedAfterKill(t *testing.T) {
	r := startRedis(t)
	cfg, ns := config(t, r, "shutdown_timeout: 5s", "shutdown_timeout: 5s\nreport_min_duration: 6s")
	workers := map[int]*proc{}
	for range 3 {
		w := startWorker(t, cfg)
		workers[w.cmd.Process.Pid] = w
	}
	plan := filepath.Join(apptest.RepoPath("configs"), "month-end.yaml")
	code, out := enqueue(t, cfg, "month-end", "-plan", plan, "-period", "2026-10")
	require.Equal(t, 0, code, out)

	ctx := context.Background()
	maxSeen := 0
	slots := func() (int, map[string]int) {
		n, holders, err := queues.ClusterSlots(ctx, r.Client, ns, "batch")
		require.NoError(t, err)
		maxSeen = max(maxSeen, n)
		return n, holders
	}
	var holders map[string]int
	waitFor(t, 30*time.Second, "the batch pool to be full", func() bool {
		var n int
		n, holders = slots()
		return n == 2
	})

	// Kill a process that holds a slot. Holder names are host:pid:id.
	var victim *proc
	var victimName string
	for name := range holders {
		var pid int
		fmt.Sscanf(strings.Split(name, ":")[1], "%d", &pid)
		if w, ok := workers[pid]; ok {
			victim, victimName = w, name
			break
		}
	}
	require.NotNil(t, victim, "holders %v are none of the workers", holders)
	killedAt := time.Now()
	victim.signal(syscall.SIGKILL)
	require.Equal(t, -int(syscall.SIGKILL), victim.wait(10*time.Second))

	waitFor(t, queues.GateLeaseTTL+10*time.Second, "the killed process's slots to be freed", func() bool {
		_, h := slots()
		return h[victimName] == 0
	})
	freed := time.Since(killedAt)
	t.Logf("slots of the killed process freed %s after SIGKILL (lease %s)", freed.Round(100*time.Millisecond), queues.GateLeaseTTL)
	require.LessOrEqual(t, freed, queues.GateLeaseTTL+5*time.Second)

	waitFor(t, 30*time.Second, "the other processes to fill the pool again", func() bool {
		n, h := slots()
		return n == 2 && h[victimName] == 0
	})

	// The status command shows the cluster-wide numbers and the holders.
	code, out = enqueue(t, cfg, "status", "-json")
	require.Equal(t, 0, code, out)
	var st app.Status
	require.NoError(t, json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &st))
	batch := st.Pools[2]
	require.Equal(t, "cluster", batch.Scope)
	require.Equal(t, 2, batch.Capacity)
	require.Equal(t, 2, batch.Workers)
	require.LessOrEqual(t, batch.Active, 2)
	require.NotContains(t, batch.Holders, victimName)

	waitFor(t, 4*time.Minute, "every report to complete (the killed process's ones recovered)", func() bool {
		slots()
		return countStates(jobStates(t, r.Client, ns))[asynq.TaskStateCompleted] == 10
	})
	t.Logf("all 10 reports completed %s after the kill; at most %d slots held at any poll", time.Since(killedAt).Round(time.Second), maxSeen)
	require.LessOrEqual(t, maxSeen, 2)
}
