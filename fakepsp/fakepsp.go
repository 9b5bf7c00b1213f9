// Package fakepsp is a local payment provider that speaks the subset of
// Stripe's API the payment package uses, with a durable ledger in
// PostgreSQL and Stripe's idempotency rules, plus switches for the faults a
// real provider shows (latency, 5xx, answers lost after the charge
// committed). cmd/fakepsp serves it; tests start it in-process.
//
// The API (form-encoded requests, Stripe-shaped JSON objects and errors;
// any secret key that starts with sk_test_, as Bearer or Basic auth):
//
//	POST /v1/payment_intents          create and confirm (confirm=true) a PaymentIntent
//	GET  /v1/payment_intents/{id}     retrieve one
//	GET  /v1/payment_intents/search   query=metadata['k']:'v' [AND status:'succeeded'] …
//	POST /v1/refunds                  refund (part of) a succeeded PaymentIntent
//
// Test endpoints (no auth; bind the fake to loopback):
//
//	GET  /_ledger        every PaymentIntent and Refund with its idempotency key
//	GET  /_admin/faults  the faults injected now; POST replaces them (Faults as JSON)
//	GET  /_admin/stats   counters (Stats)
//	GET  /healthz        200 when the database answers
package fakepsp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of Config.
const (
	// DefaultKeyTTL is how long an idempotency key is kept, as at Stripe.
	DefaultKeyTTL = 24 * time.Hour
	// DefaultMaxStall bounds how long a LoseStall fault holds a connection.
	DefaultMaxStall = 2 * time.Minute
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes = 64 << 10
)

// Config configures a Server.
type Config struct {
	// Pool is the fake's own database, migrated with Migrate. Required.
	Pool *pgxpool.Pool
	// KeyTTL is how long an idempotency key is remembered (DefaultKeyTTL
	// when 0); a key reused after that executes anew, as at Stripe.
	KeyTTL time.Duration
	// MaxStall bounds a LoseStall fault (DefaultMaxStall when 0).
	MaxStall time.Duration
	// Faults are injected from the start (none by default).
	Faults Faults
	// Logger logs requests that failed on our side (discarded when nil).
	Logger *slog.Logger
}

// Server is the fake provider: an http.Handler.
type Server struct {
	cfg      Config
	pool     *pgxpool.Pool
	handler  http.Handler
	logger   *slog.Logger
	count    counters
	inFlight atomic.Int64

	mu     sync.Mutex
	faults Faults
}

// New returns a Server on cfg.Pool. It returns an error naming the field
// when cfg is invalid.
func New(cfg Config) (*Server, error) {
	if cfg.Pool == nil {
		return nil, errors.New("fakepsp: Config.Pool is required")
	}
	if cfg.KeyTTL == 0 {
		cfg.KeyTTL = DefaultKeyTTL
	}
	if cfg.KeyTTL < time.Second {
		return nil, fmt.Errorf("fakepsp: Config.KeyTTL must be at least 1s, got %s", cfg.KeyTTL)
	}
	if cfg.MaxStall == 0 {
		cfg.MaxStall = DefaultMaxStall
	}
	if cfg.MaxStall < 0 {
		return nil, fmt.Errorf("fakepsp: Config.MaxStall must not be negative, got %s", cfg.MaxStall)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, pool: cfg.Pool, logger: cfg.Logger}
	if err := s.SetFaults(cfg.Faults); err != nil {
		return nil, fmt.Errorf("fakepsp: Config.Faults: %w", err)
	}
	s.handler = s.routes()
	return s, nil
}

