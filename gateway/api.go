package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fanfare-im/fanfare/gateway/auth"
)

// Defaults of APIConfig.
const (
	DefaultAPIAddr           = "127.0.0.1:8080"
	DefaultMaxBodyBytes      = 1 << 20
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultReadyTimeout      = 2 * time.Second
	DefaultReadyEvery        = time.Second
	DefaultDrainTimeout      = 10 * time.Second
	DefaultHandlerTimeout    = 10 * time.Second
)

// Verifier checks a user's bearer token; *auth.Verifier implements it.
type Verifier interface {
	Verify(token string) (auth.Claims, error)
}

// APIConfig configures the HTTP API. The zero value works: it listens on
// DefaultAPIAddr with user and admin endpoints refusing every request
// (no Verifier, no AdminToken) and /healthz, /readyz, /metrics open.
type APIConfig struct {
	// Addr is the listen address of Run. Default 127.0.0.1:8080.
	Addr string
	// AdminToken authenticates admin endpoints (Authorization: Bearer).
	// Empty: admin endpoints answer 401 to everyone.
	AdminToken string
	// Verifier checks user tokens. nil: user endpoints answer 401.
	Verifier Verifier
	// Logger receives request errors and lifecycle events; nil discards.
	Logger *slog.Logger
	// Ready reports readiness for /readyz: nil when the store and Redis
	// are reachable or their fallback is in use. nil means always ready
	// (until Shutdown starts).
	Ready func(ctx context.Context) error
	// Registry is what /metrics exposes. nil: prometheus.DefaultGatherer.
	Registry prometheus.Gatherer
	// MetricsToken, when set, is the bearer token /metrics requires (401
	// without it; Prometheus sends it with authorization: credentials).
	// Empty: /metrics is open, like /healthz and /readyz.
	MetricsToken string
	// Registerer receives the API's own metrics (requests by route and
	// status, latency). nil: they are not registered.
	Registerer prometheus.Registerer
	// MaxBodyBytes caps request bodies (413 beyond). Default 1 MiB.
	MaxBodyBytes int64
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout are
	// the http.Server timeouts. Defaults 5 s, 30 s, 30 s, 120 s.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	// ReadyTimeout bounds one Ready call. Default 2 s.
	ReadyTimeout time.Duration
	// ReadyEvery is how long /readyz reuses a Ready result: /readyz is
	// open to anyone, and each Ready call reaches the store (a Postgres
	// round trip), so probes cost at most one call per ReadyEvery, and
	// concurrent probes wait for the one in flight. 0 = 1 s; negative =
	// a call per probe.
	ReadyEvery time.Duration
	// DrainTimeout bounds the graceful shutdown Run performs when its
	// context ends. Default 10 s.
	DrainTimeout time.Duration
	// HandlerTimeout bounds one user or admin request: its context ends
	// then, so that a store or engine call waiting on a dead link fails
	// and the request is answered 503 unavailable instead of waiting as
	// long as the link does (a Postgres that stopped answering holds a
	// query forever). Default 10 s; keep it below WriteTimeout, past which
	// no answer can be written.
	HandlerTimeout time.Duration
}

// Validate reports every problem of c.
func (c APIConfig) Validate() error {
	var errs []error
	if c.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			errs = append(errs, fmt.Errorf("gateway: Addr %q: %w", c.Addr, err))
		}
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		errs = append(errs, fmt.Errorf("gateway: AdminToken is %d bytes, want at least 16", len(c.AdminToken)))
	}
	if c.MetricsToken != "" && len(c.MetricsToken) < 16 {
		errs = append(errs, fmt.Errorf("gateway: MetricsToken is %d bytes, want at least 16", len(c.MetricsToken)))
	}
	for name, d := range map[string]time.Duration{
		"ReadHeaderTimeout": c.ReadHeaderTimeout, "ReadTimeout": c.ReadTimeout,
		"WriteTimeout": c.WriteTimeout, "IdleTimeout": c.IdleTimeout,
		"ReadyTimeout": c.ReadyTimeout, "DrainTimeout": c.DrainTimeout, "HandlerTimeout": c.HandlerTimeout,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("gateway: %s must not be negative, got %v", name, d))
		}
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("gateway: MaxBodyBytes must not be negative, got %d", c.MaxBodyBytes))
	}
	return errors.Join(errs...)
}

