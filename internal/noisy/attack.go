package noisy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// attack is one way a hostile tenant floods the api. run attacks until ctx
// ends and reports every response's status (0 for a transport error, 408
// for a body cut off); shed is the status that proves the api refused the
// attack's excess. The attacks are paced: they are to cross the hostile
// tenant's limits, not to saturate the cores with HTTP parsing (no
// api-level limit helps against that; a flood from one address belongs to
// the load balancer). Add an attack as one more entry of attacks.
type attack struct {
	name string
	run  func(ctx context.Context, t *target, report func(status int))
	shed int
}

// target is what an attack needs: the api's URL, the hostile tenant's
// token and a client with enough idle connections for the floods.
type target struct {
	api, token string
	http       *http.Client
}

var attacks = []attack{
	{
		// The first measurement: 600 reads of an order that is
		// never there, each willing to wait 10 s. A refused reader comes
		// back after the Retry-After it was given.
		name: "waiting readers",
		shed: http.StatusTooManyRequests,
		run: func(ctx context.Context, t *target, report func(int)) {
			flood(ctx, 600, func() {
				st, retry := t.get(ctx, "/v1/orders/"+uuid.NewString()+"?min_version=1",
					http.Header{"Authorization": {"Bearer " + t.token}, "Prefer": {"wait=10"}})
				report(st)
				pause(ctx, retry)
			})
		},
	},
	{
		// 300 sockets trickling a POST body at one byte per 2 s; a socket
		// refused comes back after its Retry-After.
		name: "trickling bodies",
		shed: http.StatusTooManyRequests,
		run: func(ctx context.Context, t *target, report func(int)) {
			flood(ctx, 300, func() {
				st := t.trickle(ctx)
				report(st)
				if st == http.StatusTooManyRequests {
					pause(ctx, time.Second)
				}
			})
		},
	},
	{
		// Made-up tokens: refused (401) without a slot or a query.
		name: "forged tokens",
		shed: http.StatusUnauthorized,
		run: func(ctx context.Context, t *target, report func(int)) {
			flood(ctx, 50, func() {
				st, _ := t.get(ctx, "/v1/orders", http.Header{"Authorization": {"Bearer " + forgedToken()}})
				report(st)
				pause(ctx, 50*time.Millisecond)
			})
		},
	},
	{
		// Ten clients sending 50 requests per second each, past the rate.
		name: "burst past the rate",
		shed: http.StatusTooManyRequests,
		run: func(ctx context.Context, t *target, report func(int)) {
			flood(ctx, 10, func() {
				st, _ := t.get(ctx, "/v1/orders?limit=1", http.Header{"Authorization": {"Bearer " + t.token}})
				report(st)
				pause(ctx, 20*time.Millisecond)
			})
		},
	},
	{
		// Fresh Idempotency-Keys as fast as the rate allows (the issue's
		// 40 workers storing 13,372 keys in 10 s), each on a pay of one
		// order of its own (stored as a no-op after the first: cheap for
		// the database, so what is measured is the key quota, not the cost
		// of creating orders), paced just under the tenant's rate so that
		// its 429s come from the key quota.
		name: "idempotency-key flood",
		shed: http.StatusTooManyRequests,
		run: func(ctx context.Context, t *target, report func(int)) {
			id := t.createOrder(ctx)
			if id == "" {
				report(0)
				return
			}
			flood(ctx, 10, func() {
				st, retry := t.post(ctx, "/v1/orders/"+id+"/pay", "{}")
				report(st)
				pause(ctx, max(retry, 60*time.Millisecond))
			})
		},
	},
	{
		// 300 unauthenticated probes hammering /readyz, about 3,000 a
		// second: answered from the monitor's cached state, so they cost
		// no query (nothing to shed: the proof that the attack ran is its
		// 200s). Uncached, this rate would hold the api's pool. Paced like
		// the others: at 5 ms per probe (45,000 a second) it measured only
		// that HTTP parsing saturates two cores.
		name: "readyz flood",
		shed: http.StatusOK,
		run: func(ctx context.Context, t *target, report func(int)) {
			flood(ctx, 300, func() {
				st, _ := t.get(ctx, "/readyz", http.Header{})
				report(st)
				pause(ctx, 100*time.Millisecond)
			})
		},
	},
}

