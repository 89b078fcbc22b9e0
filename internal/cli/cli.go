// Package cli holds what the commands share: exit codes, logger setup and
// how a config error is reported.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/internal/quote"
	"github.com/lci-labs/compartment/queues"
)

// Exit codes of every command.
const (
	ExitOK      = 0
	ExitFailure = 1 // a runtime failure: Redis unreachable, a job failed
	ExitUsage   = 2 // a bad flag, a bad config, invalid input
	ExitRefused = 3 // the door refused: a full backlog, a rate limit
)

// NewLogger returns a slog logger writing text or JSON at level.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationsAsText}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("-log-format %q: use text or json", format)
	}
}

// durationsAsText writes durations as people read them ("1.5s"), not as
// nanoseconds, in JSON logs too.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// ExitCode maps an error to the exit code: config and usage errors are 2,
// a refusal at a pool's door 3, anything else 1.
func ExitCode(err error) int {
	var ce *queues.ConfigError
	switch {
	case errors.As(err, &ce) || errors.Is(err, ErrUsage):
		return ExitUsage
	case errors.Is(err, queues.ErrRefused):
		return ExitRefused
	}
	return ExitFailure
}

// ErrUsage marks an error as a usage error (exit code 2).
var ErrUsage = errors.New("usage")

// Usagef returns a usage error with the message formatted.
func Usagef(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, args...))
}

// Quote quotes a value that came from input for a message, cut to a sane
// length (see package quote).
func Quote(s string) string { return quote.Value(s) }

// Message is the one-line (or, for config errors, one-block) text printed
// for err, without the "usage: " marker and without asynq's retry marks
// (see Readable).
func Message(prog string, err error) string {
	return prog + ": " + Readable(strings.TrimPrefix(err.Error(), ErrUsage.Error()+": "))
}

// skipRetryMark is what an error that matches asynq.SkipRetry carries in
// its text (queues.Permanent, a malformed payload): " (skip retry for the
// task)". It tells asynq not to retry a job; a person reads nothing in it.
var skipRetryMark = " (" + asynq.SkipRetry.Error() + ")"

// Readable returns an error's text, or a job's stored failure, for people:
// without asynq's " (skip retry for the task)" marks, wherever they are.
func Readable(s string) string { return strings.ReplaceAll(s, skipRetryMark, "") }

// ParseFlags parses args with fs, turning a flag error into a usage error.
// It returns flag.ErrHelp for -h.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return Usagef("%v (run with -h for help)", err)
	}
	return nil
}

// ConfigFlag defines -config on fs with def as its default. Its help names
// the default and what it points at, in place of flag's own "(default
// ...)": "config file (default configs/worker.yaml: a real Redis at
// 127.0.0.1:6379 DB 1, embedded SQLite out/compartment.db)".
func ConfigFlag(fs *flag.FlagSet, def, summary string) *string {
	p := fs.String("config", def, fmt.Sprintf("config `file` (default %s: %s)", def, summary))
	// An empty DefValue keeps PrintDefaults from adding the default again.
	fs.Lookup("config").DefValue = ""
	return p
}

// Usage writes fs's help text to w.
func Usage(w io.Writer, fs *flag.FlagSet, header string) {
	fmt.Fprintln(w, header)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// IsTerminal reports whether w is a terminal, for live views that redraw in
// place.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Parse parses a command's flags. It returns ok=false with the exit code
// when the command should stop: 0 after printing the help (to stdout) for
// -h, 2 after printing the problem (to stderr) for a bad flag or a stray
// argument.
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, help string) (code int, ok bool) {
	err := ParseFlags(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		Usage(stdout, fs, help)
		return ExitOK, false
	case err != nil:
		fmt.Fprintln(stderr, Message(fs.Name(), err))
		return ExitUsage, false
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "%s: unexpected argument %q (run with -h for help)\n", fs.Name(), fs.Arg(0))
		return ExitUsage, false
	}
	return ExitOK, true
}