func (c *APIConfig) fill() {
	if c.Addr == "" {
		c.Addr = DefaultAPIAddr
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registry == nil {
		c.Registry = prometheus.DefaultGatherer
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&c.ReadTimeout, DefaultReadTimeout)
	def(&c.WriteTimeout, DefaultWriteTimeout)
	def(&c.IdleTimeout, DefaultIdleTimeout)
	def(&c.ReadyTimeout, DefaultReadyTimeout)
	def(&c.ReadyEvery, DefaultReadyEvery)
	def(&c.DrainTimeout, DefaultDrainTimeout)
	def(&c.HandlerTimeout, DefaultHandlerTimeout)
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
}

// API is fanfare's HTTP API server: health, readiness, metrics, and the
// user and admin routes registered with HandleUser, HandleAdmin and
// HandleUserOrAdmin. Register routes before Run or Serve.
type API struct {
	cfg       APIConfig
	log       *slog.Logger
	mux       *http.ServeMux
	srv       *http.Server
	adminHash [sha256.Size]byte
	// metricsHash is MetricsToken's hash (compared like the admin token).
	metricsHash [sha256.Size]byte
	draining    atomic.Bool
	addr        atomic.Pointer[net.Addr]
	// inflight counts the requests being served (Shutdown's verdict).
	inflight atomic.Int64

	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec

	// readyMu is held around one Ready call; readyAt and readyErr are its
	// last result (see APIConfig.ReadyEvery).
	readyMu  sync.Mutex
	readyAt  time.Time
	readyErr error
}

// NewAPI returns an API with /healthz, /readyz and /metrics registered.
func NewAPI(cfg APIConfig) (*API, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fill()
	a := &API{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	if cfg.AdminToken != "" {
		a.adminHash = sha256.Sum256([]byte(cfg.AdminToken))
	}
	if cfg.MetricsToken != "" {
		a.metricsHash = sha256.Sum256([]byte(cfg.MetricsToken))
	}
	a.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fanfare_http_requests_total",
		Help: "HTTP API requests by route pattern and status code.",
	}, []string{"route", "code"})
	a.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fanfare_http_request_duration_seconds",
		Help:    "HTTP API request latency by route pattern.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"route"})
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{a.requests, a.latency} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("gateway: register metrics: %w", err)
			}
		}
	}
	a.srv = &http.Server{
		Addr:              cfg.Addr,
		Handler:           http.HandlerFunc(a.serve),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}

	a.HandlePublic("GET /healthz", http.HandlerFunc(a.healthz))
	a.HandlePublic("GET /readyz", http.HandlerFunc(a.readyz))
	a.HandlePublic("GET /metrics", a.requireMetricsToken(promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelError),
		ErrorHandling: promhttp.ContinueOnError,
	})))
	a.mux.Handle("/", a.instrument("unmatched", http.HandlerFunc(a.unmatched)))
	return a, nil
}

// serve is the server's handler: the mux, with the request counted in
// flight while it runs.
func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	a.inflight.Add(1)
	defer a.inflight.Add(-1)
	a.mux.ServeHTTP(w, r)
}

// Handler returns the API's handler (for httptest and embedding).
func (a *API) Handler() http.Handler { return http.HandlerFunc(a.serve) }

// Addr returns the address being served, nil before Run or Serve.
func (a *API) Addr() net.Addr {
	if p := a.addr.Load(); p != nil {
		return *p
	}
	return nil
}

// Run listens on APIConfig.Addr and serves until ctx ends (then drains for
// at most DrainTimeout) or Shutdown is called. It returns nil after a
// clean shutdown.
func (a *API) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", a.cfg.Addr)
	if err != nil {
		return fmt.Errorf("gateway: listen %s: %w", a.cfg.Addr, err)
	}
	return a.Serve(ctx, ln)
}

// Serve serves on ln like Run. It closes ln when it returns.
func (a *API) Serve(ctx context.Context, ln net.Listener) error {
	addr := ln.Addr()
	a.addr.Store(&addr)
	a.log.Info("http api listening", "addr", addr.String())
	errc := make(chan error, 1)
	go func() { errc <- a.srv.Serve(ln) }()
	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("gateway: serve: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.DrainTimeout)
		defer cancel()
		err := a.Shutdown(sctx)
		<-errc
		return err
	}
}

// Drain makes /readyz answer 503 while requests are still served: the first
// step of a graceful shutdown, so that load balancers stop sending first.
func (a *API) Drain() { a.draining.Store(true) }

