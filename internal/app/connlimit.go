package app

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acme/orders/internal/mono"
	"github.com/acme/orders/metrics"
)

// DefaultAPIMaxConns is the most client connections one api process keeps
// open (-max-conns). Each open connection holds a goroutine and its read
// and write buffers (about 17 KiB measured) whether or not a request is in
// flight, so a flood of connections, not of requests, is what grew the
// api's memory past 200 MiB in the bench's overloaded step (3,400
// connections, with requests already capped at -max-in-flight).
const DefaultAPIMaxConns = 1024

// connLimit bounds the connections a server keeps open. Past max, Accept
// first closes a connection that holds its slot without using it: the one
// idle the longest (a keep-alive connection between requests, which its
// client reopens when it needs it), or else the oldest that has not
// finished a request's header within silentAfter of connecting or of
// beginning it, or else the one whose client has not taken its answer for
// the longest: a write blocked for stalledAfter (the kernel's send buffer,
// megabytes, is full, so its client reads nothing). With none of those it waits
// for one, leaving new connections in the kernel's accept queue, where
// they cost this process nothing. Connections are closed only for a new
// connection that is waiting, never ahead of it.
//
// A connection is not yet any tenant's, so no slot is anyone's either. What
// a client can still hold is a slot per connection that is sending a
// request: at most ReadHeaderTimeout (2 s) for its headers, then the body
// timeout, on every path (httpapi sets that deadline on every request with
// a body, whether a handler reads it or net/http discards it), and admitted
// requests are bounded per tenant; and a slot per connection whose client
// does not read its answers, until a new connection needs it and the
// write has stalled for stalledAfter. Filling every slot
// that way takes max connections re-dialled every two seconds, and even
// then new connections take turns with the attacker's in the accept queue.
type connLimit struct {
	net.Listener
	max int

	// closedIdle, closedSlow and closedStalled count the connections Accept
	// closed for a new one: idle keep-alive connections, connections that
	// had not sent a header within silentAfter, and connections whose
	// write had been blocked for stalledAfter.
	closedIdle, closedSlow, closedStalled atomic.Int64

	mu     sync.Mutex
	cond   *sync.Cond
	open   int
	idle   map[net.Conn]time.Time // idle since
	fresh  map[net.Conn]time.Time // accepted, or its next request begun, at; header not in yet
	all    map[*limitedConn]struct{}
	closed bool
}

// silentAfter is how long a connection may take to send a request's header,
// from connecting or from its first bytes, before it may be closed for
// another: a client sends its header at once.
const silentAfter = 250 * time.Millisecond

// stalledAfter is how long a write of one chunk (writeChunk) to a
// connection may stay blocked before the connection may be closed for
// another. A write blocks only once the socket's send buffer (sendBuffer)
// is full, and resumes once its client has taken about a third of it: a
// client that takes less than about 80 KB/s, or nothing, while every slot
// is taken gives way. A client that pipelined requests and never read the
// answers held its slot, and its handler, until the server's WriteTimeout,
// and 1,024 of them locked every client out.
const stalledAfter = 2 * time.Second

// sendBuffer is each connection's socket send buffer (the kernel doubles
// it). Left to autotuning it grew to megabytes: a client that stopped
// reading pinned 2 MB of kernel memory per connection (2 GB at the cap),
// and a blocked write waited for a third of that to drain. 256 KiB keeps a
// 100 ms round trip at 2.5 MB/s, more than the largest answer needs.
const sendBuffer = 256 << 10

func limitConns(ln net.Listener, max int) *connLimit {
	l := &connLimit{Listener: ln, max: max, idle: map[net.Conn]time.Time{}, fresh: map[net.Conn]time.Time{}, all: map[*limitedConn]struct{}{}}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// Accept takes the next connection, then waits for a slot for it: if all
// are taken it closes an unused one (idle the longest, or silent past
// silentAfter), or waits for one to close or become unused. Only then does the server see the connection
// (and give it a goroutine and buffers); the ones behind it wait in the
// kernel's accept queue.
func (l *connLimit) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	for l.open >= l.max && !l.closed {
		if unused := l.unused(time.Now()); unused != nil {
			_, idle := l.idle[unused]
			_, fresh := l.fresh[unused]
			switch {
			case idle:
				l.closedIdle.Add(1)
			case fresh:
				l.closedSlow.Add(1)
			default:
				l.closedStalled.Add(1)
			}
			delete(l.idle, unused)
			delete(l.fresh, unused)
			l.mu.Unlock()
			unused.Close() // its Close frees the slot
			l.mu.Lock()
			continue
		}
		if len(l.fresh) > 0 || l.writing() {
			// A silent or a stalled one may qualify soon: look again then,
			// or as soon as a slot frees.
			t := time.AfterFunc(silentAfter/5, l.cond.Broadcast)
			l.cond.Wait()
			t.Stop()
			continue
		}
		l.cond.Wait()
	}
	if l.closed {
		l.mu.Unlock()
		c.Close()
		return nil, net.ErrClosed
	}
	l.open++
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(sendBuffer) // best effort: the default only costs memory
	}
	lc := &limitedConn{Conn: c, l: l}
	l.all[lc] = struct{}{}
	l.mu.Unlock()
	return lc, nil
}

