package main

import (
	"os"
	"testing"

	"github.com/lci-labs/compartment/internal/testleak"
)

// runAsWorker, set in a child's environment, makes the test binary run the
// real main instead of the tests, for tests of signals and exit codes.
const runAsWorker = "COMPARTMENT_TEST_RUN_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(runAsWorker) == "1" {
		main()
		return
	}
	testleak.VerifyMain(m)
}
