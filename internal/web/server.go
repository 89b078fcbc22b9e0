// Package web is the worker's HTTP listener: Prometheus metrics, the
// health probes a Kubernetes deployment expects, the status API (the JSON
// `enqueue status -json` prints) and a dashboard, server-rendered with
// html/template and a little JavaScript, embedded in the binary.
//
//	GET  /           the dashboard; it refreshes itself from /live
//	GET  /live       the dashboard's changing part, as an HTML fragment
//	GET  /api/status the status JSON
//	GET  /api/history the timeline's samples (Options.History), JSON
//	GET  /metrics    Prometheus text format
//	GET  /healthz    200 while the process runs
//	GET  /readyz     200 when Redis answers and every pool runs, else 503
//	POST /actions/pause, /actions/resume   form field pool
//	POST /actions/retry                    form fields queue and id
//
// Actions need the token of the worker config's http.token_file, in the
// X-Compartment-Token header or the token form field; without a
// configured token they are refused (403) and the page is read-only.
package web

import (
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/internal/app"
)

// Defaults of Options.
const (
	DefaultRefresh = 2 * time.Second
	// readyTimeout bounds /readyz's Redis ping.
	readyTimeout = time.Second
	// shutdownGrace bounds how long Stop waits for requests in flight.
	shutdownGrace = 2 * time.Second
)

// TokenHeader carries the action token.
const TokenHeader = "X-Compartment-Token"

// Options configure a Server.
type Options struct {
	// Addr is the host:port to listen on. Required.
	Addr string
	// Token allows the actions; "" makes the dashboard read-only.
	Token string
	// Enqueuer reads the status and carries out the actions. Required.
	Enqueuer *app.Enqueuer
	// Running reports whether the worker's pools all run, for /readyz.
	// Defaults to always true (a process that runs no pools).
	Running func() bool
	// Metrics serves /metrics. Defaults to none (/metrics is 404).
	Metrics http.Handler
	// Logger receives errors. Defaults to slog.Default().
	Logger *slog.Logger
	// Refresh is how often the dashboard refreshes. Defaults to 2s.
	Refresh time.Duration
	// History, when set, is sampled from Start to Stop and drawn as the
	// dashboard's timeline (/api/history). Give it to the client as its
	// Observer too, so it hears the jobs' waits.
	History *History
	// Scene, when set, is shown above the pools and its gauges drawn on
	// the timeline (the demo's phases).
	Scene func() Scene
}

// Server is the listener. Start binds and serves; Stop shuts it down.
type Server struct {
	o   Options
	srv *http.Server
	ln  net.Listener

	done chan struct{}
	eta  *etaTracker

	// stopSampling ends the timeline's sampler; sampled is closed when it
	// has.
	stopSampling context.CancelFunc
	sampled      chan struct{}

	mu      sync.Mutex
	stopped bool
}

// New checks o and returns a server that is not listening yet.
func New(o Options) (*Server, error) {
	if err := app.CheckListen(o.Addr); err != nil {
		return nil, fmt.Errorf("http: %w", err)
	}
	if o.Enqueuer == nil {
		return nil, errors.New("web: Options.Enqueuer is required")
	}
	if o.Running == nil {
		o.Running = func() bool { return true }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Refresh = cmp.Or(o.Refresh, DefaultRefresh)
	s := &Server{o: o, done: make(chan struct{}), eta: newETATracker()}
	s.srv = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 5 * time.Second}
	return s, nil
}

// Start binds the address (an address in use is an error) and serves in
// the background until Stop.
func (s *Server) Start(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.o.Addr)
	if err != nil {
		close(s.done)
		return fmt.Errorf("http: listen on %s: %w", s.o.Addr, err)
	}
	s.ln = ln
	if s.o.History != nil {
		sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		s.stopSampling, s.sampled = cancel, make(chan struct{})
		go func() {
			defer close(s.sampled)
			s.sampleLoop(sctx)
		}()
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.o.Logger.Error("http: server failed", "error", err)
		}
	}()
	return nil
}

// URL is the dashboard's address, once Start has bound it.
func (s *Server) URL() string {
	if s.ln == nil {
		return ""
	}
	addr := s.ln.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, fmt.Sprint(addr.Port)) + "/"
}

