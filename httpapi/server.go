// Package httpapi is the service's HTTP interface: routes, JSON in and out,
// problem+json errors and the Idempotency-Key header. It translates requests
// into commands and queries and their results into responses; it decides
// nothing itself.
package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/acme/orders/auth"
	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/health"
	"github.com/acme/orders/metrics"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/query"
)

// Authenticator maps a bearer token to its tenant; *auth.Clients is one. It
// returns auth.ErrUnknownToken for a token it does not know (401) and
// auth.ErrBusy when it cannot check one now (503 auth-busy).
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (tenant string, err error)
}

// KeyLookup reads a tenant's stored keys; *command.Idempotency is one.
type KeyLookup interface {
	Lookup(ctx context.Context, tenantID, key string) ([]command.KeyRecord, error)
}

// OrderCommand runs one kind of order command under an Idempotency-Key: the
// handler owns the transaction and the key claim, this package only renders
// the outcome. The command package's handlers are such.
type OrderCommand[C any] interface {
	Run(ctx context.Context, idem *command.Idempotency, req command.OrderRequest[C], render command.Render) (command.Result, error)
}

// Query answers one kind of query; the query package's handlers are such.
type Query[Q, R any] interface {
	Handle(ctx context.Context, q Q) (R, error)
}

var (
	_ Authenticator                                          = (*auth.Clients)(nil)
	_ KeyLookup                                              = (*command.Idempotency)(nil)
	_ OrderCommand[command.CreateOrder]                      = command.CreateOrderHandler{}
	_ OrderCommand[command.PayOrder]                         = command.PayOrderHandler{}
	_ OrderCommand[command.ShipOrder]                        = command.ShipOrderHandler{}
	_ OrderCommand[command.CancelOrder]                      = command.CancelOrderHandler{}
	_ OrderCommand[command.RefundOrder]                      = command.RefundOrderHandler{}
	_ OrderCommand[command.UpdateOrder]                      = command.UpdateOrderHandler{}
	_ Query[query.GetOrder, domain.Order]                    = query.GetOrderHandler{}
	_ Query[query.ListOrders, query.OrderPage]               = query.ListOrdersHandler{}
	_ Query[query.GetCustomerSummary, query.CustomerSummary] = query.GetCustomerSummaryHandler{}
	_ Query[query.GetDailySales, []query.DaySales]           = query.GetDailySalesHandler{}
)

// Deps is everything the HTTP interface needs.
type Deps struct {
	Logger *slog.Logger
	Auth   Authenticator
	// Idempotency is the key store the order commands run under.
	Idempotency *command.Idempotency
	Keys        KeyLookup

	CreateOrder OrderCommand[command.CreateOrder]
	PayOrder    OrderCommand[command.PayOrder]
	ShipOrder   OrderCommand[command.ShipOrder]
	CancelOrder OrderCommand[command.CancelOrder]
	RefundOrder OrderCommand[command.RefundOrder]
	UpdateOrder OrderCommand[command.UpdateOrder]

	GetOrder           Query[query.GetOrder, domain.Order]
	ListOrders         Query[query.ListOrders, query.OrderPage]
	GetCustomerSummary Query[query.GetCustomerSummary, query.CustomerSummary]
	GetDailySales      Query[query.GetDailySales, []query.DaySales]

	// KeyWait bounds how long a request waits for an in-flight request with
	// the same Idempotency-Key before it gets 409; default DefaultKeyWait.
	KeyWait time.Duration
	// ReadWait is how long a read with min_version (or min_position) waits
	// for the read model by default; default DefaultReadWait. Clients may ask for up to
	// MaxReadWait with Prefer: wait=N.
	ReadWait time.Duration
	// Health answers /readyz from its last round of checks (nil: always ready).
	Health *health.Monitor
	// Metrics is served at GET /metrics (see metrics.Handler); if nil, an
	// empty registry's.
	Metrics http.Handler
	// Requests, if set, counts and times every request by route template,
	// method and status.
	Requests *RequestMetrics
	// InFlight, if set, bounds the /v1 requests served at once; the rest
	// get 429 (health and metrics endpoints are never limited). It is the
	// last-resort net behind Tenants, whose per-tenant limit is well below it.
	InFlight *InFlightLimit
	// Tenants, if set, limits each tenant's rate, requests in flight and
	// read-your-writes reads in flight; its excess gets 429.
	Tenants *TenantLimits
	// BodyTimeout bounds how long a request body may take to arrive; the
	// rest get 408. Default DefaultBodyTimeout.
	BodyTimeout time.Duration
	// RequestTimeout bounds a /v1 request from the end of its body to its
	// answer: its database work (a table locked by DDL, a server that stalls or
	// is black-holed) is cancelled then, and the client gets 503
	// database-unavailable with Retry-After. It must leave room for the
	// longest legitimate wait (three key waits, a read-your-writes wait)
	// and end before the server's write timeout, past which no answer is
	// delivered at all. Default DefaultRequestTimeout.
	RequestTimeout time.Duration
}

// The defaults of Deps' waits, and the bound of a read-your-writes wait.
const (
	// DefaultKeyWait is Deps.KeyWait's default.
	DefaultKeyWait = 5 * time.Second
	// DefaultReadWait is Deps.ReadWait's default.
	DefaultReadWait = 2 * time.Second
	// MaxReadWait bounds any read-your-writes wait.
	MaxReadWait = 10 * time.Second
	// DefaultRequestTimeout is Deps.RequestTimeout's default: three
	// default key waits, a read wait and a body's timeout fit in it.
	DefaultRequestTimeout = 30 * time.Second
)

