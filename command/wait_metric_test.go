package command_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/command"
	"github.com/acme/orders/internal/testenv"
)

// delayProxy forwards TCP to target, delaying every chunk by d one way: a
// database a few milliseconds away (another zone, a managed service). The
// sleep is that distance, not a wait for something to happen.
func delayProxy(t *testing.T, target string, d time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	pipe := func(dst, src net.Conn) {
		type chunk struct {
			b  []byte
			at time.Time
		}
		ch := make(chan chunk, 1024)
		go func() {
			for c := range ch {
				time.Sleep(time.Until(c.at))
				if _, err := dst.Write(c.b); err != nil {
					break
				}
			}
			dst.Close()
		}()
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(d)}
			}
			if err != nil {
				close(ch)
				return
			}
		}
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return ln.Addr().String()
}

// orders_idempotency_waits_total ("requests held up by an in-flight request
// with their key") and orders_idempotency_wait_seconds counted every keyed
// command whose claim round trip took 5 ms or more, though no other request
// used its key: on a database 3 ms away, every one. The claim is timed by
// the server now.
func TestTheRoundTripToTheDatabaseIsNoWaitForAKey(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = delayProxy(t, u.Host, 3*time.Millisecond)
	db, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	idem := newIdem(t, db, command.IdempotencyConfig{TTL: time.Hour})
	ok := func(context.Context, pgx.Tx) (command.Response, error) {
		return command.Response{Status: 200, Body: []byte(`{}`)}, nil
	}
	const n = 20
	for i := range n {
		req := command.KeyedRequest{TenantID: "t1", Scope: "POST /v1/orders/{id}/ship", Key: fmt.Sprintf("unique-%d", i), Command: map[string]int{"i": i}}
		if _, err := idem.Do(context.Background(), req, time.Second, ok); err != nil {
			t.Fatal(err)
		}
	}
	s := idem.Stats()
	t.Logf("%d requests, each with its own key, none concurrent: %+v", n, s)
	if s.Waits != 0 {
		t.Errorf("waits = %d, want 0: no request was held up by another with its key", s.Waits)
	}
}
