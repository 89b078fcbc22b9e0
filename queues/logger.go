package queues

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/hibiken/asynq"
)

// AsynqLogger returns an asynq.Logger that logs through l, for programs
// that run an asynq server of their own beside the engine's.
func AsynqLogger(l *slog.Logger) asynq.Logger { return asynqLogger{l} }

// asynqLogger lets asynq log through slog, with the pool's attributes.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...)) }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...)) }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...)) }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...)) }

// Fatal honours asynq.Logger's contract: log, then exit with status 1.
// asynq v0.26 does not call it from a running server.
func (a asynqLogger) Fatal(args ...any) {
	a.l.Error(fmt.Sprint(args...), "fatal", true)
	os.Exit(1)
}
