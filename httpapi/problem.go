package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/query"
)

// ProblemBase prefixes every problem type; the README lists them all.
const ProblemBase = "https://orders.acme.example/problems/"

// Problem is an RFC 9457 problem detail. Type is a stable URI per kind of
// error, so clients branch on it, not on the prose.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Errors lists the offending fields of a validation problem.
	Errors []domain.FieldError `json:"errors,omitempty"`
	// MismatchedFields names the request fields that differ from the request
	// the Idempotency-Key was first used with.
	MismatchedFields []string `json:"mismatched_fields,omitempty"`
	// FirstUsedFor names the method and route an Idempotency-Key was first
	// used for, when a request reuses it on another (idempotency-key-mismatch).
	FirstUsedFor string `json:"first_used_for,omitempty"`
	// ResourceID identifies the existing resource a conflict refers to.
	ResourceID string `json:"resource_id,omitempty"`
	// CurrentStatus is the order's status when a step was refused.
	CurrentStatus string `json:"current_status,omitempty"`
	// CurrentVersion is how far a read model has got, when it is behind.
	CurrentVersion *int64 `json:"current_version,omitempty"`
	RequestID      string `json:"request_id,omitempty"`

	header http.Header // extra response headers (Location, Retry-After)
}

func problem(status int, kind, title, detail string) *Problem {
	return &Problem{Type: ProblemBase + kind, Title: title, Status: status, Detail: detail}
}

// problemFor maps an error to its problem: one table for every handler.
// Unknown errors are internal: logged in full, answered with a generic 500.
func problemFor(err error) *Problem {
	var de *domain.Error
	var mismatch *command.MismatchError
	var behind *query.BehindError
	var notWritten *query.NotWrittenError
	var quota *command.KeyQuotaError
	switch {
	case errors.As(err, &quota):
		p := problem(http.StatusTooManyRequests, "idempotency-quota-exceeded", "Idempotency key quota exceeded",
			fmt.Sprintf("This tenant has reached its quota of stored Idempotency-Keys (at most %d keys, and %d bytes of their requests and responses); keys make room as they expire. A retry of a stored key still replays.", quota.Quota, quota.QuotaBytes))
		p.header = http.Header{"Retry-After": {strconv.Itoa(max(1, int(quota.RetryAfter.Round(time.Second).Seconds())))}}
		return p
	case errors.As(err, &notWritten):
		return problem(http.StatusPreconditionFailed, "version-not-written", "Version not written",
			fmt.Sprintf("Version %d of this order was not written: the order itself is at version %d, and only a payment or refund settling adds a version by itself. Wait for the version your own write returned (its ETag), or the one after it for its payment or refund.", notWritten.Want, notWritten.Written))
	case errors.As(err, &behind):
		p := problem(http.StatusPreconditionFailed, "view-behind", "Read model behind",
			fmt.Sprintf("The read model has not caught up with version %d yet (it is at %d); retry shortly, or wait longer with Prefer: wait=N.", behind.Want, behind.Have))
		p.CurrentVersion = &behind.Have
		p.header = http.Header{"Retry-After": {"1"}}
		return p
	case errors.As(err, &mismatch):
		p := problem(http.StatusUnprocessableEntity, "idempotency-key-mismatch", "Idempotency-Key reused with a different request",
			"This Idempotency-Key was first used with a different request; use a new key for a new request.")
		if r := mismatch.FirstUsedFor; r != "" {
			p.Detail = fmt.Sprintf("This Idempotency-Key was first used for %s; use a new key for a new request.", r)
			p.FirstUsedFor = r
		}
		p.MismatchedFields = requestFields(mismatch.Fields)
		return p
	case errors.Is(err, command.ErrInFlight):
		p := problem(http.StatusConflict, "idempotency-key-in-flight", "Request with this Idempotency-Key in flight",
			"A request with this Idempotency-Key is still being processed; retry with the same key after Retry-After seconds.")
		p.header = http.Header{"Retry-After": {"1"}}
		return p
	case errors.Is(err, domain.ErrAmountNotChargeable) && errors.As(err, &de):
		p := problem(http.StatusUnprocessableEntity, "amount-not-chargeable", "Amount not chargeable", de.Message)
		p.CurrentStatus = de.State
		return p
	case errors.As(err, &de):
		switch de.Kind {
		case domain.KindInvalid:
			p := problem(http.StatusUnprocessableEntity, "validation-failed", "Request failed validation", de.Message)
			p.Errors = de.Fields
			return p
		case domain.KindNotFound:
			return problem(http.StatusNotFound, "not-found", "Not found", de.Message)
		case domain.KindConflict:
			p := problem(http.StatusConflict, "conflict", "Conflict with the current state", de.Message)
			p.ResourceID, p.CurrentStatus = de.ResourceID, de.State
			if de.RetryAfter > 0 {
				p.header = http.Header{"Retry-After": {strconv.Itoa(max(1, int(math.Ceil(de.RetryAfter.Seconds()))))}}
			}
			return p
		case domain.KindPreconditionFailed:
			p := problem(http.StatusPreconditionFailed, "precondition-failed", "Precondition failed", de.Message)
			p.CurrentStatus = de.State
			return p
		}
	}
	if postgres.Unavailable(err) {
		p := problem(http.StatusServiceUnavailable, "database-unavailable", "Database unavailable",
			"The database cannot be reached now; retry after Retry-After seconds, with the same Idempotency-Key for a command (it either did not happen or is replayed).")
		p.header = http.Header{"Retry-After": {"1"}}
		return p
	}
	return problem(http.StatusInternalServerError, "internal", "Internal error",
		"The server failed to handle the request; it has been logged with the request id.")
}

