package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ProblemBase prefixes every problem type of the API.
const ProblemBase = "https://orders.acme.example/problems/"

// Problem types a caller branches on (see the README's Errors section for
// the full list). Compare them with Problem.Type, or use the Is… helpers.
const (
	TypeValidationFailed    = ProblemBase + "validation-failed"
	TypeMalformedRequest    = ProblemBase + "malformed-request"
	TypeNotFound            = ProblemBase + "not-found"
	TypeConflict            = ProblemBase + "conflict"
	TypePreconditionFailed  = ProblemBase + "precondition-failed"
	TypeIfMatchRequired     = ProblemBase + "if-match-required"
	TypeViewBehind          = ProblemBase + "view-behind"
	TypeVersionNotWritten   = ProblemBase + "version-not-written"
	TypeKeyMismatch         = ProblemBase + "idempotency-key-mismatch"
	TypeAmountNotChargeable = ProblemBase + "amount-not-chargeable"
	TypeKeyInFlight         = ProblemBase + "idempotency-key-in-flight"
	TypeKeyQuotaExceeded    = ProblemBase + "idempotency-quota-exceeded"
	TypeUnauthorized        = ProblemBase + "unauthorized"
)

// Problem is an error answer of the API: an RFC 9457 problem detail, plus
// what its headers said. An answer that is not problem+json (say, a 502
// from a proxy) becomes a Problem of type "about:blank" with its status.
// Find it in any error of this package with errors.As.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Errors lists the offending fields of a validation problem.
	Errors []FieldError `json:"errors,omitempty"`
	// MismatchedFields names the request fields that differ from the
	// request the Idempotency-Key was first used with.
	MismatchedFields []string `json:"mismatched_fields,omitempty"`
	// FirstUsedFor names the method and route the Idempotency-Key was
	// first used for, when this request reused it on another.
	FirstUsedFor string `json:"first_used_for,omitempty"`
	// ResourceID identifies the existing order a conflict refers to.
	ResourceID string `json:"resource_id,omitempty"`
	// CurrentStatus is the order's status when a step was refused.
	CurrentStatus string `json:"current_status,omitempty"`
	// CurrentVersion is how far a read model has got, when it is behind.
	CurrentVersion *int64 `json:"current_version,omitempty"`
	RequestID      string `json:"request_id,omitempty"`

	// Location is the Location header: the existing order of a conflict.
	Location string `json:"-"`
	// RetryAfter is the Retry-After header (0 if absent).
	RetryAfter time.Duration `json:"-"`
	// retryAfterSet is whether the answer had a Retry-After header (one
	// of 0, or a date past, is still the server's "retry").
	retryAfterSet bool
}

// FieldError names one offending field of a request and what is wrong.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// Error says the status, the kind and the detail.
func (p *Problem) Error() string {
	s := strconv.Itoa(p.Status) + " " + p.Kind()
	if p.Detail != "" {
		s += ": " + p.Detail
	} else if p.Title != "" {
		s += ": " + p.Title
	}
	for _, f := range p.Errors {
		s += fmt.Sprintf(" [%s: %s]", f.Field, f.Detail)
	}
	if len(p.MismatchedFields) > 0 {
		s += " [mismatched: " + strings.Join(p.MismatchedFields, ", ") + "]"
	}
	return s
}

// Kind is the last segment of Type (e.g. "conflict"), or Type itself for a
// type of another origin.
func (p *Problem) Kind() string {
	if k, ok := strings.CutPrefix(p.Type, ProblemBase); ok {
		return k
	}
	return p.Type
}

// newProblem reads a non-2xx answer.
func newProblem(res response) *Problem {
	p := &Problem{}
	if mt, _, _ := mime.ParseMediaType(res.header.Get("Content-Type")); mt == "application/problem+json" {
		if err := json.Unmarshal(res.body, p); err != nil {
			p = &Problem{Detail: "unreadable problem+json: " + err.Error()}
		}
	}
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(res.status)
	}
	p.Status = res.status // the header wins over the body
	p.Location = res.header.Get("Location")
	p.RetryAfter, p.retryAfterSet = retryAfter(res.header.Get("Retry-After"))
	return p
}

// retryAfter reads Retry-After: seconds or an HTTP date. ok is false when
// there is none, or none that reads as either (a proxy's garbage does not
// make a final answer retryable).
func retryAfter(v string) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if strings.Trim(v, "0123456789") == "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > math.MaxInt64/int64(time.Second) { // past 292 years: wait "forever", never wrap to a short or negative wait
			return math.MaxInt64, true
		}
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t)), true
	}
	return 0, false
}

// AsProblem returns the *Problem in err's chain, or nil.
func AsProblem(err error) *Problem {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	return nil
}

func isType(err error, typ string) bool {
	p := AsProblem(err)
	return p != nil && p.Type == typ
}

// IsMismatch reports whether err is a 422 idempotency-key-mismatch: the key
// was first used with a different request (MismatchedFields names the
// fields). Use a new key for a new request.
func IsMismatch(err error) bool { return isType(err, TypeKeyMismatch) }

// IsViewBehind reports whether err is a 412 view-behind: the read model had
// not reached the asked version in time (CurrentVersion says where it is).
// Nothing is wrong with the request; WaitForVersion retries it.
func IsViewBehind(err error) bool { return isType(err, TypeViewBehind) }

// IsVersionNotWritten reports whether err is a 412 version-not-written:
// the order itself was more than one version short of the asked version,
// so waiting longer does not help (WaitForVersion stops).
func IsVersionNotWritten(err error) bool { return isType(err, TypeVersionNotWritten) }

// IsConflict reports whether err is a 409 conflict: a step the order can
// no longer take (CurrentStatus), or a late retry of an expired key that
// created or changed an order (a create, pay or update: ResourceID and
// Location name it; see ConflictLocation).
func IsConflict(err error) bool { return isType(err, TypeConflict) }

// ConflictLocation returns the Location and resource id of the existing
// order a conflict points at; ok is false if err is no such conflict.
func ConflictLocation(err error) (location, resourceID string, ok bool) {
	p := AsProblem(err)
	if p == nil || p.Type != TypeConflict || p.ResourceID == "" {
		return "", "", false
	}
	return p.Location, p.ResourceID, true
}

// IsNotFound reports whether err is a 404 (no such order for this tenant).
func IsNotFound(err error) bool { return isType(err, TypeNotFound) }

// IsValidation reports whether err is a 422 validation-failed (Errors
// lists every offending field).
func IsValidation(err error) bool { return isType(err, TypeValidationFailed) }

// IsPreconditionFailed reports whether err is a 412 precondition-failed
// (the If-Match version is not the order's current one) or a 428
// if-match-required.
func IsPreconditionFailed(err error) bool {
	return isType(err, TypePreconditionFailed) || isType(err, TypeIfMatchRequired)
}

// IsInFlight reports whether err is a 409 idempotency-key-in-flight: the
// call gave up (attempts or context) while the key's first request was
// still running. Its outcome is unknown: retry with the same key.
func IsInFlight(err error) bool { return isType(err, TypeKeyInFlight) }
