package httpapi

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Defaults of TenantLimitConfig: a tenant may use an eighth of the global
// in-flight limit (DefaultMaxInFlight), so no single tenant can fill it.
const (
	// DefaultTenantMaxInFlight is the most /v1 requests of one tenant served
	// at once.
	DefaultTenantMaxInFlight = 64
	// DefaultTenantMaxWaiting is the most read-your-writes reads (with
	// min_version or min_position) of one tenant in flight at once; they
	// count towards the in-flight limit too.
	DefaultTenantMaxWaiting = 16
	// DefaultTenantRate is the sustained request rate of one tenant, per
	// second, and DefaultTenantBurst the bucket of its token-bucket limit:
	// above what one api process on two cores creates (about 800 orders a
	// second), so a single busy tenant is bound by capacity, not by policy;
	// set them lower where many tenants share a deployment.
	DefaultTenantRate  = 1000.0
	DefaultTenantBurst = 2000
	// DefaultMaxTenants bounds the tenants whose limits are kept in memory.
	DefaultMaxTenants = 10_000
	// DefaultTenantIdleAfter is how long a tenant without requests keeps its
	// state (and its token bucket) before it is forgotten.
	DefaultTenantIdleAfter = 5 * time.Minute
	// DefaultTenantBytesPerToken is what a request's body and response may
	// hold for the one token it took: every further DefaultTenantBytesPerToken
	// bytes cost one more token, taken once the response is written.
	DefaultTenantBytesPerToken = 16 << 10
)

// TenantLimitConfig sets the per-tenant limits. Zero fields take the defaults.
type TenantLimitConfig struct {
	MaxInFlight int     // requests at once (DefaultTenantMaxInFlight)
	MaxWaiting  int     // read-your-writes reads at once (DefaultTenantMaxWaiting, at most MaxInFlight)
	Rate        float64 // requests per second (DefaultTenantRate)
	Burst       int     // token bucket size (DefaultTenantBurst)
	MaxTenants  int     // tenants kept in memory (DefaultMaxTenants)
	// IdleAfter is how long an idle tenant's state is kept (DefaultTenantIdleAfter).
	IdleAfter time.Duration
	// BytesPerToken prices a request by its bytes (DefaultTenantBytesPerToken):
	// a request takes one token, and one more per BytesPerToken bytes of its
	// body read and its response written (at most Burst), taken after it
	// is sent, so that the
	// tenant's next requests wait for them. Requests are not alike: a page
	// of a hundred orders of a hundred items each is a megabyte of JSON,
	// a thousand times the work of a one-order read, and a tenant asking
	// for such pages within its request rate took both cores from the
	// others (a quiet tenant's read went from 0.7 to 311 ms at its p99).
	// Bodies likewise: 28 one-MiB creates a second, refused, took a quiet
	// tenant's read from 1 to 915 ms at its median.
	BytesPerToken int
}

func (c *TenantLimitConfig) validate() error {
	switch {
	case c.MaxInFlight < 0:
		return fmt.Errorf("tenant limits: MaxInFlight must not be negative, got %d", c.MaxInFlight)
	case c.MaxWaiting < 0:
		return fmt.Errorf("tenant limits: MaxWaiting must not be negative, got %d", c.MaxWaiting)
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("tenant limits: Rate must be a positive number, got %v", c.Rate)
	case c.Burst < 0:
		return fmt.Errorf("tenant limits: Burst must not be negative, got %d", c.Burst)
	case c.MaxTenants < 0:
		return fmt.Errorf("tenant limits: MaxTenants must not be negative, got %d", c.MaxTenants)
	case c.IdleAfter < 0:
		return fmt.Errorf("tenant limits: IdleAfter must not be negative, got %s", c.IdleAfter)
	case c.BytesPerToken < 0:
		return fmt.Errorf("tenant limits: BytesPerToken must not be negative, got %d", c.BytesPerToken)
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultTenantMaxInFlight
	}
	if c.MaxWaiting == 0 {
		c.MaxWaiting = min(DefaultTenantMaxWaiting, c.MaxInFlight)
	}
	if c.MaxWaiting > c.MaxInFlight {
		return fmt.Errorf("tenant limits: MaxWaiting (%d) must not exceed MaxInFlight (%d)", c.MaxWaiting, c.MaxInFlight)
	}
	if c.Rate == 0 {
		c.Rate = DefaultTenantRate
	}
	if c.Burst == 0 {
		c.Burst = DefaultTenantBurst
	}
	if c.MaxTenants == 0 {
		c.MaxTenants = DefaultMaxTenants
	}
	if c.IdleAfter == 0 {
		c.IdleAfter = DefaultTenantIdleAfter
	}
	if c.BytesPerToken == 0 {
		c.BytesPerToken = DefaultTenantBytesPerToken
	}
	return nil
}

