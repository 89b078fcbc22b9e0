package app_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/testredis"
	"github.com/lci-labs/compartment/queues"
)

const fileURL = "url: redis://127.0.0.1:6379/3"

// withRedis returns validConfig with its redis section's url replaced by
// section (indented under redis:).
func withRedis(section string) string {
	return strings.Replace(validConfig, fileURL, section, 1)
}

const sentinelSection = `sentinel:
    master: mymaster
    addrs: ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"]
    username: app
    password_file: redis.pass
    sentinel_password_file: sentinel.pass
    db: 4
    tls: true`

// writeSecrets writes the password files next to the config at path.
func writeSecrets(t *testing.T, path string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(path), name), []byte(body), 0o600))
	}
}

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestSentinelConfig(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, withRedis(sentinelSection))
	writeSecrets(t, path, map[string]string{"redis.pass": "LEAKdata\n", "sentinel.pass": "  LEAKsent  \n"})
	cfg, err := app.Load(path, nil)
	require.NoError(t, err)
	o := cfg.Redis.Sentinel.FailoverOptions()
	require.Equal(t, "mymaster", o.MasterName)
	require.Equal(t, []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"}, o.SentinelAddrs)
	require.Equal(t, "app", o.Username)
	require.Equal(t, "LEAKdata", o.Password, "the password file's line, trimmed")
	require.Equal(t, "LEAKsent", o.SentinelPassword)
	require.Equal(t, 4, o.DB)
	require.NotNil(t, o.TLSConfig)
	require.Equal(t, `sentinel master "mymaster" via 10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379`, cfg.Redis.Addr())

	c, err := cfg.Redis.NewClient()
	require.NoError(t, err)
	defer c.Close()
	_, isFailover := c.(*redis.Client)
	require.True(t, isFailover, "a failover client is a *redis.Client that asks the sentinels")
	require.Equal(t, "FailoverClient", c.(*redis.Client).Options().Addr)
}

func TestSentinelFromEnvironment(t *testing.T) {
	t.Parallel()
	// The file names a single node; the environment switches to Sentinel,
	// keeping the file's wait_at_start, and gives both passwords.
	path := writeConfig(t, withRedis(fileURL+"\n  wait_at_start: 7s"))
	cfg, err := app.Load(path, envOf(map[string]string{
		"REDIS_SENTINEL_MASTER": "prod", "REDIS_SENTINEL_ADDRS": " 10.1.0.1:26379, 10.1.0.2:26379 ,",
		"REDIS_PASSWORD": "LEAKenvdata", "REDIS_SENTINEL_PASSWORD": "LEAKenvsent",
	}))
	require.NoError(t, err)
	require.Empty(t, cfg.Redis.URL)
	require.False(t, cfg.RedisURLFromEnv)
	require.Equal(t, []string{"REDIS_SENTINEL_MASTER", "REDIS_SENTINEL_ADDRS", "REDIS_PASSWORD", "REDIS_SENTINEL_PASSWORD"}, cfg.RedisFromEnv)
	require.Equal(t, "7s", cfg.Redis.WaitAtStart.String())
	o := cfg.Redis.Sentinel.FailoverOptions()
	require.Equal(t, "prod", o.MasterName)
	require.Equal(t, []string{"10.1.0.1:26379", "10.1.0.2:26379"}, o.SentinelAddrs)
	require.Equal(t, "LEAKenvdata", o.Password)
	require.Equal(t, "LEAKenvsent", o.SentinelPassword)

	// The environment overrides only what it names: the file's sentinel
	// section keeps its master, username and db, and REDIS_PASSWORD wins
	// over password_file (which is then not even read: it need not exist).
	path = writeConfig(t, withRedis(sentinelSection))
	writeSecrets(t, path, map[string]string{"sentinel.pass": "LEAKsent"})
	cfg, err = app.Load(path, envOf(map[string]string{"REDIS_SENTINEL_ADDRS": "10.2.0.1:26379", "REDIS_PASSWORD": "LEAKenv"}))
	require.NoError(t, err)
	o = cfg.Redis.Sentinel.FailoverOptions()
	require.Equal(t, "mymaster", o.MasterName)
	require.Equal(t, []string{"10.2.0.1:26379"}, o.SentinelAddrs)
	require.Equal(t, "LEAKenv", o.Password)
	require.Equal(t, "LEAKsent", o.SentinelPassword)
	require.Equal(t, 4, o.DB)

	// REDIS_URL replaces a Sentinel config, as it replaces an embedded one.
	cfg, err = app.Load(path, envOf(map[string]string{"REDIS_URL": "redis://cache:6380/2"}))
	require.NoError(t, err)
	require.Nil(t, cfg.Redis.Sentinel)
	require.Equal(t, "cache:6380", cfg.Redis.Addr())
}

