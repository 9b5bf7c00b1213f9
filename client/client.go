package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Defaults of Config.
const (
	// DefaultMaxAttempts bounds the attempts of one logical call.
	DefaultMaxAttempts = 8
	// DefaultMinBackoff is the backoff cap of the first retry; it doubles
	// with every further retry up to DefaultMaxBackoff.
	DefaultMinBackoff = 100 * time.Millisecond
	// DefaultMaxBackoff caps the backoff between two attempts (a server's
	// longer Retry-After is still honoured).
	DefaultMaxBackoff = 5 * time.Second
	// DefaultAttemptTimeout bounds one attempt of the default HTTP client:
	// a response that does not arrive in time counts as lost and the call
	// is retried with the same key. It is longer than the api's longest
	// request deadline (55 s, under its 60 s write timeout), so a request
	// the server cannot serve in time gets the server's 503 and its
	// Retry-After, and a request waiting its turn behind an in-flight one
	// with its key gets its answer, instead of being cut off first.
	DefaultAttemptTimeout = 58 * time.Second
)

// maxResponseBytes bounds a response body the client reads.
const maxResponseBytes = 8 << 20

// MaxRetryAfter is the longest Retry-After the client waits for: a longer
// one (a misconfigured proxy, or a value past what a time.Duration holds)
// ends the call with the answer that asked for it, not a retry.
const MaxRetryAfter = time.Hour

// retryAfterText names a Retry-After wait; "longer than a Duration holds" past what a Duration holds.
func retryAfterText(d time.Duration) string {
	if d == math.MaxInt64 {
		return "longer than a Duration holds"
	}
	return d.String()
}

// Config holds the settings of a Client. Zero fields take the defaults.
type Config struct {
	// HTTPClient sends the requests; nil means a client whose Timeout is
	// DefaultAttemptTimeout.
	HTTPClient *http.Client
	// MaxAttempts bounds the attempts of one logical call (1: no retries).
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the full-jitter exponential backoff:
	// before retry n the client waits a random time in
	// [0, min(MaxBackoff, MinBackoff·2^(n-1))), or the server's
	// Retry-After if that is longer.
	MinBackoff, MaxBackoff time.Duration
	// UserAgent is sent with every request, if set.
	UserAgent string
}

func (c *Config) validate() error {
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: DefaultAttemptTimeout, CheckRedirect: keepMethod}
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(DefaultMaxBackoff, c.MinBackoff)
	}
	switch {
	case c.MaxAttempts < 1:
		return fmt.Errorf("client: MaxAttempts must be at least 1, got %d", c.MaxAttempts)
	case c.MinBackoff < 0:
		return fmt.Errorf("client: MinBackoff must not be negative, got %s", c.MinBackoff)
	case c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("client: MaxBackoff (%s) must be at least MinBackoff (%s)", c.MaxBackoff, c.MinBackoff)
	}
	return nil
}

// Option changes a Config in New.
type Option func(*Config)

// WithHTTPClient sends the requests with hc (its Timeout bounds one
// attempt, not the whole call: bound that with the context).
func WithHTTPClient(hc *http.Client) Option { return func(c *Config) { c.HTTPClient = hc } }

// WithBackoff sets the bounds of the full-jitter exponential backoff.
func WithBackoff(minBackoff, maxBackoff time.Duration) Option {
	return func(c *Config) { c.MinBackoff, c.MaxBackoff = minBackoff, maxBackoff }
}

// WithMaxAttempts bounds the attempts of one logical call (1: no retries).
func WithMaxAttempts(n int) Option { return func(c *Config) { c.MaxAttempts = n } }

// WithConfig replaces the whole Config (later options still apply).
func WithConfig(cfg Config) Option { return func(c *Config) { *c = cfg } }

// Client calls the orders API as one tenant (the token's). It is safe for
// concurrent use.
type Client struct {
	base  *url.URL
	token string
	cfg   Config
}

