// Package app holds the programs of the service's processes (RunAPI,
// RunProjector) and what they share: settings from the environment with
// flags as overrides, logging, the NATS connection and serving HTTP with a
// graceful shutdown. cmd/* only call into it.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"

	"github.com/acme/orders/postgres"
	"github.com/acme/orders/tracing"
)

// Defaults match the local stack that `make run` starts.
const (
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:54329/orders?sslmode=disable"
	DefaultNATSURL     = "nats://127.0.0.1:14222"
	// DefaultAPIPoolSize and DefaultProjectorPoolSize are the default
	// -db-pool-size of each process.
	DefaultAPIPoolSize       = 20
	DefaultProjectorPoolSize = 10
	// DefaultCreateGroupSlots is the default -create-group-slots: batches
	// of concurrent creates committing at once (command.IdempotencyConfig.GroupSlots).
	DefaultCreateGroupSlots = 4
	// DefaultJanitorInterval is how often the api deletes expired keys.
	DefaultJanitorInterval = time.Minute
	// APIShutdownTimeout and ProjectorShutdownTimeout bound how long each
	// process's HTTP server waits for in-flight requests when it stops.
	APIShutdownTimeout       = 10 * time.Second
	ProjectorShutdownTimeout = 5 * time.Second
)

// Env reads settings: each flag's default is the environment variable's
// value when set, so flags override the environment. A variable that is set
// but cannot be parsed is an error (Err), never silently ignored.
type Env struct {
	get  func(string) string
	errs []error
}

// NewEnv reads variables with get (os.Getenv, or a test's map).
func NewEnv(get func(string) string) *Env { return &Env{get: get} }

// Err reports the variables that could not be parsed.
func (env *Env) Err() error { return errors.Join(env.errs...) }

func (env *Env) bad(key, v string, err error) {
	env.errs = append(env.errs, fmt.Errorf("$%s=%q: %w", key, v, err))
}

// String defines a string flag defaulting to $key, else def.
func (env *Env) String(fs *flag.FlagSet, name, key, def, usage string) *string {
	if v := env.get(key); v != "" {
		def = v
	}
	return fs.String(name, def, usage+" ($"+key+")")
}

// Duration defines a duration flag defaulting to $key, else def.
func (env *Env) Duration(fs *flag.FlagSet, name, key string, def time.Duration, usage string) *time.Duration {
	if v := env.get(key); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			env.bad(key, v, err)
		}
		def = d
	}
	return fs.Duration(name, def, usage+" ($"+key+")")
}

// Int defines an int flag defaulting to $key, else def.
func (env *Env) Int(fs *flag.FlagSet, name, key string, def int, usage string) *int {
	if v := env.get(key); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			env.bad(key, v, err)
		}
		def = n
	}
	return fs.Int(name, def, usage+" ($"+key+")")
}

// Bool defines a bool flag defaulting to $key, else def.
func (env *Env) Bool(fs *flag.FlagSet, name, key string, def bool, usage string) *bool {
	if v := env.get(key); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			env.bad(key, v, err)
		}
		def = b
	}
	return fs.Bool(name, def, usage+" ($"+key+")")
}

// Tracing reads the standard OTEL_* variables that turn tracing on (see
// tracing.Config); the exporter reads the rest of them (headers, timeout,
// compression, TLS) itself.
func (env *Env) Tracing(service string) tracing.Config {
	c := tracing.Config{ServiceName: service, Exporter: env.get("OTEL_TRACES_EXPORTER"), Endpoint: env.get("OTEL_EXPORTER_OTLP_ENDPOINT")}
	if v := env.get("OTEL_SERVICE_NAME"); v != "" {
		c.ServiceName = v
	}
	if v := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); v != "" {
		c.Endpoint, c.TracesEndpoint = v, true
	}
	return c
}

// startTracing sets tracing up as cfg says (nothing when it is off) and
// returns what flushes the spans still buffered when the process stops.
func startTracing(ctx context.Context, cfg tracing.Config, logger *slog.Logger) (stop func(), err error) {
	shutdown, err := tracing.Setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if !cfg.On() {
		return func() {}, nil
	}
	// Export failures (collector down, spans dropped) reach our log.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { logger.Warn("tracing", "err", err) }))
	logger.Info("tracing on: exporting spans over OTLP/HTTP", "service", cfg.ServiceName)
	return func() {
		start := time.Now()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			logger.Warn("shutdown: spans not all exported", "err", err)
			return
		}
		logger.Info("shutdown: spans flushed to the collector", "duration", time.Since(start))
	}, nil
}

// CheckLogFlags refuses a log format or level NewLogger does not know: a
// mistyped LOG_LEVEL=degub silently logged at info before.
func CheckLogFlags(format, level string) error {
	switch strings.ToLower(format) {
	case "", "json", "text":
	default:
		return fmt.Errorf("-log-format (LOG_FORMAT) must be json or text, got %q", format)
	}
	switch strings.ToLower(level) {
	case "", "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("-log-level (LOG_LEVEL) must be debug, info, warn or error, got %q", level)
	}
	return nil
}