// flood runs n workers repeating f until ctx ends.
func flood(ctx context.Context, n int, f func()) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				f()
			}
		})
	}
	wg.Wait()
}

// get sends a GET and returns its status (0 on a transport error or
// cancellation) and how long to wait before the next: a second after a
// Retry-After, else 10 ms.
func (t *target) get(ctx context.Context, path string, header http.Header) (int, time.Duration) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.api+path, nil)
	if err != nil {
		return 0, time.Second
	}
	req.Header = header
	res, err := t.http.Do(req)
	if err != nil {
		return 0, 10 * time.Millisecond
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, retryAfter(res)
}

// createOrder creates an order of the hostile tenant and returns its id
// ("" if it could not).
func (t *target) createOrder(ctx context.Context) string {
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.api+"/v1/orders", strings.NewReader(orderBody("hostile-c")))
		if err != nil {
			return ""
		}
		req.Header = http.Header{"Authorization": {"Bearer " + t.token}, "Idempotency-Key": {uuid.NewString()},
			"Content-Type": {"application/json"}}
		res, err := t.http.Do(req)
		if err != nil {
			pause(ctx, 100*time.Millisecond)
			continue
		}
		var o struct{ ID string }
		err = json.NewDecoder(res.Body).Decode(&o)
		res.Body.Close()
		if res.StatusCode == http.StatusCreated && err == nil {
			return o.ID
		}
		pause(ctx, time.Second)
	}
	return ""
}

// post sends a POST with a fresh Idempotency-Key and returns the
// status and how long to wait before the next (as get). A 429 for any
// reason but the key quota is reported as 4291, so that the key flood's
// shed status proves the quota refused it.
func (t *target) post(ctx context.Context, path, body string) (int, time.Duration) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.api+path, strings.NewReader(body))
	if err != nil {
		return 0, time.Second
	}
	req.Header = http.Header{"Authorization": {"Bearer " + t.token}, "Idempotency-Key": {uuid.NewString()},
		"Content-Type": {"application/json"}}
	res, err := t.http.Do(req)
	if err != nil {
		return 0, 10 * time.Millisecond
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		return 0, 10 * time.Millisecond
	}
	if res.StatusCode == http.StatusTooManyRequests && !strings.Contains(string(b), "idempotency-quota-exceeded") {
		return 4291, retryAfter(res)
	}
	return res.StatusCode, retryAfter(res)
}

func retryAfter(res *http.Response) time.Duration {
	if res.Header.Get("Retry-After") != "" {
		return time.Second
	}
	return 10 * time.Millisecond
}

// trickle opens a socket, sends a POST's headers and then its body at one
// byte per 2 s, and returns the status the api answered (0 if none).
func (t *target) trickle(ctx context.Context) int {
	u, err := url.Parse(t.api)
	if err != nil {
		pause(ctx, time.Second)
		return 0
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", u.Host)
	if err != nil {
		pause(ctx, 100*time.Millisecond)
		return 0
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	fmt.Fprintf(conn, "POST /v1/orders HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\nIdempotency-Key: %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{", t.token, uuid.NewString())
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-time.After(2 * time.Second):
			}
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	var status int
	buf := make([]byte, 64)
	n, _ := io.ReadAtLeast(conn, buf, len("HTTP/1.1 200"))
	if _, err := fmt.Sscanf(string(buf[:n]), "HTTP/1.1 %d", &status); err != nil {
		return 0
	}
	return status
}

// forgedToken is a made-up token of the right shape and length.
func forgedToken() string {
	const chars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	b := []byte("ord_")
	for range 49 {
		b = append(b, chars[rand.IntN(len(chars))])
	}
	return string(b)
}