// Env is what a command gets from the process it runs in. Tests build
// their own.
type Env struct {
	Args           []string
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// Ready, when set, is called once the command is serving (the worker:
	// every pool started), so a test can wait for it instead of reading
	// logs.
	Ready func()
	// Reload, when set, delivers a value each time the command should read
	// its configuration again (the worker's main sends SIGHUP here).
	Reload <-chan os.Signal
}

// Serving tells whoever started the command that it is serving: it calls
// Ready if it is set.
func (e Env) Serving() {
	if e.Ready != nil {
		e.Ready()
	}
}

// Interrupt is what a command says when SIGINT or SIGTERM arrives (see
// MainWith). Each text is a format with one %s, the signal's name
// ("interrupt", "terminated"), and is printed to stderr after the
// command's name and a colon.
type Interrupt struct {
	// First, when set, is printed on the first signal, which cancels the
	// command's context. Empty: nothing (the worker logs its own stop).
	First string
	// Second is printed on a second signal, before the command exits at
	// once with ExitFailure.
	Second string
}

// RunnerInterrupt is the Interrupt of a command that runs jobs (the
// worker, the demo, the benchmarks): the first signal starts its graceful
// stop, which it logs itself; a second one leaves the jobs still running
// to asynq's lease.
var RunnerInterrupt = Interrupt{
	Second: "second signal (%s): exiting at once; jobs still running go back to their queue when their lease lapses",
}

// Main is MainWith(RunnerInterrupt, run).
func Main(run func(ctx context.Context, env Env) int) { MainWith(RunnerInterrupt, run) }

// MainWith is every command's one signal path: it runs run with a context
// that the first SIGINT or SIGTERM cancels (its cause an *InterruptError
// with the signal, see InterruptedCode), and exits with the code run
// returns. A second signal exits at once with ExitFailure. it says what
// to print on each signal.
func MainWith(it Interrupt, run func(ctx context.Context, env Env) int) {
	// go-redis logs dial failures to stderr on its own; the commands report
	// Redis errors themselves, once and with the address.
	redis.SetLogger(quietRedis{})
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	env := Env{Args: os.Args[1:], Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	os.Exit(RunWithSignals(filepath.Base(os.Args[0]), it, sigs, os.Exit, run, env))
}

// RunWithSignals is MainWith's work with its surroundings given, for
// tests: prog names the command in messages, sigs delivers the signals,
// exit is called with ExitFailure on a second signal (MainWith's does not
// return; a test's may, and run then goes on to its end). It returns the
// code run returns.
func RunWithSignals(prog string, it Interrupt, sigs <-chan os.Signal, exit func(int), run func(ctx context.Context, env Env) int, env Env) int {
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		var s os.Signal
		select {
		case s = <-sigs:
		case <-done:
			return
		}
		if it.First != "" {
			fmt.Fprintf(env.Stderr, "%s: "+it.First+"\n", prog, s)
		}
		cancel(&InterruptError{Signal: s})
		select {
		case s = <-sigs:
		case <-done:
			return
		}
		fmt.Fprintf(env.Stderr, "%s: "+it.Second+"\n", prog, s)
		exit(ExitFailure)
	}()
	code := run(ctx, env)
	cancel(nil)
	close(done)
	<-finished
	return code
}

// InterruptError is the cause (context.Cause) of a command's context that
// a signal cancelled.
type InterruptError struct{ Signal os.Signal }

func (e *InterruptError) Error() string { return "interrupted (" + e.Signal.String() + ")" }

// InterruptedCode says whether a signal cancelled ctx (a command's context
// from MainWith) and, if so, the exit code of a command it interrupted:
// 128 plus the signal's number (130 for SIGINT, 143 for SIGTERM), what a
// shell reports for a process the signal ended.
func InterruptedCode(ctx context.Context) (int, bool) {
	var ie *InterruptError
	if !errors.As(context.Cause(ctx), &ie) {
		return 0, false
	}
	if n, ok := ie.Signal.(syscall.Signal); ok {
		return 128 + int(n), true
	}
	return ExitFailure, true
}

// quietRedis drops go-redis's internal log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
