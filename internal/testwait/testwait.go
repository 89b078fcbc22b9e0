// Package testwait is the tests' one way to wait for a condition: poll it
// with a deadline, never sleep a fixed time and hope.
package testwait

import (
	"testing"
	"time"
)

// pollEvery is how often For checks its condition.
const pollEvery = 5 * time.Millisecond

// For polls cond until it holds and returns how long that took; if it does
// not hold within timeout, the test fails, naming what it waited for.
func For(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		<-tick.C
	}
	return time.Since(start)
}
