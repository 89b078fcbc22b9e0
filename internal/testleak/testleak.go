// Package testleak runs a package's tests and then fails them if any
// goroutine they started is still running: every object the tests open must
// be closed, every runner stopped.
package testleak

import (
	"testing"

	"go.uber.org/goleak"
)

// Options are the goroutines that are not the tests' to stop: go-redis
// keeps one process-wide goroutine per connection pool for its idle checks.
func Options() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	}
}

// VerifyMain runs m's tests and checks for leaked goroutines; call it from
// TestMain.
func VerifyMain(m *testing.M) { goleak.VerifyTestMain(m, Options()...) }
