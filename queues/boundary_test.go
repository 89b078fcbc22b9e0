package queues_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The engine's layout in Redis (its keys, its scripts and their
// arguments, asynq's keys and task encoding) is known to one package,
// queues/internal/rdb. These are the marks of code that knows it.
var layoutMarks = []*regexp.Regexp{
	regexp.MustCompile(`redis\.NewScript\(`),
	regexp.MustCompile(`\.Eval(Sha|RO|ShaRO)?\(`),
	regexp.MustCompile(`"asynq:`),
	regexp.MustCompile(`google\.golang\.org/protobuf`),
	regexp.MustCompile(`":(gate|door|breaker|failures|enqueue-lock|rate):`),
	regexp.MustCompile(`\brdb\.[A-Za-z]*Keys?\(`),
	regexp.MustCompile(`\.(GateKeys|BreakerKeys|BreakerLateKey|FailureCountKey|PoolSizeKey|Gate)\(`),
}

// layoutAllowed are the Go files outside rdb that may carry a mark, and why.
var layoutAllowed = map[string]string{
	// The application's own store of schedule runs: its keys and scripts
	// are the application's, not the engine's (its boundary to Redis).
	"internal/schedule/store.go": "the schedules' own store",
	// The tests' Redis: it deletes a test's namespace, and cannot import
	// the engine, whose own tests import it.
	"internal/testredis/testredis.go": "test support",
	// A worker process the reliability tests start, with observation keys
	// and a script of its own.
	"internal/reliability/clusterworker/main.go": "test instrumentation",
	// The test-support package for tests outside queues: it hands them the
	// names rdb builds.
	"queues/queuestest/queuestest.go": "test support, from rdb",
	// The tests' OTLP receiver decodes OpenTelemetry's protobuf messages,
	// not asynq's.
	"internal/telemetry/otlptest/otlptest.go": "test support, OTLP's protobuf",
}

// TestOnlyRdbKnowsTheRedisLayout: no program code outside
// queues/internal/rdb builds a key, holds a script or assembles its
// arguments, or encodes asynq's task message; and every Lua script lives
// in rdb/lua. Tests may look at Redis directly.
func TestOnlyRdbKnowsTheRedisLayout(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || rel == "out" || rel == "queues/internal/rdb" || rel == "bin" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, ".lua") {
			t.Errorf("%s: a Lua script outside queues/internal/rdb/lua", rel)
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") || layoutAllowed[rel] != "" {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for i, line := range strings.Split(string(src), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			for _, m := range layoutMarks {
				if m.MatchString(line) {
					t.Errorf("%s:%d: %q knows the Redis layout; it belongs in queues/internal/rdb", rel, i+1, strings.TrimSpace(line))
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, checked, 50, "the walk found the module's Go files")
}