// Server serves the API.
type Server struct {
	Deps
}

// New returns the API's http.Handler.
func New(deps Deps) http.Handler {
	if deps.KeyWait <= 0 {
		deps.KeyWait = DefaultKeyWait
	}
	if deps.ReadWait <= 0 {
		deps.ReadWait = DefaultReadWait
	}
	if deps.BodyTimeout <= 0 {
		deps.BodyTimeout = DefaultBodyTimeout
	}
	if deps.RequestTimeout <= 0 {
		deps.RequestTimeout = DefaultRequestTimeout
	}
	if deps.Metrics == nil {
		deps.Metrics = metrics.Handler(metrics.NewRegistry())
	}
	s := &Server{Deps: deps}
	return s.routes()
}

type ctxKey int

const (
	requestIDKey ctxKey = iota
	tenantKey
)

// tokenHelp is what a caller without a working token should do.
const tokenHelp = "Send Authorization: Bearer <token>; `go run ./cmd/api token create -tenant NAME` makes a token."

// deadline bounds the request's context by RequestTimeout (see Deps): the
// database work under it is cancelled then, and writeProblem answers 503.
func (s *Server) deadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeoutCause(r.Context(), s.RequestTimeout, errRequestTimeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// errRequestTimeout is the cause of a request's context ended by its
// RequestTimeout.
var errRequestTimeout = errors.New("the request's time ran out")

// authenticate admits requests with a known bearer token and puts the
// caller's tenant in the context; anything else gets 401 before it can touch
// any data (so nothing is stored for it). It runs before any limit takes a
// slot: a forged token (failing its checksum) costs neither a slot nor a
// database query. Two Authorization headers are a 400, as two
// Idempotency-Keys are.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		unauthorized := func(detail string) {
			p := problem(http.StatusUnauthorized, "unauthorized", "Unauthorized", detail)
			p.header = http.Header{"Www-Authenticate": {`Bearer realm="orders"`}}
			s.refuse(w, r, p)
		}
		if len(r.Header.Values("Authorization")) > 1 {
			s.refuse(w, r, problem(http.StatusBadRequest, "invalid-authorization", "Invalid Authorization",
				"Send exactly one Authorization header."))
			return
		}
		scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
			unauthorized(tokenHelp)
			return
		}
		tenant, err := s.Auth.Authenticate(r.Context(), strings.TrimSpace(token))
		if errors.Is(err, auth.ErrLegacyToken) {
			unauthorized("The bearer token has the old format without a checksum, which this server no longer accepts; " +
				"`go run ./cmd/api token create -tenant NAME` makes a new one.")
			return
		}
		if errors.Is(err, auth.ErrMalformedToken) {
			unauthorized("The bearer token is not in the form this server issues (its length, characters or checksum are wrong: a typo or a truncated copy?). " + tokenHelp)
			return
		}
		if errors.Is(err, auth.ErrUnknownToken) {
			unauthorized("The bearer token is not known, or was revoked, or has expired. " + tokenHelp)
			return
		}
		if errors.Is(err, auth.ErrBusy) {
			// 503, not 401: the token may well be valid, and a client told
			// 401 may drop it or page someone; it is the server that is
			// busy (token look-ups flooded), and a retry soon succeeds.
			p := problem(http.StatusServiceUnavailable, "auth-busy", "Authentication busy",
				"The bearer token could not be checked now (token look-ups are busy); it was not refused. Retry after Retry-After seconds.")
			p.header = http.Header{"Retry-After": {"1"}}
			s.refuse(w, r, p)
			return
		}
		if err != nil {
			writeProblem(w, r, s.Logger, problemFor(err), err)
			return
		}
		// The tenant's statements count against its share of the
		// database's connections (postgres.Shares).
		ctx := postgres.ForTenant(context.WithValue(r.Context(), tenantKey, tenant), tenant)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// tenantOf returns the tenant the authenticated caller acts for.
func tenantOf(r *http.Request) string {
	t, _ := r.Context().Value(tenantKey).(string)
	return t
}

// withRequestID gives every request an id (the client's X-Request-Id if it is
// sane, else a new one), echoes it in the response and puts it in the context.
func withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if len(id) == 0 || len(id) > 128 || !printableASCII(id) {
			var b [12]byte
			_, _ = rand.Read(b[:])
			id = hex.EncodeToString(b[:])
		}
		w.Header().Set("X-Request-Id", id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey, id)))
	})
}

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

// recoverer turns a panic into a logged 500 problem, keeping the process alive.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.Logger.ErrorContext(r.Context(), "panic", "request_id", requestID(r.Context()), "panic", v)
				writeProblem(w, r, s.Logger, problemFor(nil), nil)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// logRequests logs one line per request, without bodies or headers.
func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		s.Logger.DebugContext(r.Context(), "request",
			"method", r.Method, "route", chi.RouteContext(r.Context()).RoutePattern(), "status", sw.status,
			"duration", time.Since(start), "request_id", requestID(r.Context()))
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// parseID reads a UUID path parameter; a malformed id is a 400.
func parseID(r *http.Request, name string) (uuid.UUID, *Problem) {
	raw, ok := pathParam(r, name)
	id, err := uuid.Parse(raw)
	if !ok || err != nil || len(raw) != 36 {
		return uuid.Nil, problem(http.StatusBadRequest, "malformed-id", "Malformed id",
			"The "+name+" in the path must be a UUID such as 0193b1a8-7c2e-7000-8000-000000000001.")
	}
	return id, nil
}
