package app

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// DefaultAPIMaxConns is the most client connections one api process keeps
// open (-max-conns). Each open connection holds a goroutine and its read
// and write buffers (about 17 KiB measured) whether or not a request is in
// flight, so a flood of connections, not of requests, is what grew the
// api's memory past 200 MiB in the bench's overloaded step (3,400
// connections, with requests already capped at -max-in-flight).
const DefaultAPIMaxConns = 1024

// connLimit bounds the connections a server keeps open. Past max, Accept
// first closes the connection idle the longest (a keep-alive connection
// between requests, which its client reopens when it needs it), and with
// none idle it waits for one to close or go idle, leaving new connections
// in the kernel's accept queue, where they cost this process nothing. A
// connection is not yet any tenant's, so no slot is anyone's either: a
// client that holds connections open without using them loses them to the
// next one that connects. Idle connections are closed only for a new one
// that is waiting, never ahead of it.
type connLimit struct {
	net.Listener
	max int

	mu     sync.Mutex
	cond   *sync.Cond
	open   int
	idle   map[net.Conn]time.Time // idle since
	closed bool
}

func limitConns(ln net.Listener, max int) *connLimit {
	l := &connLimit{Listener: ln, max: max, idle: map[net.Conn]time.Time{}}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// Accept takes the next connection, then waits for a slot for it: it
// closes the connection idle the longest if all are taken, or waits for
// one to close or go idle. Only then does the server see the connection
// (and give it a goroutine and buffers); the ones behind it wait in the
// kernel's accept queue.
func (l *connLimit) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	for l.open >= l.max && !l.closed {
		if idle := l.oldestIdle(); idle != nil {
			delete(l.idle, idle)
			l.mu.Unlock()
			idle.Close() // its Close frees the slot
			l.mu.Lock()
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
	l.mu.Unlock()
	return &limitedConn{Conn: c, l: l}, nil
}

// Close stops Accept, including one waiting for a slot.
func (l *connLimit) Close() error {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	return l.Listener.Close()
}

func (l *connLimit) oldestIdle() net.Conn {
	var oldest net.Conn
	var since time.Time
	for c, t := range l.idle {
		if oldest == nil || t.Before(since) {
			oldest, since = c, t
		}
	}
	return oldest
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
	switch s {
	case http.StateIdle:
		l.idle[c] = time.Now()
		l.cond.Broadcast()
	default:
		delete(l.idle, c)
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
	l    *connLimit
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.idle, c)
		c.l.mu.Unlock()
		c.l.release()
	})
	return err
}