// New returns a client of the API at baseURL (e.g. "https://orders.example"
// or "http://localhost:8080", without /v1) that authenticates with token
// (ord_…). It returns an error naming the setting that is wrong.
func New(baseURL, token string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("client: base URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q must be http(s)://host[:port]", baseURL)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.User != nil {
		// Paths are appended to it: a query or fragment would swallow them.
		return nil, fmt.Errorf("client: base URL %q must be http(s)://host[:port][/path], without query, fragment or user info", baseURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	if token == "" {
		return nil, errors.New("client: token is empty")
	}
	if !visibleASCII(token) {
		// net/http refuses to send such a header: every attempt would fail
		// before reaching the server.
		return nil, errors.New("client: token must be printable ASCII without spaces (a token read from a file: trim its newline)")
	}
	var cfg Config
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Client{base: u, token: token, cfg: cfg}, nil
}

// Meta describes how a call went; pass one with WithMeta to have it filled
// in, whether the call succeeded or not.
type Meta struct {
	// IdempotencyKey is the key every attempt of a command carried (empty
	// for reads). Keep it to reconcile a call whose outcome is unknown.
	IdempotencyKey string
	// Attempts is how many attempts the call made. net/http itself may
	// send an attempt twice (same key, same body), when the kept-alive
	// connection it chose closed before any answer.
	Attempts int
	// Status is the HTTP status of the last answer (0 if none arrived).
	Status int
	// Definitive is true when the call ended on an answer that settles it:
	// a 2xx, or a refusal that sending it again would not change (a 4xx
	// other than 408, 429 and a 409 that is in-flight or carries
	// Retry-After). False when it gave up (attempts,
	// context, a network error): its outcome is then unknown, whatever
	// Status says; retry it later with IdempotencyKey to learn it.
	Definitive bool
	// Replayed is true when the answer was the server's stored answer to an
	// earlier attempt with the key (Idempotent-Replayed: true).
	Replayed bool
	// KeyExpires is until when the server remembers the key (zero if it
	// did not say).
	KeyExpires time.Time
	// Location and ETag are the answer's headers of those names.
	Location, ETag string
	// RequestID is the server's id of the last request (X-Request-Id).
	RequestID string
}

// CallOption changes one call.
type CallOption func(*callConfig)

type callConfig struct {
	key        string
	wait       time.Duration
	waitSet    bool
	minVersion int64
	ifMatch    *int64
	requestID  string
	meta       *Meta
}

// WithIdempotencyKey makes a command use key (1 to 255 printable ASCII
// characters, without a comma, a leading quote or spaces at either end;
// another key is refused before anything is sent) instead of a fresh
// UUIDv7: pass the key of an earlier call to retry it later, e.g. after a
// restart. Reads ignore it.
func WithIdempotencyKey(key string) CallOption { return func(c *callConfig) { c.key = key } }

// WithWait sends "Prefer: wait=N" (whole seconds): how long a command waits
// for an in-flight request with its key, or a read with a minimum version
// waits for the read model (the server caps both).
func WithWait(d time.Duration) CallOption {
	return func(c *callConfig) { c.wait, c.waitSet = d, true }
}

// WithMinVersion makes GetOrder wait (bounded by the server) until the read
// model has the order at version n or later; past the bound the call fails
// with a view-behind *Problem. Other calls ignore it.
func WithMinVersion(n int64) CallOption { return func(c *callConfig) { c.minVersion = n } }

// WithIfMatch makes PayOrder, ShipOrder, CancelOrder or RefundOrder run
// only if the order is still at version (If-Match): another current
// version is a precondition-failed *Problem (IsPreconditionFailed), and
// nothing changes; ShipOrder of an order shipped already, and CancelOrder of
// one cancelled already, succeed whatever the version (the change asked
// for has happened). UpdateOrder takes its version as an argument; reads
// ignore it.
func WithIfMatch(version int64) CallOption { return func(c *callConfig) { c.ifMatch = &version } }

// WithRequestID sends id as X-Request-Id (printable ASCII, at most 128
// characters; the server makes its own otherwise), to find the call in the
// server's logs and traces. Every attempt of the call carries it.
func WithRequestID(id string) CallOption { return func(c *callConfig) { c.requestID = id } }

// WithMeta fills m in with how the call went.
func WithMeta(m *Meta) CallOption { return func(c *callConfig) { c.meta = m } }

// request is one logical call.
type request struct {
	method, path string
	query        url.Values
	body         any  // JSON-encoded once; nil sends no body
	keyed        bool // a command: send an Idempotency-Key
	ifMatch      bool // a step that takes WithIfMatch
	header       http.Header
	out          any // decoded from a 2xx answer
}

// do runs r until a definitive answer: a 2xx (decoded into r.out), a 4xx
// that retryable calls final (a *Problem), the last of MaxAttempts
// attempts, or the end of ctx.
func (c *Client) do(ctx context.Context, r request, opts []CallOption) error {
	var cc callConfig
	for _, o := range opts {
		o(&cc)
	}
	meta := cc.meta
	if meta == nil {
		meta = new(Meta)
	}
	*meta = Meta{}
	what := r.method + " " + r.path

	var payload []byte
	var key string // every attempt's, whatever the caller does with meta meanwhile
	if r.body != nil {
		b, err := json.Marshal(r.body)
		if err != nil {
			return fmt.Errorf("%s: encode body: %w", what, err)
		}
		payload = b
	}
	if id := cc.requestID; id != "" && (len(id) > 128 || !printableASCII(id)) {
		meta.Definitive = true
		return fmt.Errorf("%s: X-Request-Id %q must be 1 to 128 printable ASCII characters", what, id)
	}
	if r.keyed {
		if k := cc.key; k != "" && !sendableKey(k) {
			// Nothing was sent, and sending would never work: settled.
			meta.Definitive = true
			return fmt.Errorf("%s: Idempotency-Key %q must be 1 to 255 printable ASCII characters, without a comma, "+
				"a leading quote or spaces at either end (the server would refuse it, or store another key)", what, k)
		}
		key = cc.key
		if key == "" {
			id, err := uuid.NewV7()
			if err != nil {
				return fmt.Errorf("%s: new Idempotency-Key: %w", what, err)
			}
			key = id.String()
		}
		meta.IdempotencyKey = key
	}
	u := c.base.String() + r.path // path segments are escaped already
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}

	var last error
	for attempt := 1; ; attempt++ {
		meta.Attempts = attempt
		res, err := c.send(ctx, r.method, u, payload, r, key, cc)
		var wait time.Duration
		switch {
		case err != nil && ctx.Err() != nil:
			if last == nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return fmt.Errorf("%s: %w (after %d attempts; the one before: %w)", what, ctx.Err(), attempt, last)
		case err != nil:
			last = fmt.Errorf("%s: %w", what, err)
			if !retryableErr(err) {
				return last
			}
		default:
			meta.Status, meta.RequestID = res.status, res.header.Get("X-Request-Id")
			meta.Replayed = res.header.Get("Idempotent-Replayed") == "true"
			meta.Location, meta.ETag = res.header.Get("Location"), res.header.Get("ETag")
			meta.KeyExpires, _ = http.ParseTime(res.header.Get("Idempotency-Key-Expires"))
			if res.status >= 200 && res.status < 300 {
				if r.out == nil {
					meta.Definitive = true
					return nil
				}
				err := json.Unmarshal(res.body, r.out)
				if err == nil {
					meta.Definitive = true
					return nil
				}
				// A body cut short (a proxy's answer without a length,
				// its connection lost) or not ours: like a lost answer,
				// sent again with the same key, whose replay is whole.
				last = fmt.Errorf("%s: decode %d answer: %w", what, res.status, err)
				break
			}
			p := newProblem(res)
			last = fmt.Errorf("%s: %w", what, p)
			if !retryable(p) {
				meta.Definitive = true
				return last
			}
			wait = p.RetryAfter
			if wait > MaxRetryAfter {
				return fmt.Errorf("%s: the server asks to retry after %s, longer than the client waits (%s): %w", what, retryAfterText(wait), MaxRetryAfter, last)
			}
		}
		if attempt >= c.cfg.MaxAttempts {
			return fmt.Errorf("gave up after %d attempts: %w", attempt, last)
		}
		wait = max(wait, c.backoff(attempt))
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return fmt.Errorf("%s: %w: no time for attempt %d before it (last answer: %w)", what, context.DeadlineExceeded, attempt+1, last)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (after %d attempts; the last: %w)", what, ctx.Err(), attempt, last)
		case <-t.C:
		}
	}
}