// Shutdown stops accepting requests, makes /readyz answer 503, and waits
// for in-flight requests until ctx ends; then it closes the remaining
// connections, and returns ctx's error if a request was still being
// served. Connections with no request in flight (net/http counts a
// connection accepted less than 5 s ago whose request has not arrived as
// busy) are closed without an error: nothing was cut. The API cannot be
// served again.
func (a *API) Shutdown(ctx context.Context) error {
	a.draining.Store(true)
	a.log.Info("http api draining")
	if err := a.srv.Shutdown(ctx); err != nil {
		a.srv.Close()
		if n := a.inflight.Load(); n > 0 {
			return fmt.Errorf("gateway: shutdown: %d requests cut: %w", n, err)
		}
		a.log.Info("http api drain: connections without a request closed at the deadline")
	}
	return nil
}

// HandlerFunc is a route handler. A returned error is written with
// WriteError in the route's scope (and logged when internal), so return
// errors only before writing the response.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Caller is who made an authenticated request.
type Caller struct {
	// Admin is true for the admin token; Claims is then zero.
	Admin bool
	// Claims are the verified user token's claims.
	Claims auth.Claims
}

type callerKey struct{}

// WithCaller returns ctx carrying c (for tests of handlers).
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller the auth middleware stored in ctx.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// HandlePublic registers h for pattern without authentication.
func (a *API) HandlePublic(pattern string, h http.Handler) {
	a.mux.Handle(pattern, a.instrument(pattern, h))
}

// HandleUser registers h for pattern behind user authentication (Bearer
// JWT); CallerFrom(r.Context()).Claims holds the user. Errors map in
// ScopeMember.
func (a *API) HandleUser(pattern string, h HandlerFunc) {
	a.HandlePublic(pattern, a.limitBody(a.requireUser(a.withErrors(h))))
}

// HandleAdmin registers h for pattern behind the admin token. Errors map
// in ScopeAdmin.
func (a *API) HandleAdmin(pattern string, h HandlerFunc) {
	a.HandlePublic(pattern, a.limitBody(a.requireAdmin(a.withErrors(h))))
}

// HandleUserOrAdmin registers h for pattern accepting the admin token or a
// user token (POST /v1/groups/{gid}/messages: "member or admin").
func (a *API) HandleUserOrAdmin(pattern string, h HandlerFunc) {
	a.HandlePublic(pattern, a.limitBody(a.requireUserOrAdmin(a.withErrors(h))))
}

// withErrors adapts h, writing its error in the caller's scope; h runs
// under HandlerTimeout.
func (a *API) withErrors(h HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), a.cfg.HandlerTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		if err := h(w, r); err != nil {
			scope := ScopeMember
			if c, _ := CallerFrom(r.Context()); c.Admin {
				scope = ScopeAdmin
			}
			a.writeError(w, r, err, scope)
		}
	})
}

func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error, scope Scope) {
	rep := WriteError(w, err, scope)
	switch {
	case rep.Status >= 500 && !rep.Retryable():
		a.log.Error("http request failed", "method", r.Method, "path", r.URL.Path, "code", rep.Code, "err", err)
	case rep.Status >= 500:
		a.log.Warn("http request refused", "method", r.Method, "path", r.URL.Path, "code", rep.Code, "err", err)
	default:
		a.log.Debug("http request refused", "method", r.Method, "path", r.URL.Path, "code", rep.Code, "err", err)
	}
}

func (a *API) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes)
		}
		next.ServeHTTP(w, r)
	})
}

// bearerToken returns the token of "Authorization: Bearer <token>".
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	tok := strings.TrimSpace(h[len(prefix):])
	return tok, tok != ""
}

// isAdmin compares tok with the admin token in constant time (hashing
// first makes the comparison independent of both lengths).
func (a *API) isAdmin(tok string) bool {
	return a.cfg.AdminToken != "" && tokenMatches(tok, &a.adminHash)
}

// tokenMatches compares tok with the token whose hash is want, in constant
// time (hashing first makes the comparison independent of both lengths).
func tokenMatches(tok string, want *[sha256.Size]byte) bool {
	h := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(h[:], want[:]) == 1
}

// requireMetricsToken guards /metrics with MetricsToken when one is set.
func (a *API) requireMetricsToken(next http.Handler) http.Handler {
	if a.cfg.MetricsToken == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tok, _ := bearerToken(r); !tokenMatches(tok, &a.metricsHash) {
			a.writeError(w, r, &clientError{base: ErrUnauthorized, msg: "metrics token required"}, ScopeAdmin)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *API) requireAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := bearerToken(r)
		if !ok || !a.isAdmin(tok) {
			a.writeError(w, r, &clientError{base: ErrUnauthorized, msg: "admin token required"}, ScopeAdmin)
			return
		}
		next.ServeHTTP(w, r.WithContext(WithCaller(r.Context(), Caller{Admin: true})))
	})
}

