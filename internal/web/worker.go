package web

import (
	"context"
	"log/slog"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/metrics"
)

// ForWorker is the listener of a worker built with NewMetrics's Metrics as
// its Observer: metrics, probes, status and dashboard on the worker's own
// Redis. Start it before the worker's pools (/readyz says 503 until they
// run); Stop closes what it opened. It listens on cfg.HTTP.Listen, which
// must be set.
type ForWorker struct {
	*Server
	enq *app.Enqueuer
}

// StartForWorker builds and starts the listener of worker w, configured by
// w.Config.HTTP, with the timeline hist (nil: none; it should be w's
// Observer) and the scene (nil: none). A port in use is an error; nothing
// is left open then.
func StartForWorker(ctx context.Context, w *app.Worker, m *metrics.Metrics, hist *History, scene func() Scene, log *slog.Logger) (*ForWorker, error) {
	enq, err := w.NewEnqueuer()
	if err != nil {
		return nil, err
	}
	if err := m.Watch(w.Client); err != nil {
		enq.Close()
		return nil, err
	}
	srv, err := New(Options{
		Addr: w.Config.HTTP.Listen, Token: w.Config.HTTP.Token, Enqueuer: enq,
		Running: w.Client.Running, Metrics: m.Handler(), Logger: log, History: hist, Scene: scene,
	})
	if err == nil {
		err = srv.Start(ctx)
	}
	if err != nil {
		enq.Close()
		return nil, err
	}
	return &ForWorker{Server: srv, enq: enq}, nil
}

// Stop stops the listener and closes what StartForWorker opened.
func (f *ForWorker) Stop(ctx context.Context) error {
	err := f.Server.Stop(ctx)
	f.enq.Close()
	return err
}
