package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
)

// maxKeyLen bounds an Idempotency-Key.
const maxKeyLen = 255

// idempotencyKey reads the Idempotency-Key header: exactly one value of 1 to
// 255 printable ASCII characters. A value in double quotes (the sf-string form
// of the IETF draft) is unquoted first, so "abc" and abc are the same key.
func idempotencyKey(r *http.Request) (string, *Problem) {
	bad := func(detail string) (string, *Problem) {
		return "", problem(http.StatusBadRequest, "invalid-idempotency-key", "Invalid Idempotency-Key", detail)
	}
	values := r.Header.Values("Idempotency-Key")
	switch {
	case len(values) == 0:
		return "", problem(http.StatusBadRequest, "missing-idempotency-key", "Idempotency-Key required",
			"This request changes state: send an Idempotency-Key header with a unique value (a UUID is a good choice) and reuse it when you retry.")
	case len(values) > 1:
		return bad("Send exactly one Idempotency-Key header.")
	}
	key := values[0]
	if strings.HasPrefix(key, `"`) {
		unq, ok := parseSFString(key)
		if !ok {
			return bad(`The quoted Idempotency-Key is not a valid structured-field string.`)
		}
		key = unq
	} else if strings.Contains(key, ",") {
		// Two header lines folded into one by a proxy, or a list: never a
		// key. (A key with a comma must be sent as a quoted string.)
		return bad("Send exactly one Idempotency-Key; to use a comma in a key, send it as a quoted string.")
	}
	switch {
	case key == "":
		return bad("The Idempotency-Key is empty.")
	case len(key) > maxKeyLen:
		return bad("The Idempotency-Key must be at most 255 characters.")
	case !printableASCII(key):
		return bad("The Idempotency-Key must consist of printable ASCII characters.")
	}
	return key, nil
}

// parseSFString decodes an RFC 8941 sf-string item: "…" with \" and \\
// escapes, optionally followed by parameters (";name=value…"), which carry
// no meaning for a key and are ignored. Anything else after it is invalid.
func parseSFString(s string) (string, bool) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			if i+1 == len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
				return "", false
			}
			i++
			b.WriteByte(s[i])
		case '"':
			rest := s[i+1:]
			return b.String(), rest == "" || rest[0] == ';' && !strings.Contains(rest, ",")
		default:
			b.WriteByte(c)
		}
	}
	return "", false // no closing quote
}

// keyWait is how long this request may wait for an in-flight request with its
// key: the server's bound, or less if the client asks with "Prefer: wait=N"
// (RFC 7240).
func (s *Server) keyWait(r *http.Request) time.Duration {
	if d, ok := preferWait(r); ok {
		return min(d, s.KeyWait)
	}
	return s.KeyWait
}

// preferWait reads "Prefer: wait=N" (seconds), if the request has it.
func preferWait(r *http.Request) (time.Duration, bool) {
	for _, v := range r.Header.Values("Prefer") {
		for pref := range strings.SplitSeq(v, ",") {
			name, val, ok := strings.Cut(strings.TrimSpace(pref), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			digits := strings.Trim(strings.TrimSpace(val), `"`)
			if n, err := strconv.ParseUint(digits, 10, 64); err == nil {
				// A longer wait than any bound is a wish for the longest
				// (each caller takes the min with its own bound); it used to
				// get the default, shorter than wait=10's.
				return time.Duration(min(n, 3600)) * time.Second, true
			} else if errors.Is(err, strconv.ErrRange) {
				return 3600 * time.Second, true
			}
		}
	}
	return 0, false
}

// writeKeyed writes the (stored or fresh) response of a keyed command, or
// the problem for its error.
func (s *Server) writeKeyed(w http.ResponseWriter, r *http.Request, res command.Result, err error) {
	if err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	h := w.Header()
	for k, v := range res.Header {
		h.Set(k, v)
	}
	if res.Replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	if !res.ExpiresAt.IsZero() { // a 404 is not stored
		h.Set("Idempotency-Key-Expires", res.ExpiresAt.UTC().Format(http.TimeFormat))
	}
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
}

// storedHeaders are the response headers that describe a result; only these
// are stored and replayed (never cookies, auth or hop-by-hop headers).
var storedHeaders = []string{"Content-Type", "Location", "ETag"}

// jsonResponse renders a result to store and send.
func jsonResponse(status int, v any, header map[string]string) (command.Response, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return command.Response{}, err
	}
	h := map[string]string{"Content-Type": "application/json"}
	for _, k := range storedHeaders {
		if v, ok := header[k]; ok {
			h[k] = v
		}
	}
	return command.Response{Status: status, Header: h, Body: b}, nil
}

// refusal renders a domain refusal (invalid, not found, conflict, …) of an
// executed command to store and send; any other error is returned as is, so
// it rolls the transaction back and is never stored.
func refusal(r *http.Request, err error) (command.Response, error) {
	if domain.KindOf(err) == "" {
		return command.Response{}, err
	}
	p := problemFor(err)
	p.Instance = r.URL.EscapedPath() // a URI reference (RFC 9457): the path as sent, not decoded
	p.RequestID = requestID(r.Context())
	h := map[string]string{"Content-Type": "application/problem+json"}
	if p.ResourceID != "" {
		h["Location"] = orderLocation(p.ResourceID)
	}
	resp := command.Response{Status: p.Status, Header: h, Body: p.body()}
	if de := (*domain.Error)(nil); errors.As(err, &de) && de.RetryAfter > 0 {
		// Refused for now (a payment settling): said so, never stored.
		h["Retry-After"], resp.Unstored = p.header.Get("Retry-After"), true
	}
	if errors.Is(err, domain.ErrKeyRanBefore) {
		// The key ran before its record expired (a late retry): answered
		// from the order each time, never stored, so that no other
		// request under the key takes it over, and what the step wrote
		// now is rolled back.
		resp.Unstored = true
	}
	if errors.Is(err, domain.ErrAmountNotChargeable) {
		// Bad input found only once the order is read: like any other
		// it writes nothing, not even the key (a retry is refused again:
		// an order's total never changes).
		resp.Unstored = true
	}
	return resp, nil
}