// retryable reports whether an answer may change if the same request is
// sent again: the server stored nothing for it. Besides 5xx and 429 that is
// a 408 (the body came too slowly: nothing ran) and a 409 that says when to
// retry (a key still in flight, or a refusal for now, such as a cancel
// while a payment settles, which the server does not store); a 409
// without Retry-After is the order's state, and final.
func retryable(p *Problem) bool {
	switch {
	case p.Status >= 500, p.Status == http.StatusTooManyRequests, p.Status == http.StatusRequestTimeout:
		return true
	case p.Status == http.StatusConflict:
		return p.Type == TypeKeyInFlight || p.retryAfterSet
	}
	return false
}

// sendableKey reports whether key reaches the server as itself when sent as
// a plain header value: a comma reads as a list (refused), spaces at either
// end are trimmed and a leading quote starts a quoted string (both stored
// as another key). Such keys are refused rather than quoted: the release
// before sent them plain, so a key it sent and this one retried would name
// two keys.
func sendableKey(key string) bool {
	return len(key) <= 255 && printableASCII(key) && !strings.Contains(key, ",") &&
		!strings.HasPrefix(key, `"`) && strings.TrimSpace(key) == key
}

// printableASCII reports whether s is printable ASCII (space included).
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// visibleASCII reports whether s is printable ASCII without spaces.
func visibleASCII(s string) bool { return printableASCII(s) && !strings.Contains(s, " ") }

