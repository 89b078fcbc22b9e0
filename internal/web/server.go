// Package web is the worker's HTTP listener: Prometheus metrics, the
// health probes a Kubernetes deployment expects, the status API (the JSON
// `enqueue status -json` prints) and a dashboard, server-rendered with
// html/template and a little JavaScript, embedded in the binary.
//
//	GET  /           the dashboard; it refreshes itself from /live
//	GET  /live       the dashboard's changing part, as an HTML fragment
//	GET  /api/status the status JSON
//	GET  /api/history the timeline's samples (Options.History), JSON
//	GET  /api/runs   the MaxRuns most recent runs, JSON (APIRuns)
//	GET  /metrics    Prometheus text format
//	GET  /healthz    200 while the process runs
//	GET  /readyz     200 when Redis answers and every pool runs, else 503
//	POST /actions/pause, /actions/resume   form field pool
//	POST /actions/retry                    form fields queue and id
//	POST /actions/breaker                  form fields pool and op (open,
//	                                       close or reset), as enqueue breaker
//	POST /actions/cancel-run               form field id (a run's ID); answers
//	                                       JSON (RunCancelAnswer)
//
// Actions need the token of the worker config's http.token_file (a
// worker's listener follows reloads, and reads the file again every
// TokenPollInterval), in the X-Compartment-Token header or the token form field; without a
// configured token they are refused (403) and the page is read-only. Their
// form is URL-encoded or multipart, at most MaxActionBody bytes, and must
// arrive within ActionBodyTimeout; a token in the header is checked before
// the body is read.
package web

import (
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/queues"
)

// Defaults of Options.
const (
	DefaultRefresh = 2 * time.Second
	// readyTimeout bounds /readyz's Redis ping.
	readyTimeout = time.Second
	// shutdownGrace bounds how long Stop waits for requests in flight.
	shutdownGrace = 2 * time.Second
)

// Limits of the listener. Each connection costs a goroutine and a file
// descriptor, so a client that sends slowly, or stops sending, is cut
// after a bounded time instead of holding them for ever; slow clients do
// not hold up the others (each connection is served on its own).
const (
	// readHeaderTimeout bounds reading a request's line and headers.
	readHeaderTimeout = 5 * time.Second
	// readTimeout bounds reading a whole request, body included, on every
	// path; an action cuts its body sooner (actionBodyTimeout).
	readTimeout = 10 * time.Second
	// writeTimeout bounds a request from the end of its headers to the end
	// of its answer: the dashboard's and /api/status's Redis reads
	// included.
	writeTimeout = 30 * time.Second
	// idleTimeout closes a kept-alive connection that sends no new request
	// for this long.
	idleTimeout = 60 * time.Second
	// maxHeaderBytes bounds a request's headers (cookies of other sites on
	// the same host included).
	maxHeaderBytes = 64 << 10
	// MaxActionBody bounds an action's form, URL-encoded or multipart: a
	// longer one is refused with 413 before it is read, or as soon as the
	// bound is passed.
	MaxActionBody = 4 << 10
	// ActionBodyTimeout is how long an action's form may take to arrive,
	// from when the handler starts reading it: a slower one is answered
	// 408 and its connection closed.
	ActionBodyTimeout = 5 * time.Second
)

// TokenHeader carries the action token.
const TokenHeader = "X-Compartment-Token"

