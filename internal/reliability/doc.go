// Package reliability holds the fault tests: they build the real binaries,
// run them as separate processes against a Redis the test starts on a port
// of its own, and kill, stop and restart them. It has no code of its own;
// see docs/RELIABILITY.md for what each test shows.
//
// The tests run side by side (all but the utilization one), so the package
// takes about as long as its longest tests, about 70 s each, that wait for
// asynq's once-a-minute recoverer: 1.5 minutes with -race on two cores.
// Under -short every test here skips, and nothing is built.
package reliability