// Stop shuts the server down, letting requests in flight finish for a
// moment, bounded by ctx. Calling it twice, or before Start, is safe.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped || s.ln == nil {
		s.stopped = true
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	s.mu.Unlock()
	if s.stopSampling != nil {
		s.stopSampling()
		<-s.sampled
	}
	ctx, cancel := context.WithTimeout(ctx, shutdownGrace)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	<-s.done
	return err
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		text(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", s.ready)
	if s.o.Metrics != nil {
		mux.Handle("GET /metrics", s.o.Metrics)
	}
	mux.HandleFunc("GET /api/status", s.apiStatus)
	mux.HandleFunc("GET /api/history", s.apiHistory)
	mux.HandleFunc("GET /{$}", s.page)
	mux.HandleFunc("GET /live", s.live)
	mux.HandleFunc("GET /static/", s.static)
	mux.HandleFunc("POST /actions/{action}", s.action)
	return securityHeaders(mux)
}

// securityHeaders keeps the page out of other sites' frames and scripts.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; script-src 'self'; frame-ancestors 'none'")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := s.o.Enqueuer.Redis.Client.Ping(ctx).Err(); err != nil {
		text(w, http.StatusServiceUnavailable, "not ready: redis at "+s.o.Enqueuer.Redis.Addr+" does not answer")
		return
	}
	if !s.o.Running() {
		text(w, http.StatusServiceUnavailable, "not ready: the pools are not running (starting or stopping)")
		return
	}
	text(w, http.StatusOK, "ready")
}

func (s *Server) apiStatus(w http.ResponseWriter, r *http.Request) {
	st, err := s.o.Enqueuer.Status(r.Context())
	if err != nil {
		s.o.Logger.Error("http: status", "error", err)
		text(w, http.StatusServiceUnavailable, "status: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ") // as enqueue status -json prints it
	_ = enc.Encode(st)
}

// action carries out a POST from the dashboard. It checks the token
// before it reads anything else, so a refused request changes nothing.
func (s *Server) action(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	if err := r.ParseForm(); err != nil {
		text(w, http.StatusBadRequest, "bad form: "+err.Error())
		return
	}
	if s.o.Token == "" {
		text(w, http.StatusForbidden, "refused: this worker is read-only (no http.token_file in its config)")
		return
	}
	token := r.Header.Get(TokenHeader)
	if token == "" {
		token = r.PostForm.Get("token")
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(s.o.Token)) != 1 {
		s.o.Logger.Warn("http: action refused: missing or wrong token", "action", r.PathValue("action"), "remote", r.RemoteAddr)
		text(w, http.StatusUnauthorized, "refused: missing or wrong token")
		return
	}
	e := s.o.Enqueuer
	ctx := r.Context()
	switch action := r.PathValue("action"); action {
	case "pause", "resume":
		pool := r.PostForm.Get("pool")
		if _, err := e.Client.Pool(pool); err != nil {
			text(w, http.StatusNotFound, err.Error())
			return
		}
		var err error
		if action == "pause" {
			err = e.Client.PausePool(ctx, pool)
		} else {
			err = e.Client.ResumePool(ctx, pool)
		}
		if err != nil {
			text(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		s.o.Logger.Info("http: pool "+action+"d from the dashboard", "pool", pool, "remote", r.RemoteAddr)
		text(w, http.StatusOK, fmt.Sprintf("pool %q %sd", pool, action))
	case "retry":
		queue, id := r.PostForm.Get("queue"), r.PostForm.Get("id")
		if !s.ownQueue(queue) {
			text(w, http.StatusNotFound, fmt.Sprintf("unknown queue %q", queue))
			return
		}
		info, err := e.Insp.GetTaskInfo(queue, id)
		switch {
		case errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound):
			text(w, http.StatusNotFound, fmt.Sprintf("no job %q in queue %q", id, queue))
			return
		case err != nil:
			text(w, http.StatusServiceUnavailable, err.Error())
			return
		case info.State != asynq.TaskStateArchived:
			text(w, http.StatusConflict, fmt.Sprintf("job %q is %s, not archived: nothing to retry", id, info.State))
			return
		}
		if err := e.Insp.RunTask(queue, id); err != nil {
			text(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		s.o.Logger.Info("http: archived job retried from the dashboard", "queue", queue, "job_id", id, "remote", r.RemoteAddr)
		text(w, http.StatusOK, fmt.Sprintf("job %q is pending again in %s", id, queue))
	default:
		text(w, http.StatusNotFound, fmt.Sprintf("unknown action %q (pause, resume, retry)", action))
	}
}

func (s *Server) ownQueue(queue string) bool {
	for _, p := range s.o.Enqueuer.Client.Pools() {
		for _, q := range p.Queues() {
			if q == queue {
				return true
			}
		}
	}
	return false
}

func text(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, strings.TrimSpace(msg))
}