func (a *API) requireUser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := a.verifyUser(r)
		if err != nil {
			a.writeError(w, r, err, ScopeMember)
			return
		}
		next.ServeHTTP(w, r.WithContext(WithCaller(r.Context(), Caller{Claims: c})))
	})
}

func (a *API) requireUserOrAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tok, ok := bearerToken(r); ok && a.isAdmin(tok) {
			next.ServeHTTP(w, r.WithContext(WithCaller(r.Context(), Caller{Admin: true})))
			return
		}
		c, err := a.verifyUser(r)
		if err != nil {
			a.writeError(w, r, err, ScopeMember)
			return
		}
		next.ServeHTTP(w, r.WithContext(WithCaller(r.Context(), Caller{Claims: c})))
	})
}

func (a *API) verifyUser(r *http.Request) (auth.Claims, error) {
	tok, ok := bearerToken(r)
	if !ok {
		return auth.Claims{}, &clientError{base: ErrUnauthorized, msg: "bearer token required"}
	}
	if a.cfg.Verifier == nil {
		return auth.Claims{}, &clientError{base: ErrUnauthorized, msg: "user authentication is not configured"}
	}
	c, err := a.cfg.Verifier.Verify(tok)
	if err != nil {
		if !errors.Is(err, auth.ErrInvalidToken) {
			err = fmt.Errorf("%w: %w", auth.ErrInvalidToken, err)
		}
		return auth.Claims{}, err
	}
	return c, nil
}

// instrument counts requests and latency under route, and turns a panic
// into a logged 500 (http.ErrAbortHandler still aborts).
func (a *API) instrument(route string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				a.log.Error("http handler panic", "route", route, "panic", fmt.Sprint(p))
				if !sw.wrote {
					WriteError(sw, errors.New("panic"), ScopeAdmin)
				}
			}
			status := sw.status
			if status == 0 {
				status = http.StatusOK
			}
			a.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
			a.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
		}()
		next.ServeHTTP(sw, r)
	})
}

// statusWriter records the status code written.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (a *API) healthz(w http.ResponseWriter, _ *http.Request) {
	writeRaw(w, http.StatusOK, []byte(`{"status":"ok"}`+"\n"))
}

func (a *API) readyz(w http.ResponseWriter, r *http.Request) {
	if a.draining.Load() {
		WriteError(w, RetryLater(&clientError{base: ErrNotReady, msg: "shutting down"}, DefaultRetryAfter), ScopeAdmin)
		return
	}
	if a.cfg.Ready != nil {
		if err := a.ready(r.Context()); err != nil {
			WriteError(w, &clientError{base: ErrNotReady, msg: "not ready"}, ScopeAdmin)
			return
		}
	}
	writeRaw(w, http.StatusOK, []byte(`{"status":"ok"}`+"\n"))
}

// ready returns the result of Ready, called at most once per ReadyEvery;
// it logs when the node becomes not ready, not once per probe.
func (a *API) ready(ctx context.Context) error {
	a.readyMu.Lock()
	defer a.readyMu.Unlock()
	if a.cfg.ReadyEvery > 0 && !a.readyAt.IsZero() && time.Since(a.readyAt) < a.cfg.ReadyEvery {
		return a.readyErr
	}
	// Not the probe's context: the result serves the probes that wait.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ReadyTimeout)
	err := a.cfg.Ready(cctx)
	cancel()
	switch {
	case err != nil && a.readyErr == nil:
		a.log.Warn("not ready", "err", err)
	case err == nil && a.readyErr != nil:
		a.log.Info("ready again")
	}
	a.readyAt, a.readyErr = time.Now(), err
	return err
}

// unmatched answers requests no route matched: 405 when the path exists
// for another method, 404 otherwise, both with the JSON error body.
func (a *API) unmatched(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := a.mux.Handler(probe); pattern != "/" && pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		body := []byte(`{"error":{"code":"bad_request","message":"method not allowed"}}` + "\n")
		writeRaw(w, http.StatusMethodNotAllowed, body)
		return
	}
	WriteError(w, &clientError{base: ErrNotFound, msg: "no such endpoint"}, ScopeAdmin)
}

// writeRaw writes a JSON body with status.
func writeRaw(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
