// Package reliability holds the fault tests: they build the real binaries,
// run them as separate processes against a Redis the test starts on a port
// of its own, and kill, stop and restart them. It has no code of its own;
// see docs/RELIABILITY.md for what each test shows.
package reliability