// Close stops Accept, including one waiting for a slot.
func (l *connLimit) Close() error {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	return l.Listener.Close()
}

// unused returns the connection idle the longest, or else the oldest that
// has sent nothing for silentAfter, or else the one whose write has been
// blocked the longest, for stalledAfter at least; or nil.
func (l *connLimit) unused(now time.Time) net.Conn {
	if c := oldest(l.idle); c != nil {
		return c
	}
	if c := oldest(l.fresh); c != nil && now.Sub(l.fresh[c]) >= silentAfter {
		return c
	}
	var stalled *limitedConn
	var since int64
	for c := range l.all {
		if w := c.writingSince.Load(); w != 0 && (stalled == nil || w < since) {
			stalled, since = c, w
		}
	}
	if stalled != nil && mono.Since(since) >= stalledAfter {
		return stalled
	}
	return nil
}

// writing reports whether a write to any connection is under way (one
// that may stall).
func (l *connLimit) writing() bool {
	for c := range l.all {
		if c.writingSince.Load() != 0 {
			return true
		}
	}
	return false
}

func oldest(conns map[net.Conn]time.Time) net.Conn {
	var first net.Conn
	var since time.Time
	for c, t := range conns {
		if first == nil || t.Before(since) {
			first, since = c, t
		}
	}
	return first
}

func (l *connLimit) release() {
	l.mu.Lock()
	l.open--
	l.cond.Broadcast()
	l.mu.Unlock()
}

// connState is the server's ConnState hook: it tracks which connections
// are idle, and wakes an Accept waiting for one.
func (l *connLimit) connState(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.fresh, c)
	switch s {
	case http.StateNew:
		l.fresh[c] = time.Now()
	case http.StateIdle:
		l.idle[c] = time.Now()
		l.cond.Broadcast()
	default:
		delete(l.idle, c)
	}
	// Every connection is a *limitedConn: the server serves plain HTTP on
	// this listener (under TLS it would be a *tls.Conn, and neither this
	// nor Close would find it in the maps).
	if lc, ok := c.(*limitedConn); ok {
		lc.idle.Store(s == http.StateIdle)
	}
}

// Open is the number of connections open now.
func (l *connLimit) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

type limitedConn struct {
	net.Conn
	l            *connLimit
	once         sync.Once
	idle         atomic.Bool  // in l.idle: Accept may close it
	writingSince atomic.Int64 // mono.Now() when the write under way began; 0 when none
}

// writeChunk is the most Write hands the socket at once, so that the time
// one piece has been under way measures a client that takes nothing, not a
// large answer read steadily: net/http passes a large body to Write whole.
const writeChunk = 32 << 10

// Write writes p a chunk at a time, recording when the chunk under way
// began, so that a chunk that stays blocked (its client takes nothing)
// marks the connection stalled.
func (c *limitedConn) Write(p []byte) (int, error) {
	defer c.writingSince.Store(0)
	written := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), writeChunk)]
		c.writingSince.Store(mono.Now())
		n, err := c.Conn.Write(chunk)
		written += n
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// Read moves an idle keep-alive connection whose next request has begun
// (a read returned bytes) from the idle ones, closable at once, to those
// closable once it has had silentAfter to finish the header. net/http
// reports it active only once it has read that whole header, so until then
// Accept took it for idle and could close it under a request that had
// arrived: its client saw a reset, and the api a failed request (216 of
// them in the bench's overloaded step). The grace is no more than a new
// connection's: a client that sends "GET" and stalls (net/http would wait
// up to IdleTimeout for a fourth byte) gives up its slot after it. A request
// whose first bytes are still in flight can still meet a close, as on any
// keep-alive connection a server closes.
func (c *limitedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.idle.Load() {
		c.l.mu.Lock()
		if _, ok := c.l.idle[c]; ok {
			delete(c.l.idle, c)
			c.l.fresh[c] = time.Now()
		}
		c.idle.Store(false)
		c.l.mu.Unlock()
	}
	return n, err
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.idle, c)
		delete(c.l.fresh, c)
		delete(c.l.all, c)
		c.l.mu.Unlock()
		c.l.release()
	})
	return err
}

// register exports the limiter's state on reg: the connections open, and
// those closed for a new one by reason. A rise of "slow" closes while
// clients report resets is the sign to look at this limiter first.
func (l *connLimit) register(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: metrics.Namespace, Name: "http_connections_open",
		Help: "Client connections the api holds open (at most -max-conns)."},
		func() float64 { return float64(l.Open()) }))
	help := "Connections closed to make room for a new one at -max-conns, by reason: idle (a keep-alive connection between requests), slow (no request header within " +
		silentAfter.String() + " of connecting or of beginning it) or stalled (a write blocked for " + stalledAfter.String() + ": its client reads nothing)."
	for reason, n := range map[string]*atomic.Int64{"idle": &l.closedIdle, "slow": &l.closedSlow, "stalled": &l.closedStalled} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: metrics.Namespace, Name: "http_connections_closed_for_new_total",
			Help: help, ConstLabels: prometheus.Labels{"reason": reason}},
			func() float64 { return float64(n.Load()) }))
	}
}