// TenantLimits sheds one tenant's excess so that other tenants are served:
// each tenant has a token bucket of requests, a limit of requests in flight
// and a smaller one of read-your-writes reads in flight (those may wait up
// to MaxReadWait for a read model). A request past any of them is answered
// at once with 429 problem+json and Retry-After, having done nothing. The
// state is kept per authenticated tenant only, and bounded: idle tenants are
// forgotten after IdleAfter, and when MaxTenants are kept.
type TenantLimits struct {
	cfg TenantLimitConfig

	mu        sync.Mutex
	tenants   map[string]*tenantState
	lastSweep time.Time
	inFlight  int // sum over tenants
	waiting   int

	rateLimited, overloaded atomic.Int64
}

type tenantState struct {
	bucket            *rate.Limiter
	inFlight, waiting int
	lastUsed          time.Time
}

// TenantLimitStats describes the limits now and since start.
type TenantLimitStats struct {
	RateLimited int64 // requests shed by a tenant's rate
	Overloaded  int64 // requests shed by a tenant's in-flight or waiting limit
	Tenants     int   // tenants kept in memory
	InFlight    int   // requests in flight, all tenants
	Waiting     int   // read-your-writes reads in flight, all tenants
}

// NewTenantLimits returns the limits of cfg, or an error naming a bad field.
func NewTenantLimits(cfg TenantLimitConfig) (*TenantLimits, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &TenantLimits{cfg: cfg, tenants: make(map[string]*tenantState), lastSweep: time.Now()}, nil
}

// Config returns the limits in force (defaults filled in).
func (l *TenantLimits) Config() TenantLimitConfig { return l.cfg }

// Stats returns the counters.
func (l *TenantLimits) Stats() TenantLimitStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return TenantLimitStats{
		RateLimited: l.rateLimited.Load(), Overloaded: l.overloaded.Load(),
		Tenants: len(l.tenants), InFlight: l.inFlight, Waiting: l.waiting,
	}
}

// shed is why a request was refused, with the seconds to retry after.
type shed struct {
	kind, detail string
	retryAfter   int
}

// admit takes a slot of tenant (and a waiting slot if waits), or says why
// not. release must be called once when the request ends, with the bytes
// its response held (see BytesPerToken).
func (l *TenantLimits) admit(tenant string, waits bool) (release func(written int64), refused *shed) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.state(tenant, now)
	if st == nil {
		l.overloaded.Add(1)
		return nil, &shed{kind: "tenant-overloaded", retryAfter: 1,
			detail: "The server is tracking its limit of tenants, all busy; retry after a second."}
	}
	st.lastUsed = now
	res := st.bucket.ReserveN(now, 1)
	if d := res.DelayFrom(now); !res.OK() || d > 0 {
		res.CancelAt(now)
		l.rateLimited.Add(1)
		return nil, &shed{kind: "tenant-rate-limited", retryAfter: max(1, int(math.Ceil(d.Seconds()))),
			detail: fmt.Sprintf("Your tenant is past its rate of %g requests per second (bursts of %d); retry after the time in Retry-After.", l.cfg.Rate, l.cfg.Burst)}
	}
	if st.inFlight >= l.cfg.MaxInFlight {
		l.overloaded.Add(1)
		return nil, &shed{kind: "tenant-overloaded", retryAfter: 1,
			detail: fmt.Sprintf("Your tenant has its limit of %d requests in flight; retry after a second (with the same Idempotency-Key).", l.cfg.MaxInFlight)}
	}
	if waits && st.waiting >= l.cfg.MaxWaiting {
		l.overloaded.Add(1)
		return nil, &shed{kind: "tenant-overloaded", retryAfter: 1,
			detail: fmt.Sprintf("Your tenant has its limit of %d reads with min_version or min_position in flight; retry after a second, or read without waiting.", l.cfg.MaxWaiting)}
	}
	st.inFlight++
	l.inFlight++
	if waits {
		st.waiting++
		l.waiting++
	}
	return func(written int64) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if extra := written / int64(l.cfg.BytesPerToken); extra > 0 {
			// Owed, not asked: the bucket may go below zero, and the
			// tenant's next requests wait until it is paid back.
			st.bucket.ReserveN(time.Now(), int(min(extra, int64(l.cfg.Burst))))
		}
		st.inFlight--
		l.inFlight--
		if waits {
			st.waiting--
			l.waiting--
		}
		st.lastUsed = time.Now()
	}, nil
}

