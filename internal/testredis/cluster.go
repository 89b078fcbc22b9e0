package testredis

import (
	"context"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/internal/testwait"
)

// Cluster is a Redis Cluster of masters only, started by a test on
// loopback ports, each node a redis-server of its own.
type Cluster struct {
	// Addrs are the nodes, host:port.
	Addrs []string
	// Client is a cluster client over every node.
	Client *redis.ClusterClient
	nodes  []*exec.Cmd
}

// StartCluster starts a cluster of n masters (slots split evenly) and stops
// it when t ends. It skips t when redis-server is not installed (.ci/run
// installs it).
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (.ci/run installs it); this test starts a Redis Cluster")
	}
	c := &Cluster{}
	t.Cleanup(c.stop)
	for range n {
		// A node counts only once the Redis answering at its port is the
		// process started (Launch): between the port's check and the
		// node's bind, another test may take it.
		for attempt := 1; ; attempt++ {
			port := clusterPort(t)
			cmd, ours := Launch(t, port, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
				"--dir", t.TempDir(), "--save", "", "--appendonly", "no")
			c.nodes = append(c.nodes, cmd)
			if ours {
				c.Addrs = append(c.Addrs, fmt.Sprintf("127.0.0.1:%d", port))
				break
			}
			if attempt == 5 {
				t.Fatalf("testredis: another server answered at each of 5 free ports for a cluster node, the last %d", port)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var nodes []*redis.Client
	for _, a := range c.Addrs {
		nc := redis.NewClient(&redis.Options{Addr: a})
		defer nc.Close()
		nodes = append(nodes, nc)
	}
	per := 16384 / n
	for i, nc := range nodes {
		lo, hi := i*per, (i+1)*per-1
		if i == n-1 {
			hi = 16383
		}
		if err := nc.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			t.Fatalf("testredis: cluster addslots on %s: %v", c.Addrs[i], err)
		}
	}
	for _, nc := range nodes[1:] {
		host, port, _ := strings.Cut(c.Addrs[0], ":")
		if err := nc.ClusterMeet(ctx, host, port).Err(); err != nil {
			t.Fatalf("testredis: cluster meet: %v", err)
		}
	}
	for _, nc := range nodes {
		for {
			info, err := nc.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("testredis: cluster not ready after 30s: %v %s", err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	c.Client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { _ = c.Client.Close() })
	for ctx.Err() == nil {
		// Every node must agree on the slots before the first command.
		if err := c.Client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() }); err == nil {
			if slots, err := c.Client.ClusterSlots(ctx).Result(); err == nil && len(slots) == n {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("testredis: Redis Cluster of %d masters at %s", n, strings.Join(c.Addrs, ","))
	return c
}

// Redis returns the cluster as a *Redis, for tests written against one:
// its Client is the cluster client, Connect makes more, and it has no
// Options, URL or Mini.
func (c *Cluster) Redis() *Redis { return &Redis{Client: c.Client, cluster: c} }

// clusterPort picks a port for a cluster node whose cluster bus port (the
// port + 10000) is free as well. The ports come from below the range the
// kernel hands out to outgoing connections (32768 and up on Linux), so that
// a bus port cannot collide with one of the many client connections a busy
// test run has open: a node whose bus port is taken exits at once, and the
// cluster never becomes ready.
func clusterPort(t testing.TB) int {
	t.Helper()
	for range 200 {
		port := 20000 + mathrand.IntN(2700)
		a, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		b, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+10000))
		_ = a.Close()
		if err != nil {
			continue
		}
		_ = b.Close()
		return port
	}
	t.Fatal("testredis: no free port pair for a cluster node in 20000-32699")
	return 0
}

func (c *Cluster) stop() {
	for _, cmd := range c.nodes {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// StartServer starts a redis-server of the test's own on a loopback port,
// with extra arguments (for example an ACL), stops it when t ends and
// returns its address. It skips t when redis-server is not installed.
// For tests that change what is server-wide (users, functions): never
// the shared Redis.
func StartServer(t testing.TB, extra ...string) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (.ci/run installs it); this test starts a Redis of its own")
	}
	for attempt := 1; ; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		cmd, ours := Launch(t, port, append([]string{"--dir", t.TempDir(), "--save", "", "--appendonly", "no"}, extra...)...)
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if ours {
			return addr
		}
		if attempt == 5 {
			t.Fatalf("testredis: another server answered at each of 5 free ports, the last %s", addr)
		}
	}
}

// Launch starts redis-server on the loopback port with args, waits up to
// 10 s until a Redis answers there, and says whether that Redis is the
// one it started (Answers). When not, another test's server took the port
// first and this one could not bind: the caller tries another port (or
// fails) and stops cmd.
func Launch(t testing.TB, port int, args ...string) (cmd *exec.Cmd, ours bool) {
	t.Helper()
	cmd = exec.Command("redis-server", append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("testredis: start redis-server: %v", err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	testwait.For(t, 10*time.Second, "redis-server at "+addr+" to answer", func() bool {
		var answers bool
		answers, ours = Answers(context.Background(), addr, cmd.Process.Pid)
		return answers
	})
	return cmd, ours
}

// Answers says whether the Redis at addr answers and is the process pid:
// a redis-server started on a port that another test's server took in the
// meantime (a free port is free only until someone binds it) fails to
// bind and exits, while the other server answers in its place.
func Answers(ctx context.Context, addr string, pid int) (answers, ours bool) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return false, false
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return true, v == fmt.Sprint(pid)
		}
	}
	return true, false
}
