package domain

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrorKind classifies a domain error so that adapters can map it to their own
// codes (HTTP status, exit status) with one table, without parsing messages.
type ErrorKind string

// The error kinds. Every error that leaves the domain or the command and query
// handlers on purpose is an *Error of one of these kinds; anything else is an
// internal failure.
const (
	// KindInvalid: the input breaks a rule; Fields says which.
	KindInvalid ErrorKind = "invalid"
	// KindNotFound: the addressed resource does not exist (for this tenant).
	KindNotFound ErrorKind = "not_found"
	// KindConflict: the request is well formed but clashes with the current state.
	KindConflict ErrorKind = "conflict"
	// KindPreconditionFailed: a precondition supplied by the caller (such as a
	// version) no longer holds.
	KindPreconditionFailed ErrorKind = "precondition_failed"
)

// FieldError names one field of the input and what is wrong with it. Field is a
// JSON path such as "items[2].quantity".
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// Error is the domain's error type. Use errors.As to get at it; KindOf reads the
// kind of any error.
type Error struct {
	Kind    ErrorKind
	Message string
	// Fields lists the offending fields of a KindInvalid error.
	Fields []FieldError
	// ResourceID identifies the existing resource a KindConflict error refers
	// to, when there is one (for example the order a reused key created).
	ResourceID string
	// State is the resource's current state, for a KindConflict or
	// KindPreconditionFailed error (for example the order's status).
	State string
	// RetryAfter, for a KindConflict error, says the state that refuses the
	// command passes by itself (a payment in progress settles): the same
	// command may succeed after about this long. Such a refusal is answered
	// with Retry-After and never stored under an Idempotency-Key, so a
	// retry with the same key runs again.
	RetryAfter time.Duration
	// Err, when set, is a sentinel that says more precisely what was
	// refused (such as ErrAmountNotChargeable); errors.Is finds it.
	Err error
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// ErrAmountNotChargeable is wrapped by the KindInvalid *Error of Order.Pay
// for an order whose total no provider charge can be: 0 (nothing to
// charge), or above MaxChargeAmount.
var ErrAmountNotChargeable = errors.New("amount not chargeable")

// ErrKeyRanBefore is wrapped by the KindConflict *Error of a command whose
// Idempotency-Key ran before, on the same resource, after the key's record
// expired: a create whose key created an order, a pay or update whose key
// changed the order. It is never stored under the key: each late retry is
// answered from the resource anew.
var ErrKeyRanBefore = errors.New("idempotency key ran before")

func (e *Error) Error() string {
	if len(e.Fields) == 0 {
		return e.Message
	}
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Field + ": " + f.Detail
	}
	return e.Message + ": " + strings.Join(parts, "; ")
}

// Errorf returns an *Error of the given kind with a formatted message.
func Errorf(kind ErrorKind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// KindOf returns the kind of err, or "" if err is not (or does not wrap) an *Error.
func KindOf(err error) ErrorKind {
	var de *Error
	if errors.As(err, &de) {
		return de.Kind
	}
	return ""
}

// fieldErrors collects the rule violations of one input, so that a client sees
// all of them at once instead of one per attempt.
type fieldErrors []FieldError

func (fe *fieldErrors) add(field, format string, args ...any) {
	*fe = append(*fe, FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
}

// err returns nil when nothing was added, else a KindInvalid *Error.
func (fe fieldErrors) err(message string) error {
	if len(fe) == 0 {
		return nil
	}
	return &Error{Kind: KindInvalid, Message: message, Fields: fe}
}