// TestRedisTopologyMistakes: each bad combination is refused with a
// message naming the key (or the environment variables), and no message
// quotes a password, from a file or from the environment.
func TestRedisTopologyMistakes(t *testing.T) {
	t.Parallel()
	secrets := map[string]string{"redis.pass": "LEAKdata", "sentinel.pass": "LEAKsent"}
	cases := []struct {
		name    string
		section string
		env     map[string]string
		files   map[string]string
		want    []string
	}{
		{"url and sentinel", fileURL + "\n  " + sentinelSection, nil, secrets,
			[]string{"redis: set only one of url, sentinel, cluster and embedded (this config sets url and sentinel)"}},
		{"sentinel and embedded", sentinelSection + "\n  embedded: true", nil, secrets,
			[]string{"redis: set only one of url, sentinel, cluster and embedded (this config sets sentinel and embedded)"}},
		{"sentinel and cluster", sentinelSection + "\n  cluster: {addrs: [\"10.0.0.9:7000\"]}", nil, secrets,
			[]string{"(this config sets sentinel and cluster)"}},
		{"sentinel without master", strings.Replace(sentinelSection, "master: mymaster", "", 1), nil, secrets,
			[]string{"redis.sentinel.master: required: the name the sentinels know the master by"}},
		{"sentinel without addrs", strings.Replace(sentinelSection, `addrs: ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"]`, "", 1), nil, secrets,
			[]string{"redis.sentinel.addrs: at least one sentinel host:port is required"}},
		{"sentinel addr without a port", strings.Replace(sentinelSection, `"10.0.0.2:26379"`, `"10.0.0.2"`, 1), nil, secrets,
			[]string{`redis.sentinel.addrs[1]: "10.0.0.2" is not host:port`}},
		{"sentinel addr with a bad port", strings.Replace(sentinelSection, `"10.0.0.2:26379"`, `"10.0.0.2:0"`, 1), nil, secrets,
			[]string{`redis.sentinel.addrs[1]: "10.0.0.2:0": port must be a number from 1 to 65535`}},
		{"sentinel listed twice", strings.Replace(sentinelSection, `"10.0.0.2:26379"`, `"10.0.0.1:26379"`, 1), nil, secrets,
			[]string{`redis.sentinel.addrs[1]: "10.0.0.1:26379" is listed twice`}},
		{"negative db", strings.Replace(sentinelSection, "db: 4", "db: -1", 1), nil, secrets,
			[]string{"redis.sentinel.db: must be >= 0, got -1"}},
		{"missing password file", sentinelSection, nil, map[string]string{"sentinel.pass": "LEAKsent"},
			[]string{"redis.sentinel.password_file: ", "redis.pass does not exist"}},
		{"empty password file", sentinelSection, nil, map[string]string{"redis.pass": " \n", "sentinel.pass": "LEAKsent"},
			[]string{"redis.sentinel.password_file: ", "redis.pass is empty"}},
		{"two-line password file", sentinelSection, nil, map[string]string{"redis.pass": "LEAKa\nLEAKb\n", "sentinel.pass": "LEAKsent"},
			[]string{"redis.sentinel.password_file: ", "redis.pass must hold the password on one line"}},
		{"unknown sentinel key", sentinelSection + "\n    password: LEAKinline", nil, secrets,
			[]string{"unknown key redis.sentinel.password"}},
		{"cluster with a db", "cluster:\n    addrs: [\"10.0.0.1:7000\"]\n    db: 2", nil, nil,
			[]string{"redis.cluster.db: a Redis Cluster has only database 0, got 2"}},
		{"cluster without addrs", "cluster:\n    tls: true", nil, nil,
			[]string{"redis.cluster.addrs: at least one node host:port is required"}},
		{"cluster missing password file", "cluster:\n    addrs: [\"10.0.0.1:7000\"]\n    password_file: nope.pass", nil, nil,
			[]string{"redis.cluster.password_file: ", "nope.pass does not exist"}},
		{"two topologies in the environment", fileURL, map[string]string{"REDIS_URL": "redis://:LEAKurl@h:1/2", "REDIS_SENTINEL_ADDRS": "10.0.0.1:26379"}, nil,
			[]string{"environment: set only one of REDIS_URL, REDIS_SENTINEL_MASTER/REDIS_SENTINEL_ADDRS and REDIS_CLUSTER_ADDRS (set: REDIS_URL, REDIS_SENTINEL_MASTER/REDIS_SENTINEL_ADDRS)"}},
		{"sentinel master from the environment, no addrs", fileURL, map[string]string{"REDIS_SENTINEL_MASTER": "m"}, nil,
			[]string{"redis.sentinel.addrs: at least one sentinel host:port is required"}},
		{"REDIS_PASSWORD with a URL", fileURL, map[string]string{"REDIS_PASSWORD": "LEAKenv"}, nil,
			[]string{"environment: REDIS_PASSWORD is for redis.sentinel and redis.cluster"}},
		{"TLS CA file without TLS", fileURL + "\n  tls_ca_file: ca.pem", nil, map[string]string{"ca.pem": testCAPEM},
			[]string{"redis.tls_ca_file: set, but the connection does not use TLS: use a rediss:// URL, or tls: true under sentinel or cluster"}},
		{"TLS server name without TLS", strings.Replace(sentinelSection, "tls: true", "tls: false", 1) + "\n  tls_server_name: redis.internal", nil, secrets,
			[]string{"redis.tls_server_name: set, but the connection does not use TLS"}},
		{"TLS CA file missing", "url: rediss://127.0.0.1:6380/3\n  tls_ca_file: nope.pem", nil, nil,
			[]string{"redis.tls_ca_file: ", "nope.pem does not exist"}},
		{"TLS CA file not PEM", "url: rediss://127.0.0.1:6380/3\n  tls_ca_file: ca.pem", nil, map[string]string{"ca.pem": "LEAK not a certificate"},
			[]string{"redis.tls_ca_file: ", "ca.pem holds no PEM certificate"}},
		{"TLS CA file with the embedded Redis", "embedded: true\n  tls_ca_file: ca.pem", nil, map[string]string{"ca.pem": testCAPEM},
			[]string{"redis.tls_ca_file: the embedded Redis has no TLS"}},
		{"REDIS_SENTINEL_PASSWORD without sentinel", fileURL, map[string]string{"REDIS_SENTINEL_PASSWORD": "LEAKenv"}, nil,
			[]string{"environment: REDIS_SENTINEL_PASSWORD is set but redis is not configured for Sentinel"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, withRedis(tc.section))
			writeSecrets(t, path, tc.files)
			_, err := app.Load(path, envOf(tc.env))
			var ce *queues.ConfigError
			require.ErrorAs(t, err, &ce)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
			require.NotContains(t, err.Error(), "LEAK", "a password shows in the message")
		})
	}
}

