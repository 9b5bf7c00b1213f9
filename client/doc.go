// Package client is the Go client of the orders service's REST API (/v1).
//
// It makes safe retries the default. Every call that changes state
// (CreateOrder, PayOrder, ShipOrder, CancelOrder, RefundOrder, UpdateOrder) is one
// logical call: it gets one Idempotency-Key, a fresh UUIDv7 unless the
// caller passes WithIdempotencyKey, and its body is encoded once. The call
// is sent again, with the same key and the same body bytes, after a network
// error (including a response lost after the server committed, or a 2xx
// whose body is cut short or is not the answer's JSON), a 5xx, a
// 408 body-timeout, a 409 idempotency-key-in-flight or any other 409 with
// Retry-After (a refusal for now, which the server does not store) and a
// 429, waiting a full-jitter exponential
// backoff (at least the server's Retry-After), until it has a definitive
// answer, Config.MaxAttempts attempts were made, or the context ends. The
// server stores the first execution's answer under the key, so however many
// attempts it takes, the call has its effect once (one order per
// CreateOrder) and returns that answer. Reads are retried the same way,
// without a key. Any other 4xx is a definitive answer and is never retried.
// A redirect that would change the method (net/http follows a 301, 302 or
// 303 with a GET, without the body) is never taken for the call's answer:
// the default HTTP client does not follow it (the 3xx is the answer), and
// with one that does, the call fails at once. Nor does the default client
// follow a redirect to another origin (scheme, host or port): the token,
// the key and the command go to no one else. A Retry-After that is neither
// seconds nor a date is ignored; one past MaxRetryAfter ends the call.
//
// A refusal is returned as a *Problem (RFC 9457 problem details): branch on
// it with errors.As, or with IsMismatch, IsViewBehind, IsConflict,
// IsNotFound, IsValidation, IsPreconditionFailed and IsInFlight. A conflict
// that points at an existing resource (a late retry of an expired key)
// carries its Location and ResourceID.
//
// Read models are updated asynchronously; WaitForVersion (or GetOrder with
// WithMinVersion) reads your own write: pass the Version a command
// returned. WaitForSummary does so for a customer's summary.
//
// To reconcile a call whose outcome is unknown (the context ended while it
// was retried), keep its key (WithMeta reports it) and ask
// IdempotencyKey, or call again with WithIdempotencyKey and the same
// arguments.
package client