// body renders p as the bytes of a response.
func (p *Problem) body() []byte {
	b, err := json.Marshal(p)
	if err != nil { // cannot happen: Problem holds only strings and ints
		panic(err)
	}
	return b
}

// StatusClientClosedRequest is the status recorded (in the request metrics
// and the log) for a request whose answer nobody waits for any more: its
// client hung up, or its connection was closed under it (nginx's 499).
const StatusClientClosedRequest = 499

// errConnClosed marks a request whose connection was closed under it: the
// server is stopping, or (rarely, see internal/app's connLimit) the
// connection limit closed it for a new one as the request arrived.
var errConnClosed = errors.New("connection closed under the request")

// gone says why a request failed for want of anyone to answer, or "" if it
// did not: net/http cancelled its context (its client closed the
// connection), or its connection was closed under it (errConnClosed). A
// deadline of the server's own is neither.
func gone(r *http.Request, cause error) string {
	switch {
	case errors.Is(cause, errConnClosed):
		return "connection closed under request"
	case errors.Is(cause, context.Canceled) && errors.Is(r.Context().Err(), context.Canceled):
		return "client closed request"
	}
	return ""
}

// goneLines bounds the warn lines of requests nobody waits for: any client
// can cause one per request (a read that waits, and a hang-up), which let
// one tenant write a line per request at its full rate. Each tenant has its
// own few lines a second, so one cannot crowd out the others' either. The
// 499s of the request metrics count every one.
var goneLines = &logSampler{perSecond: 50, perTenant: 5}

// logSampler lets through at most perSecond lines in each second, at most
// perTenant of them of one tenant, and counts the ones it holds back.
type logSampler struct {
	perSecond, perTenant int

	mu         sync.Mutex
	second     int64          // the unix second being counted
	n          int            // lines let through in it
	tenants    map[string]int // of them, by tenant
	suppressed int64          // lines held back since the last one let through
}

// allow reports whether a line of tenant may be written at now and, if so,
// how many were held back since the last one.
func (s *logSampler) allow(tenant string, now time.Time) (bool, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sec := now.Unix(); sec != s.second || s.tenants == nil {
		s.second, s.n, s.tenants = sec, 0, map[string]int{}
	}
	if s.n >= s.perSecond || s.tenants[tenant] >= s.perTenant {
		s.suppressed++
		return false, 0
	}
	s.n++
	s.tenants[tenant]++
	suppressed := s.suppressed
	s.suppressed = 0
	return true, suppressed
}

// writeProblem sends p, logging server-side failures with their cause. A
// failure because nobody waits for the answer is not one: it is recorded as
// 499 and logged at warn, at most goneLines' rate (a server slow enough
// that clients give up shows there, and in the 499s of the request
// metrics, not as 5xx).
func writeProblem(w http.ResponseWriter, r *http.Request, logger *slog.Logger, p *Problem, cause error) {
	if p.Status >= 500 && errors.Is(context.Cause(r.Context()), errRequestTimeout) {
		// Our own deadline (Deps.RequestTimeout), whatever the error that
		// met it says (a context error, a statement cancelled under it):
		// the database did not serve the request in time.
		logger.WarnContext(r.Context(), "request timed out", "request_id", requestID(r.Context()), "method", r.Method, "path", r.URL.Path, "err", cause)
		p = problem(http.StatusServiceUnavailable, "database-unavailable", "Database unavailable",
			"The database did not finish this request in time (a lock held by another session, or a server that stalls); retry after Retry-After seconds, with the same Idempotency-Key for a command (it either did not happen or is replayed).")
		p.header = http.Header{"Retry-After": {"1"}}
	} else if p.Status >= 500 {
		if why := gone(r, cause); why != "" {
			if ok, suppressed := goneLines.allow(tenantOf(r), time.Now()); ok {
				logger.WarnContext(r.Context(), why, "request_id", requestID(r.Context()), "tenant_id", tenantOf(r), "method", r.Method, "path", r.URL.Path,
					"err", cause, "suppressed_since_last", suppressed)
			}
			p.Type, p.Title, p.Status = ProblemBase+"client-closed-request", "Client closed request", StatusClientClosedRequest
			p.Detail = "The request ended before its answer: its client closed the connection, or the connection was closed under it."
		} else {
			logger.ErrorContext(r.Context(), "request failed", "request_id", requestID(r.Context()), "method", r.Method, "path", r.URL.Path, "err", cause)
		}
	}
	p.Instance = r.URL.EscapedPath() // a URI reference (RFC 9457): the path as sent, not decoded
	p.RequestID = requestID(r.Context())
	for k, v := range p.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(p.body())
}

// requestFields names the parts of a request that the canonical command's
// fields come from, as the client sent them: the version a PATCH expects
// comes from If-Match, the order's id from the path ("id"), and a patch's
// set_note / set_shipping_address (whether the field was sent) from the
// body field itself. Sorted, each once.
func requestFields(canonical []string) []string {
	var fields []string
	for _, f := range canonical {
		switch f {
		case "expected_version":
			f = "If-Match"
		case "order_id":
			f = "id"
		default:
			f = strings.TrimPrefix(f, "set_")
		}
		fields = append(fields, f)
	}
	slices.Sort(fields)
	return slices.Compact(fields)
}