// TestClusterConfig: a Redis Cluster config, from the file or the
// environment, loads into a cluster client with the seeds, the password
// and TLS; no message shows the password.
func TestClusterConfig(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, withRedis("cluster:\n    addrs: [\"10.0.0.1:7000\", \"10.0.0.2:7000\"]\n    username: app\n    password_file: c.pass\n    tls: true"))
	writeSecrets(t, path, map[string]string{"c.pass": "LEAKcluster"})
	for name, tc := range map[string]struct {
		env           map[string]string
		addrs         []string
		password, why string
	}{
		"file":        {nil, []string{"10.0.0.1:7000", "10.0.0.2:7000"}, "LEAKcluster", ""},
		"environment": {map[string]string{"REDIS_CLUSTER_ADDRS": "10.0.0.3:7000", "REDIS_PASSWORD": "LEAKenv"}, []string{"10.0.0.3:7000"}, "LEAKenv", "the environment replaces the seeds and the password, keeps the rest"},
	} {
		cfg, err := app.Load(path, envOf(tc.env))
		require.NoError(t, err, name)
		o := cfg.Redis.Cluster.ClusterOptions()
		require.Equal(t, tc.addrs, o.Addrs, name)
		require.Equal(t, "app", o.Username, tc.why)
		require.Equal(t, tc.password, o.Password, name)
		require.NotNil(t, o.TLSConfig, tc.why)
		require.Equal(t, "cluster "+strings.Join(tc.addrs, ","), cfg.Redis.Addr())
		c, err := cfg.Redis.NewClient()
		require.NoError(t, err)
		_, isCluster := c.(*redis.ClusterClient)
		require.True(t, isCluster, "%s: the engine takes the cluster layout for a *redis.ClusterClient", name)
		require.NoError(t, c.Close())
	}
}

// TestClusterOpens: the worker's OpenRedis reaches a real 3-master
// cluster on loopback through one seed address.
func TestClusterOpens(t *testing.T) {
	cl := testredis.StartCluster(t, 3)
	r, err := app.OpenRedis(context.Background(), app.RedisConfig{Cluster: &app.ClusterConfig{Addrs: cl.Addrs[:1]}}, false, nil)
	require.NoError(t, err)
	defer r.Close()
	_, isCluster := r.Client.(*redis.ClusterClient)
	require.True(t, isCluster)
	require.Equal(t, "cluster "+cl.Addrs[0], r.Addr)
}

// TestSentinelUnreachableNamesItWithoutSecrets: OpenRedis on sentinels
// that do not answer fails naming the master and the sentinels, without a
// password.
func TestSentinelUnreachableNamesItWithoutSecrets(t *testing.T) {
	t.Parallel()
	cfg := app.RedisConfig{Sentinel: &app.SentinelConfig{
		Master: "mymaster", Addrs: []string{"127.0.0.1:1"}, Password: "LEAKdata", SentinelPassword: "LEAKsent",
	}}
	_, err := app.OpenRedis(context.Background(), cfg, false, nil)
	require.ErrorContains(t, err, `redis at sentinel master "mymaster" via 127.0.0.1:1 is unreachable`)
	require.NotContains(t, err.Error(), "LEAK")
}