// errNewRequest marks a request that could not be built: never retried.
var errNewRequest = errors.New("new request")

// errRedirected marks an answer to another method than the one sent: a
// redirect (of a proxy or load balancer in front of the api) that net/http
// followed with a GET. It answers nothing the call asked; sending again
// would only be redirected again.
var errRedirected = errors.New("redirected")

// keepMethod is the default HTTP client's redirect policy: follow a
// redirect only if it keeps the method (and so the body) and the origin
// (scheme, host and port: the token, the key and the command go to no
// one else), at most 10. Otherwise the redirect itself is the answer (a
// 3xx: final).
func keepMethod(req *http.Request, via []*http.Request) error {
	first := via[0]
	if req.Method != first.Method || req.URL.Scheme != first.URL.Scheme || !strings.EqualFold(req.URL.Host, first.URL.Host) {
		return http.ErrUseLastResponse
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

// errTooLarge marks an answer longer than the client reads: sending again
// would get it again.
var errTooLarge = errors.New("answer too large")

// retryableErr reports whether a failed attempt may be sent again: any
// failure to get a whole answer (refused or reset connection, timeout, a
// response cut short), since the server may or may not have executed it
// and the key makes sending it again safe.
func retryableErr(err error) bool {
	return !errors.Is(err, errNewRequest) && !errors.Is(err, errRedirected) && !errors.Is(err, errTooLarge)
}

// backoff is the full-jitter backoff before retry n (n ≥ 1).
func (c *Client) backoff(n int) time.Duration {
	ceiling := c.cfg.MaxBackoff
	if shift := n - 1; shift < 32 && c.cfg.MinBackoff<<shift < ceiling && c.cfg.MinBackoff<<shift > 0 {
		ceiling = c.cfg.MinBackoff << shift
	}
	if ceiling <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(ceiling)))
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// send makes one attempt. A response cut short is an error like a lost one.
func (c *Client) send(ctx context.Context, method, u string, payload []byte, r request, key string, cc callConfig) (response, error) {
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return response{}, fmt.Errorf("%w: %w", errNewRequest, err)
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json, application/problem+json")
	if payload != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if cc.ifMatch != nil && r.ifMatch {
		req.Header.Set("If-Match", `"`+strconv.FormatInt(*cc.ifMatch, 10)+`"`)
	}
	if cc.requestID != "" {
		req.Header.Set("X-Request-Id", cc.requestID)
	}
	if cc.waitSet {
		req.Header.Set("Prefer", "wait="+strconv.Itoa(int(max(0, cc.wait.Round(time.Second)/time.Second))))
	}
	if c.cfg.UserAgent != "" {
		req.Header.Set("User-Agent", c.cfg.UserAgent)
	}
	res, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	if res.Request != nil && res.Request.Method != method {
		return response{}, fmt.Errorf("%w: a %s answered %s %s, redirected to %s %s (a proxy in front of the api? a redirect must keep the method)",
			errRedirected, res.Status, method, u, res.Request.Method, res.Request.URL.Redacted())
	}
	b, err := io.ReadAll(io.LimitReader(res.Body, maxResponseBytes+1))
	if err != nil {
		return response{}, fmt.Errorf("read %d answer: %w", res.StatusCode, err)
	}
	if len(b) > maxResponseBytes {
		return response{}, fmt.Errorf("%w: a %d answer of more than %d bytes", errTooLarge, res.StatusCode, maxResponseBytes)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}, nil
}