// ServeHTTP serves the API and the test endpoints.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// PurgeExpiredKeys deletes the idempotency keys older than Config.KeyTTL
// (by the database clock) and returns how many it deleted. An expired key is
// ignored anyway; this only bounds the table. Safe to call at any time.
func (s *Server) PurgeExpiredKeys(ctx context.Context) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE created_at <= now() - make_interval(secs => $1)`, s.cfg.KeyTTL.Seconds())
	if err != nil {
		return 0, fmt.Errorf("purge expired idempotency keys: %w", err)
	}
	return tag.RowsAffected(), nil
}

// InFlight reports how many POSTs hold their idempotency key right now.
func (s *Server) InFlight() int { return int(s.inFlight.Load()) }

func (s *Server) routes() http.Handler {
	r := chi.NewRouter()
	r.Route("/v1", func(r chi.Router) {
		r.Use(s.authenticate, s.injectErrors)
		r.Post("/payment_intents", s.keyed(s.createPaymentIntent))
		r.Get("/payment_intents/search", s.searchPaymentIntents)
		r.Get("/payment_intents/{id}", s.retrievePaymentIntent)
		r.Post("/payment_intents/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {
			s.keyed(s.cancelPaymentIntent(chi.URLParam(r, "id")))(w, r)
		})
		r.Post("/refunds", s.keyed(s.createRefund))
		r.Get("/refunds", s.listRefunds)
	})
	r.Get("/_ledger", s.ledger)
	r.Get("/_admin/faults", s.getFaults)
	r.Post("/_admin/faults", s.postFaults)
	r.Post("/_admin/payment_intents/{id}/authenticate", func(w http.ResponseWriter, r *http.Request) {
		ok, err := s.CompleteAuthentication(r.Context(), chi.URLParam(r, "id"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, http.StatusOK, map[string]bool{"charged": ok})
	})
	r.Get("/_admin/stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, s.Stats()) })
	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.pool.Ping(r.Context()); err != nil {
			http.Error(w, "database: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		invalidRequest(http.StatusNotFound, "", "", "Unrecognized request URL ("+r.Method+": "+r.URL.Path+").").write(w, newID("req"))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		invalidRequest(http.StatusMethodNotAllowed, "", "", "Unrecognized request URL ("+r.Method+": "+r.URL.Path+").").write(w, newID("req"))
	})
	return r
}

// authenticate accepts any secret key that starts with sk_test_, sent as
// Bearer token or as the user name of Basic auth, like Stripe's test mode.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.count.requests.Add(1)
		key := ""
		if user, _, ok := r.BasicAuth(); ok {
			key = user
		} else if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
			key = strings.TrimSpace(h[7:])
		}
		switch {
		case key == "":
			invalidRequest(http.StatusUnauthorized, "", "", "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').").write(w, newID("req"))
		case !strings.HasPrefix(key, "sk_test_") || len(key) == len("sk_test_"):
			invalidRequest(http.StatusUnauthorized, "", "", "Invalid API Key provided: "+redactKey(key)+" (this fake accepts any key that starts with sk_test_)").write(w, newID("req"))
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// redactKey shows a key's first 8 and last 4 characters, as Stripe does,
// and only those of a key long enough to hide at least as many: a shorter
// one is all stars (one of 9 to 11 characters used to panic the handler).
func redactKey(k string) string {
	if len(k) < 24 {
		return strings.Repeat("*", len(k))
	}
	return k[:8] + strings.Repeat("*", len(k)-12) + k[len(k)-4:]
}

// injectErrors answers the ErrorRate share of requests 500 before anything
// executes, and delays GETs by the latency fault (POSTs wait while holding
// their key, in keyed).
func (s *Server) injectErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.injectError() {
			s.count.injectedErrors.Add(1)
			errorResponse(http.StatusInternalServerError, stripeError{Type: errTypeAPI, Message: "An unknown error occurred (injected by fakepsp)."}).write(w, newID("req"))
			return
		}
		if r.Method == http.MethodGet {
			if d := s.latency(); d > 0 && !sleep(r.Context(), d) {
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// endpoint executes one POST inside the transaction that also stores its
// answer under the idempotency key. It returns the answer and whether the
// endpoint executed (its writes commit and its answer is stored); a
// request refused by validation writes nothing and is not stored, as at
// Stripe, so a corrected retry with the same key may still run.
type endpoint func(ctx context.Context, tx pgx.Tx, key string, form url.Values) (resp response, executed bool, err error)

// errNotExecuted rolls back a transaction whose endpoint refused the request.
var errNotExecuted = errors.New("request not executed")

// keyed wraps an endpoint in Stripe's idempotency layer: the first request
// with a key executes and its status and body are stored with its effects in
// one transaction; a later one with the same parameters gets them replayed
// with Idempotent-Replayed: true; other parameters get 400
// idempotency_error; a request whose key is held by one still running gets
// 409 idempotency_key_in_use at once. Keys expire after Config.KeyTTL (by
// the database clock). A crash rolls everything back: no key stays held.
func (s *Server) keyed(ep endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		requestID := newID("req")
		form, bad := readForm(w, r)
		if bad != nil {
			bad.write(w, requestID)
			return
		}
		key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
		if len(key) > 255 {
			invalidRequest(http.StatusBadRequest, "", "", "Idempotency-Key must be at most 255 characters long.").write(w, requestID)
			return
		}
		fingerprint := r.Method + " " + r.URL.Path + "\n" + form.Encode() // Encode sorts by name

		var (
			resp              response
			replayed          bool
			originalRequestID string
			executed          bool
		)
		ctx := r.Context()
		err := inTx(ctx, s.pool, func(tx pgx.Tx) error {
			resp, replayed, executed = response{}, false, false
			if key != "" {
				var held bool
				if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 7262))", key).Scan(&held); err != nil {
					return fmt.Errorf("lock idempotency key: %w", err)
				}
				if !held {
					s.count.conflicts.Add(1)
					resp = invalidRequest(http.StatusConflict, "idempotency_key_in_use", "",
						"There is currently another in-progress request using this Idempotency Key (that probably means you submitted twice, and the other request is still going through): "+key+". Please try again later.")
					return errNotExecuted
				}
				s.inFlight.Add(1)
				defer s.inFlight.Add(-1)
				if _, err := tx.Exec(ctx, keyDeleteExpired, key, s.cfg.KeyTTL.Seconds()); err != nil {
					return fmt.Errorf("expire idempotency key: %w", err)
				}
				var storedFingerprint string
				err := tx.QueryRow(ctx, keyGet, key).Scan(&storedFingerprint, &originalRequestID, &resp.status, &resp.body)
				switch {
				case err == nil && storedFingerprint == fingerprint:
					replayed = true
					return nil
				case err == nil:
					s.count.mismatches.Add(1)
					resp = errorResponse(http.StatusBadRequest, stripeError{Type: errTypeIdempotency,
						Message: "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '" + key + "' if you meant to execute a different request."})
					return errNotExecuted
				case !errors.Is(err, pgx.ErrNoRows):
					return fmt.Errorf("get idempotency key: %w", err)
				}
			}
			var err error
			if key != "" && s.storeErrorNow() {
				// Failed once it began (StoreErrorNext): nothing made,
				// the 500 stored under the key.
				s.count.injectedErrors.Add(1)
				resp, executed = errorResponse(http.StatusInternalServerError, stripeError{Type: errTypeAPI, Message: "An unknown error occurred while processing your request."}), true
			} else if resp, executed, err = ep(ctx, tx, key, form); err != nil {
				return err
			}
			if !executed {
				return errNotExecuted
			}
			if key != "" {
				if _, err := tx.Exec(ctx, keyInsert, key, fingerprint, requestID, resp.status, resp.body); err != nil {
					return fmt.Errorf("store idempotency key: %w", err)
				}
			}
			if d := s.latency(); d > 0 && !sleep(ctx, d) {
				return ctx.Err()
			}
			return nil
		})
		if err != nil && !errors.Is(err, errNotExecuted) {
			if ctx.Err() == nil {
				s.logger.ErrorContext(ctx, "request failed", "path", r.URL.Path, "request_id", requestID, "err", err)
			}
			errorResponse(http.StatusInternalServerError, stripeError{Type: errTypeAPI, Message: "An unknown error occurred."}).write(w, requestID)
			return
		}
		if key != "" {
			w.Header().Set("Idempotency-Key", key)
		}
		if replayed {
			s.count.replays.Add(1)
			w.Header().Set("Idempotent-Replayed", "true")
			w.Header().Set("Original-Request", originalRequestID)
		}
		if executed || replayed {
			if lose, mode := s.loseNow(); lose {
				s.loseResponse(w, r, mode)
				return
			}
		}
		resp.write(w, requestID)
	}
}

const (
	keyDeleteExpired = `DELETE FROM idempotency_keys WHERE key = $1 AND created_at <= now() - make_interval(secs => $2)`
	keyGet           = `SELECT fingerprint, request_id, status_code, body FROM idempotency_keys WHERE key = $1`
	keyInsert        = `INSERT INTO idempotency_keys (key, fingerprint, request_id, status_code, body) VALUES ($1, $2, $3, $4, $5)`
)

// readForm reads a form-encoded body (at most MaxBodyBytes). It returns
// the answer to send instead when the body is not one.
func readForm(w http.ResponseWriter, r *http.Request) (url.Values, *response) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/x-www-form-urlencoded" {
			resp := invalidRequest(http.StatusBadRequest, "", "", "Invalid request: the body must be application/x-www-form-urlencoded.")
			return nil, &resp
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		resp := invalidRequest(http.StatusBadRequest, "", "", "Invalid request body: "+err.Error())
		return nil, &resp
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		resp := invalidRequest(http.StatusBadRequest, "", "", "Invalid form encoding: "+err.Error())
		return nil, &resp
	}
	return form, nil
}

// inTx runs fn in a transaction, committed when fn returns nil. The
// rollback runs even when ctx was cancelled, so the key's lock is released
// at once.
func inTx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client went away: nothing to do
}

func (s *Server) getFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Faults())
}

// postFaults replaces the faults with the JSON body (absent fields: none).
func (s *Server) postFaults(w http.ResponseWriter, r *http.Request) {
	var f Faults
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid faults: " + err.Error()})
		return
	}
	if err := s.SetFaults(f); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid faults: " + err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, s.Faults())
}
