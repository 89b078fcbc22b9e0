package web

import (
	"context"
	"log/slog"
	"time"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/metrics"
)

// TokenPollInterval is how often a worker's listener reads its
// http.token_file again, so a token rotated on disk (a Kubernetes Secret
// is updated in place) takes effect without a reload. Reading a file of a
// few bytes this often costs nothing that matters.
const TokenPollInterval = 5 * time.Second

// ForWorker is the listener of a worker built with NewMetrics's Metrics as
// its Observer: metrics, probes, status and dashboard on the worker's own
// Redis. Start it before the worker's pools (/readyz says 503 until they
// run); Stop closes what it opened. It listens on cfg.HTTP.Listen, which
// must be set.
//
// Its token is the worker's token in effect (app.Worker.Current): the one
// the worker started with, the one a reload read, or the one the listener
// found in http.token_file on its own: it reads the file again every
// TokenPollInterval (app.Worker.ReloadToken). A file it cannot read, or
// that holds no valid token, is logged as an error once, and the token in
// effect stays.
type ForWorker struct {
	*Server
	enq *app.Enqueuer

	stopPoll context.CancelFunc
	polled   chan struct{} // closed when the poll has stopped
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
		Addr: w.Config.HTTP.Listen, Enqueuer: enq,
		CurrentToken: func() string { return w.Current().HTTP.Token },
		Running:      w.Client.Running, Metrics: m.Handler(), Logger: log, History: hist, Scene: scene,
	})
	if err == nil {
		err = srv.Start(ctx)
	}
	if err != nil {
		enq.Close()
		return nil, err
	}
	pollCtx, stopPoll := context.WithCancel(context.WithoutCancel(ctx))
	f := &ForWorker{Server: srv, enq: enq, stopPoll: stopPoll, polled: make(chan struct{})}
	go f.pollToken(pollCtx, w, srv.o.Logger)
	return f, nil
}

// pollToken reads the token file again every TokenPollInterval until ctx
// ends.
func (f *ForWorker) pollToken(ctx context.Context, w *app.Worker, log *slog.Logger) {
	defer close(f.polled)
	tick := time.NewTicker(TokenPollInterval)
	defer tick.Stop()
	var failing string // the error last logged, not logged again
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		changed, err := w.ReloadToken()
		switch {
		case err != nil:
			if err.Error() != failing {
				log.Error("http: cannot read the token file again; the token in effect stays", "error", err)
			}
			failing = err.Error()
			continue
		case changed:
			log.Info("http: the token file holds a new token: it is in effect, the old one is refused", "token_file", w.Current().HTTP.TokenFile)
		}
		if failing != "" {
			log.Info("http: the token file reads again", "token_file", w.Current().HTTP.TokenFile)
		}
		failing = ""
	}
}

// Stop stops the listener and closes what StartForWorker opened.
func (f *ForWorker) Stop(ctx context.Context) error {
	f.stopPoll()
	<-f.polled
	err := f.Server.Stop(ctx)
	f.enq.Close()
	return err
}