// state returns tenant's state, making it if need be; nil if MaxTenants are
// kept and all of them are busy. l.mu is held.
func (l *TenantLimits) state(tenant string, now time.Time) *tenantState {
	if st, ok := l.tenants[tenant]; ok {
		return st
	}
	if now.Sub(l.lastSweep) > l.cfg.IdleAfter || len(l.tenants) >= l.cfg.MaxTenants {
		l.sweep(now, l.cfg.IdleAfter)
	}
	if len(l.tenants) >= l.cfg.MaxTenants {
		// Forget tenants with nothing in flight, however recent. (Their
		// buckets start full again: a cost only with more than MaxTenants
		// live tenants.)
		l.sweep(now, 0)
	}
	if len(l.tenants) >= l.cfg.MaxTenants {
		return nil
	}
	st := &tenantState{bucket: rate.NewLimiter(rate.Limit(l.cfg.Rate), l.cfg.Burst), lastUsed: now}
	l.tenants[tenant] = st
	return st
}

// sweep forgets the tenants with nothing in flight that were idle for at
// least idle. l.mu is held.
func (l *TenantLimits) sweep(now time.Time, idle time.Duration) {
	l.lastSweep = now
	for t, st := range l.tenants {
		if st.inFlight == 0 && now.Sub(st.lastUsed) >= idle {
			delete(l.tenants, t)
		}
	}
}

// waitsForReadModel reports whether r is a read-your-writes read, which may
// wait for a read model: a GET with min_version or min_position.
func waitsForReadModel(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	raw := r.URL.RawQuery
	if !strings.Contains(raw, "min_") && !strings.Contains(raw, "%") {
		return false // the usual case, without parsing anything
	}
	if queryParams(raw) > maxQueryParams {
		return false // refused before it waits (singleQueryValues), once admitted
	}
	q := r.URL.Query()
	return q.Has("min_version") || q.Has("min_position")
}

// limitTenant applies the caller's tenant limits; it runs after
// authenticate, before any shared slot is taken.
func (s *Server) limitTenant(next http.Handler) http.Handler {
	l := s.Tenants
	if l == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, refused := l.admit(tenantOf(r), waitsForReadModel(r))
		if refused != nil {
			p := problem(http.StatusTooManyRequests, refused.kind, "Too many requests", refused.detail)
			p.header = http.Header{"Retry-After": {strconv.Itoa(refused.retryAfter)}}
			s.refuse(w, r, p)
			return
		}
		cw := &countingWriter{ResponseWriter: w}
		// Priced as its response, its target (a query string may run to
		// the header limit, 64 KiB, parsed and checked each time) and its
		// body (up to 1 MiB, read, checked and walked, whatever its answer).
		var body *countingReader
		if r.Body != nil && r.Body != http.NoBody {
			body = &countingReader{ReadCloser: r.Body}
			r.Body = body
		}
		defer func() {
			n := cw.written + int64(len(r.RequestURI))
			if body != nil {
				n += body.read
			}
			release(n)
		}()
		next.ServeHTTP(cw, r)
	})
}

// countingWriter counts the bytes of a response body.
type countingWriter struct {
	http.ResponseWriter
	written int64
}

func (w *countingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.written += int64(n)
	return n, err
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// countingReader counts the bytes read of a request body.
type countingReader struct {
	io.ReadCloser
	read int64
}

func (r *countingReader) Read(b []byte) (int, error) {
	n, err := r.ReadCloser.Read(b)
	r.read += int64(n)
	return n, err
}