// NewLogger logs to w: as text when format is "text" (or empty and w is a
// terminal), else as JSON; at debug level when level is "debug". A record
// logged with the context of a recording span carries its trace_id and
// span_id.
func NewLogger(w io.Writer, format, level string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	switch strings.ToLower(level) {
	case "debug":
		opts.Level = slog.LevelDebug
	case "warn":
		opts.Level = slog.LevelWarn
	case "error":
		opts.Level = slog.LevelError
	}
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok {
			if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				format = "text"
			}
		}
	}
	// Records logged with a traced context carry trace_id and span_id.
	if strings.EqualFold(format, "text") {
		return slog.New(tracing.NewLogHandler(slog.NewTextHandler(w, opts)))
	}
	return slog.New(tracing.NewLogHandler(slog.NewJSONHandler(w, opts)))
}

// ConnectNATS connects to url and keeps reconnecting for as long as the
// process lives, so a broker restart needs no restart of ours. It returns
// before the first connection succeeds if the server is down (readiness
// reports it).
func ConnectNATS(url, name string, logger *slog.Logger) (*nats.Conn, error) {
	nc, err := nats.Connect(url,
		nats.Name(name),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { logger.Info("nats reconnected", "url", nc.ConnectedUrlRedacted()) }),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to nats at %s: %w", redactURL(url), err)
	}
	return nc, nil
}

// CloseNATS flushes what nc has sent (acks above all) to the server, then
// closes it.
func CloseNATS(nc *nats.Conn, logger *slog.Logger) {
	start := time.Now()
	defer func() {
		logger.Info("shutdown: NATS connection closed (pending publishes and acks flushed)", "duration", time.Since(start))
	}()
	if nc.IsConnected() {
		if err := nc.FlushTimeout(5 * time.Second); err != nil {
			logger.Warn("flush nats before close", "err", err)
		}
	}
	nc.Close()
}

// NATSReady is a readiness check for nc.
func NATSReady(nc *nats.Conn) func(context.Context) error {
	return func(context.Context) error {
		if !nc.IsConnected() {
			return fmt.Errorf("nats: %s", nc.Status())
		}
		return nil
	}
}

// Serve serves h on addr until ctx ends, then shuts down gracefully: it stops
// accepting, lets requests in progress finish (up to grace) and returns. It
// logs "listening" with the bound address (useful with port 0).
func Serve(ctx context.Context, addr string, h http.Handler, logger *slog.Logger, grace time.Duration) error {
	return ServeConns(ctx, addr, h, logger, grace, 0, nil)
}

// ServeConns is Serve with at most maxConns connections open at once (0:
// no limit; see connLimit), whose state it registers on reg if not nil.
func ServeConns(ctx context.Context, addr string, h http.Handler, logger *slog.Logger, grace time.Duration, maxConns int, reg prometheus.Registerer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	ln = problemRefusals(ln)
	var connState func(net.Conn, http.ConnState)
	if maxConns > 0 {
		limited := limitConns(ln, maxConns)
		ln, connState = limited, limited.connState
		if reg != nil {
			limited.register(reg)
		}
	}
	srv := &http.Server{
		ConnState:         connState,
		Handler:           h,
		ReadHeaderTimeout: 2 * time.Second, // headers come at once; a trickle holds a goroutine this long at most (and a connection slot until connLimit needs it: silentAfter)
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      serverWriteTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("listening", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutdown: stop taking work (no new connections or requests)", "addr", ln.Addr().String())
	stopping := time.Now()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Requests still running after grace: cut their connections.
		logger.Warn("requests still running after the grace period; closing their connections", "grace", grace)
		return srv.Close()
	}
	logger.Info("shutdown: in-flight requests finished", "duration", time.Since(stopping))
	return nil
}

// closeDB closes pool, waiting for its connections to be returned, and logs
// how long that took.
func closeDB(pool *pgxpool.Pool, logger *slog.Logger) {
	start := time.Now()
	pool.Close()
	logger.Info("shutdown: database connections closed", "duration", time.Since(start))
}

// MaxPoolSize bounds every process's -db-pool-size: far above what one
// PostgreSQL serves (its max_connections), and within pgx's int32, which a
// larger value would wrap (2^32 + 1 was a pool of one).
const MaxPoolSize = 10_000

// openDB opens the pool for a process: serving waits for the database as
// long as it takes (so a restart during an outage needs no repair), a
// one-off command gives up after 10 s (saying so as it retries).
func openDB(ctx context.Context, url string, poolSize int, oneOff bool, logger *slog.Logger) (*pgxpool.Pool, error) {
	wait := time.Duration(0)
	if oneOff {
		wait = 10 * time.Second
	}
	pool, err := postgres.Open(ctx, url, int32(poolSize), wait, logger)
	if err != nil {
		return nil, err
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// isHelp reports whether arg asks for help, as the flag package reads it.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "--h":
		return true
	}
	return false
}

// takesNoArgs reports whether subcommand sub (of the projector or the
// worker; "" is serving) takes no positional arguments: any left after its
// flags is a mistake, such as a mistyped subcommand.
func takesNoArgs(sub string) bool {
	switch sub {
	case "", "status", "dead-letters list":
		return true
	}
	return false
}