// Options configure a Server.
type Options struct {
	// Addr is the host:port to listen on. Required.
	Addr string
	// Token allows the actions; "" makes the dashboard read-only.
	Token string
	// CurrentToken, when set, is asked for the token at each request
	// instead of Token, so a token changed while the server runs (a
	// reload, a rotated token file) holds from the next request on.
	CurrentToken func() string
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
	if o.CurrentToken == nil {
		token := o.Token
		o.CurrentToken = func() string { return token }
	}
	if o.Running == nil {
		o.Running = func() bool { return true }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Refresh = cmp.Or(o.Refresh, DefaultRefresh)
	s := &Server{o: o, done: make(chan struct{}), eta: newETATracker()}
	s.srv = &http.Server{
		Handler:           s.routes(),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
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

// URL is the dashboard's address, once Start has bound it: the bound
// address, or 127.0.0.1 when it is every interface.
func (s *Server) URL() string {
	if s.ln == nil {
		return ""
	}
	return s.Listening().URL
}

// Listening says where a started server listens.
type Listening struct {
	// Addr is the address bound, as host:port: 127.0.0.1:8080, or
	// 0.0.0.0:8080 or [::]:8080 for every interface (":8080" binds
	// [::]:8080, IPv4 included).
	Addr string
	// URL opens the dashboard from this machine: http:// and Addr, with
	// 127.0.0.1 in place of an every-interface host.
	URL string
	// Loopback is true when only this machine can connect (127.0.0.0/8,
	// ::1).
	Loopback bool
}

// Listening says where the server listens, once Start has bound it.
func (s *Server) Listening() Listening {
	if s.ln == nil {
		return Listening{}
	}
	return listeningOn(s.ln.Addr().(*net.TCPAddr))
}

func listeningOn(addr *net.TCPAddr) Listening {
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return Listening{
		Addr:     addr.String(),
		URL:      "http://" + net.JoinHostPort(host, fmt.Sprint(addr.Port)) + "/",
		Loopback: addr.IP.IsLoopback(),
	}
}

// Announce logs where l is served: one INFO line with the bound address
// (listen=), a URL to open from this machine (url=) and whether actions
// are allowed (a token is configured). When the address is not loopback,
// anyone who can reach it reads the dashboard, the status and the
// metrics, with or without a token: one more line says so, a WARN when the
// actions need a token (which then crosses the network in clear text), an
// ERROR when there is no token.
func Announce(log *slog.Logger, l Listening, actions bool) {
	log.Info("http: serving metrics, probes and the dashboard", "listen", l.Addr, "url", l.URL, "actions", actions)
	if l.Loopback {
		return
	}
	const exposed = "anyone who can reach it can read the dashboard, /api/status and /metrics (pool and queue names, job IDs, failure messages); "
	const bind = "bind 127.0.0.1 unless that is what you want"
	if actions {
		log.Warn("http: listening beyond this machine: "+exposed+
			"the actions need the token, which travels in clear text (no TLS): "+bind, "listen", l.Addr)
		return
	}
	log.Error("http: listening beyond this machine, with no http.token_file: "+exposed+
		"the actions are refused (read-only): "+bind, "listen", l.Addr)
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
	mux.HandleFunc("GET /api/runs", s.apiRuns)
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

// action carries out a POST from the dashboard. Nothing is read from the
// body before the token can be checked: a read-only worker refuses at
// once; a token in the X-Compartment-Token header is checked before the
// body is read; without it, the form (bounded by MaxActionBody and
// ActionBodyTimeout) is read for its token field and checked before
// anything else is done. A refused request changes nothing, and its
// connection is closed, whatever was left of its body unread.
func (s *Server) action(w http.ResponseWriter, r *http.Request) {
	want := s.o.CurrentToken()
	if want == "" {
		refuse(w, http.StatusForbidden, "refused: this worker is read-only (no http.token_file in its config)")
		return
	}
	token := r.Header.Get(TokenHeader)
	if token != "" && !sameToken(token, want) {
		s.wrongToken(w, r)
		return
	}
	if !readForm(w, r) {
		return
	}
	if token == "" && !sameToken(r.PostForm.Get("token"), want) {
		s.wrongToken(w, r)
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
	case "breaker":
		s.breaker(w, r)
	case "cancel-run":
		s.cancelRun(w, r)
	default:
		text(w, http.StatusNotFound, fmt.Sprintf("unknown action %q (pause, resume, retry, breaker, cancel-run)", action))
	}
}

// breakerOps are the breaker action's ops, as `enqueue breaker` takes
// them, and what each does, for the answer.
var breakerOps = map[queues.BreakerAction]string{
	queues.BreakerForceOpen:  "forced open",
	queues.BreakerForceClose: "forced closed",
	queues.BreakerReset:      "reset",
}

// breaker forces a pool's circuit breaker in every worker process, as
// `enqueue breaker -pool POOL open|close|reset` does. The op is checked
// first (400), then the pool (404 unknown, 409 without a breaker: the
// request is right, the pool's config does not allow it).
func (s *Server) breaker(w http.ResponseWriter, r *http.Request) {
	e := s.o.Enqueuer
	pool, op := r.PostForm.Get("pool"), r.PostForm.Get("op")
	did, ok := breakerOps[queues.BreakerAction(op)]
	if !ok {
		text(w, http.StatusBadRequest, fmt.Sprintf("op must be %s, %s or %s, got %q", queues.BreakerForceOpen, queues.BreakerForceClose, queues.BreakerReset, op))
		return
	}
	if _, err := e.Client.Pool(pool); err != nil {
		text(w, http.StatusNotFound, err.Error())
		return
	}
	st, err := e.Client.ForceBreaker(r.Context(), pool, queues.BreakerAction(op))
	switch {
	case errors.Is(err, queues.ErrNoBreaker):
		var with []string
		for _, p := range e.Client.Pools() {
			if p.Config().Breaker != nil {
				with = append(with, p.Name())
			}
		}
		text(w, http.StatusConflict, fmt.Sprintf("pool %q has no circuit breaker (breaker: in its config; pools with one: %q)", pool, with))
		return
	case err != nil:
		text(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	now := string(st.State)
	if st.Forced != "" {
		now += " (forced " + string(st.Forced) + " until reset)"
	}
	s.o.Logger.Info("http: circuit breaker "+did+" from the dashboard", "pool", pool, "op", op, "state", string(st.State), "remote", r.RemoteAddr)
	text(w, http.StatusOK, fmt.Sprintf("breaker of pool %q %s: now %s", pool, did, now))
}

// sameToken compares a token given with the one in effect, in constant
// time.
func sameToken(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (s *Server) wrongToken(w http.ResponseWriter, r *http.Request) {
	s.o.Logger.Warn("http: action refused: missing or wrong token", "action", r.PathValue("action"), "remote", r.RemoteAddr)
	refuse(w, http.StatusUnauthorized, "refused: missing or wrong token")
}

// readForm reads an action's form fields into r.PostForm: a body of
// application/x-www-form-urlencoded or multipart/form-data (as curl -F
// sends it), or none. The body must be at most MaxActionBody bytes and
// arrive within ActionBodyTimeout. Otherwise readForm answers (413, 408,
// 415 or 400, saying why), and returns false.
func readForm(w http.ResponseWriter, r *http.Request) bool {
	if r.ContentLength > MaxActionBody {
		refuse(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("refused: an action's form is at most %d bytes, this one says %d", MaxActionBody, r.ContentLength))
		return false
	}
	var kind string
	if ct := r.Header.Get("Content-Type"); ct != "" {
		var err error
		if kind, _, err = mime.ParseMediaType(ct); err != nil {
			refuse(w, http.StatusBadRequest, fmt.Sprintf("bad Content-Type %q: %v", ct, err))
			return false
		}
	}
	switch kind {
	case "", formURLEncoded, formMultipart:
	default:
		refuse(w, http.StatusUnsupportedMediaType, fmt.Sprintf("refused: Content-Type %s: send the form as %s or %s", kind, formURLEncoded, formMultipart))
		return false
	}
	// A connection that does not support deadlines still has the
	// server's readTimeout.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(ActionBodyTimeout))
	r.Body = http.MaxBytesReader(w, r.Body, MaxActionBody)
	var err error
	if kind == formMultipart {
		// Every part fits in memory (the body is bounded below the
		// memory limit): nothing is written to disk.
		err = r.ParseMultipartForm(MaxActionBody)
		if r.MultipartForm != nil {
			_ = r.MultipartForm.RemoveAll()
		}
	} else {
		err = r.ParseForm()
	}
	var tooLarge *http.MaxBytesError
	switch {
	case err == nil:
		return true
	case errors.As(err, &tooLarge):
		refuse(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("refused: an action's form is at most %d bytes", MaxActionBody))
	case errors.Is(err, os.ErrDeadlineExceeded):
		refuse(w, http.StatusRequestTimeout, fmt.Sprintf("refused: the form did not arrive within %s", ActionBodyTimeout))
	default:
		refuse(w, http.StatusBadRequest, "bad form: "+err.Error())
	}
	return false
}

// The form encodings an action accepts.
const (
	formURLEncoded = "application/x-www-form-urlencoded"
	formMultipart  = "multipart/form-data"
)

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

// refuse answers like text, and closes the connection after the answer:
// whatever is left of the request's body is not read (net/http would
// otherwise read up to 256 KiB of it, at the client's pace, before
// closing).
func refuse(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Connection", "close")
	text(w, code, msg)
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

func text(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, strings.TrimSpace(msg))
}
