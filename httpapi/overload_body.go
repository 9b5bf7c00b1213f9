package httpapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// DefaultBodyTimeout bounds how long a request body may take to arrive,
// counted from when the handler starts reading it: a client trickling its
// body holds its slot that long at most.
const DefaultBodyTimeout = 5 * time.Second

// bodyDeadline sets, for every request that has a body, a read deadline
// BodyTimeout from now: on every path, before anything else runs. Without
// it only /v1's readBody bounded a body, and a body nobody reads (on
// /healthz, /openapi.json, an unknown path, or a /v1 request refused
// before readBody, such as a 401) was discarded by net/http under the
// server's ReadTimeout alone: a client trickling it held its connection,
// and its connection slot, 30 s. With the deadline the discard ends when
// the body is late, and net/http closes the connection (a body that is
// in by then is discarded as before, and the connection kept). readBody
// sets its own deadline when it begins to read, so a /v1 request waiting
// for its limits loses none of its time; each request on a connection
// starts with the server's own deadlines again.
//
// Outside /v1 no route reads a body, so a request with one gets a read
// deadline of now and Connection: close: net/http's discard of the body
// after the answer ends at once, and the connection is closed. Discarding a trickled body held an
// active connection up to BodyTimeout, which the connection limit never
// closes for a new one: 1,100 anonymous connections trickling bodies to
// /healthz (about 220 new ones a second) kept every tenant's new
// connections waiting about 4 s in the accept queue (an audit).
func (s *Server) bodyDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			deadline, unread := time.Now().Add(s.BodyTimeout), !strings.HasPrefix(r.URL.Path, "/v1/")
			if unread {
				deadline = time.Now() // the discard after the answer ends at once
				w.Header().Set("Connection", "close")
			}
			err := http.NewResponseController(w).SetReadDeadline(deadline)
			if err != nil && !errors.Is(err, http.ErrNotSupported) {
				writeProblem(w, r, s.Logger, problemFor(err), connErr(err))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// readBody reads a request's whole body (up to one byte past
// maxBodyBytes) before the handler runs, under a read deadline of
// BodyTimeout. A body that does not arrive in time gets 408 problem+json and
// the connection is closed; one that cannot be read gets 400 and is closed
// too. A body longer than maxBodyBytes gets 413 here, with Connection: close
// and the deadline left in place: net/http would otherwise discard the unread
// rest before it answers (up to 256 KiB, or a whole chunked body, with no
// deadline once we had cleared it), so a client that sent one byte too many
// and went silent held a goroutine and a socket forever. Only a body read to
// its end within the limit clears the deadline, so the handler may take its
// time. Without the deadline a trickling body (a byte every few seconds)
// would hold its goroutine and its slots until the server's whole
// ReadTimeout.
func (s *Server) readBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		if r.ContentLength > maxBodyBytes {
			// Declared too long: 413 at once, not after waiting for a
			// body that would be refused anyway (or a 408 when it never
			// comes), and close rather than drain it.
			writeProblem(w, r, s.Logger, tooLargeClose(), nil)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(s.BodyTimeout)); err != nil {
			if !errors.Is(err, http.ErrNotSupported) {
				writeProblem(w, r, s.Logger, problemFor(err), connErr(err))
				return
			}
			// A writer without deadlines (a test recorder): no bytes arrive late.
		}
		b, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			p := problem(http.StatusRequestTimeout, "body-timeout", "Request body too slow",
				"The request body did not arrive within "+s.BodyTimeout.String()+"; send it at once and retry (with the same Idempotency-Key).")
			p.header = http.Header{"Connection": {"close"}}
			writeProblem(w, r, s.Logger, p, nil)
			return
		case errors.Is(err, net.ErrClosed):
			// The connection was closed under the request: nobody to answer.
			writeProblem(w, r, s.Logger, problemFor(err), connErr(err))
			return
		case err != nil:
			// Where the body ends on the wire is unknown: close.
			p := problem(http.StatusBadRequest, "unreadable-body", "Unreadable body",
				"The request body could not be read: "+err.Error()+".")
			p.header = http.Header{"Connection": {"close"}}
			writeProblem(w, r, s.Logger, p, nil)
			return
		case len(b) > maxBodyBytes:
			// The rest is not read: close the connection rather than
			// drain it, and keep the deadline, which bounds the drain
			// net/http still attempts when it closes the body.
			writeProblem(w, r, s.Logger, tooLargeClose(), nil)
			return
		}
		// The body is in, to its end; the rest of the request may take
		// its time.
		if err := rc.SetReadDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
			writeProblem(w, r, s.Logger, problemFor(err), connErr(err))
			return
		}
		r.Body = &bodyBytes{Reader: bytes.NewReader(b), b: b}
		next.ServeHTTP(w, r)
	})
}

// bodyBytes is a request body readBody has read whole: decodeJSON takes its
// bytes rather than copying them again.
type bodyBytes struct {
	*bytes.Reader
	b []byte
}

func (*bodyBytes) Close() error { return nil }

// tooLargeClose is tooLarge with Connection: close: the rest of the body
// is not read.
func tooLargeClose() *Problem {
	p := tooLarge()
	p.header = http.Header{"Connection": {"close"}}
	return p
}

// connErr marks a failure to set a deadline on a connection that is closed
// already (errConnClosed): its request has nobody to answer.
func connErr(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("%w: %w", errConnClosed, err)
	}
	return err
}
