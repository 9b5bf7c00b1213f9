package httpapi

import (
	"fmt"
	"net/http"
	"sync/atomic"
)

// InFlightLimit sheds load: it admits at most Max requests at once and
// answers the rest at once with 429 problem+json and Retry-After, instead of
// queueing them. An overloaded api thus keeps its latency and its memory
// bounded (every request in flight holds a goroutine, buffers and, while it
// waits for its read model, a timer) rather than taking on every request
// that arrives and answering all of them late. A shed request did nothing
// and stored nothing (not even its Idempotency-Key): a retry runs afresh.
type InFlightLimit struct {
	slots    chan struct{}
	shed     atomic.Int64
	inFlight atomic.Int64
}

// DefaultMaxInFlight is the default limit: well above what two cores serve
// at once, well below what a flood of clients can open.
const DefaultMaxInFlight = 512

// NewInFlightLimit admits max requests at once (DefaultMaxInFlight if max ≤ 0).
func NewInFlightLimit(max int) *InFlightLimit {
	if max <= 0 {
		max = DefaultMaxInFlight
	}
	return &InFlightLimit{slots: make(chan struct{}, max)}
}

// Shed is how many requests the limit refused; InFlight how many it holds now.
func (l *InFlightLimit) Shed() int64     { return l.shed.Load() }
func (l *InFlightLimit) InFlight() int64 { return l.inFlight.Load() }

func (s *Server) limitInFlight(next http.Handler) http.Handler {
	l := s.InFlight
	if l == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case l.slots <- struct{}{}:
		default:
			l.shed.Add(1)
			p := problem(http.StatusTooManyRequests, "overloaded", "Too many requests",
				fmt.Sprintf("The server is serving its limit of %d requests at once; retry after a second (with the same Idempotency-Key).", cap(l.slots)))
			p.header = http.Header{"Retry-After": {"1"}}
			s.refuse(w, r, p)
			return
		}
		l.inFlight.Add(1)
		defer func() {
			l.inFlight.Add(-1)
			<-l.slots
		}()
		next.ServeHTTP(w, r)
	})
}

// refuse writes p for a request refused before its body was read (unknown
// token, a limit). The connection is closed after the response: otherwise
// the server would first read the unread body, so that a client trickling
// its body would get its 401 or 429 only once the whole body was in.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, p *Problem) {
	if r.Body != nil && r.Body != http.NoBody {
		if p.header == nil {
			p.header = http.Header{}
		}
		p.header.Set("Connection", "close")
	}
	writeProblem(w, r, s.Logger, p, nil)
}
