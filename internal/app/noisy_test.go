package app_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/internal/app"
)

// attack is one way a hostile tenant floods the api. run attacks until ctx
// ends and reports every response's status (0 for a transport error, 408
// for a body cut off); shed is the status that proves the api refused the
// attack's excess. Add an attack (Idempotency-Key flooding, /readyz
// flooding) as one more entry of noisyAttacks.
type attack struct {
	name string
	run  func(ctx context.Context, s noisyStack, report func(status int))
	shed int
	// lead is how long the attack runs before the quiet tenant is measured
	// (default 500 ms): long enough for it to reach the limit it attacks.
	lead time.Duration
}

// noisyStack is what an attack needs: the api's URL and the hostile
// tenant's token.
type noisyStack struct {
	api, token string
}

// The limits the test runs the api with: small enough that the attacks
// below cross them, large enough for the quiet tenant's paced workload
// (about 100 requests per second, never more than 2 at once). The attacks
// are paced too: they are to cross the hostile tenant's limits, not to
// saturate the two cores with HTTP parsing (no api-level limit helps
// against that; a flood from one address belongs to the load balancer).
var noisyEnv = map[string]string{
	"TENANT_RATE":          "200",
	"TENANT_BURST":         "50",
	"TENANT_MAX_IN_FLIGHT": "32",
	"TENANT_MAX_WAITING":   "8",
	"BODY_TIMEOUT":         "1s",
	// The quiet tenant stores about 25 keys a second, at most ~800 in the
	// whole test; the key flood below reaches 1,000 in its lead time.
	"IDEMPOTENCY_KEY_QUOTA": "1000",
}

var noisyAttacks = []attack{
	{
		// The first measurement: 600 reads of an order that is
		// never there, each willing to wait 10 s. A refused reader comes
		// back after the Retry-After it was given.
		name: "waiting readers",
		shed: http.StatusTooManyRequests,
		run: func(ctx context.Context, s noisyStack, report func(int)) {
			flood(ctx, 600, func() {
				st, retry := hostileGet(ctx, s.api+"/v1/orders/"+uuid.NewString()+"?min_version=1",
					http.Header{"Authorization": {"Bearer " + s.token}, "Prefer": {"wait=10"}})
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
		run: func(ctx context.Context, s noisyStack, report func(int)) {
			flood(ctx, 300, func() {
				st := trickle(ctx, s)
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
		run: func(ctx context.Context, s noisyStack, report func(int)) {
			flood(ctx, 50, func() {
				st, _ := hostileGet(ctx, s.api+"/v1/orders", http.Header{"Authorization": {"Bearer " + forgedToken()}})
				report(st)
				pause(ctx, 50*time.Millisecond)
			})
		},
	},
	{
		// Ten clients sending 50 requests per second each, past the rate.
		name: "burst past the rate",
		shed: http.StatusTooManyRequests,
		run: func(ctx context.Context, s noisyStack, report func(int)) {
			flood(ctx, 10, func() {
				st, _ := hostileGet(ctx, s.api+"/v1/orders?limit=1", http.Header{"Authorization": {"Bearer " + s.token}})
				report(st)
				pause(ctx, 20*time.Millisecond)
			})
		},
	},
	{
		// Fresh Idempotency-Keys as fast as the rate allows (the issue's
		// 40 workers storing 13,372 keys in 10 s), paced just under the
		// tenant's rate so that its 429s come from the key quota.
		name: "idempotency-key flood",
		shed: http.StatusTooManyRequests,
		lead: 8 * time.Second,
		run: func(ctx context.Context, s noisyStack, report func(int)) {
			flood(ctx, 10, func() {
				st, retry := hostilePost(ctx, s.api+"/v1/orders", s.token, orderBody("hostile-c"))
				report(st)
				pause(ctx, max(retry, 60*time.Millisecond))
			})
		},
	},
	{
		// 300 unauthenticated probes hammering /readyz: answered from the
		// monitor's cached state, so they cost no query (nothing to shed:
		// the proof that the attack ran is its 200s).
		name: "readyz flood",
		shed: http.StatusOK,
		run: func(ctx context.Context, s noisyStack, report func(int)) {
			flood(ctx, 300, func() {
				st, _ := hostileGet(ctx, s.api+"/readyz", http.Header{})
				report(st)
				pause(ctx, 5*time.Millisecond)
			})
		},
	},
}

// A hostile tenant cannot take a quiet tenant's service away: under each
// attack the quiet tenant's requests all succeed, its p99 stays close to
// what it was alone, and the attack was really made and shed.
func TestNoisyNeighbour(t *testing.T) {
	env := newEnv(t)
	for k, v := range noisyEnv {
		env[k] = v
	}
	api := start(t, "api", app.RunAPI, env)
	start(t, "projector", app.RunProjector, env)
	quiet, hostile := newToken(t, env, "quiet"), newToken(t, env, "hostile")
	const phase = 3 * time.Second

	quietWorkload(t, api, quiet, time.Second) // warm up: prepared statements, pools, the projector
	alone := quietWorkload(t, api, quiet, phase)
	if alone.failed > 0 {
		t.Fatalf("quiet tenant alone: %d of %d failed: %v", alone.failed, alone.total, alone.errors)
	}
	t.Logf("quiet tenant alone: %d requests, p99 %s", alone.total, alone.p99)

	for _, a := range noisyAttacks {
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		statuses := map[int]int{}
		var wg sync.WaitGroup
		wg.Go(func() {
			a.run(ctx, noisyStack{api: api, token: hostile}, func(st int) {
				mu.Lock()
				statuses[st]++
				mu.Unlock()
			})
		})
		time.Sleep(cmp.Or(a.lead, 500*time.Millisecond)) // let the attack reach its limits
		// The bound is 2× the p99 alone, but at least 20 ms more than it:
		// on a 2-core machine shared with other test binaries a p99 of a
		// few milliseconds doubles from scheduling noise alone, and the
		// attacking clients run in this process, on the same cores. A
		// phase over the bound is measured once more (the attack still
		// running): noise passes the second time, starvation does not.
		bound := max(2*alone.p99, alone.p99+20*time.Millisecond)
		var under workloadResult
		for attempt := 1; attempt <= 2; attempt++ {
			under = quietWorkload(t, api, quiet, phase)
			t.Logf("%s (attempt %d): quiet tenant %d requests, p99 %s", a.name, attempt, under.total, under.p99)
			if under.failed > 0 || under.p99 <= bound {
				break
			}
		}
		cancel()
		wg.Wait()
		t.Logf("%s: hostile statuses %v", a.name, statuses)

		if rate := float64(under.total-under.failed) / float64(under.total); rate < 0.999 {
			t.Errorf("%s: quiet tenant success rate %.4f (%d of %d failed: %v), want ≥ 0.999", a.name, rate, under.failed, under.total, under.errors)
		}
		if under.p99 > bound {
			t.Errorf("%s: quiet tenant p99 %s, alone %s; want at most %s", a.name, under.p99, alone.p99, bound)
		}
		if statuses[a.shed] == 0 {
			t.Errorf("%s: no %d among the hostile tenant's responses %v: the attack was not shed (or not made)", a.name, a.shed, statuses)
		}
	}
}

// maxViewLag is how far behind its own writes the quiet tenant's read model
// may be: a read-your-writes read that waited longer is a failure.
const maxViewLag = 2 * time.Second

type workloadResult struct {
	total, failed int
	p99           time.Duration
	errors        []string
}

// quietWorkload runs the quiet tenant's normal work for d with two paced
// workers: create an order, read it back with min_version (read-your-writes),
// read it plainly, list orders.
func quietWorkload(t *testing.T, api, token string, d time.Duration) workloadResult {
	t.Helper()
	var mu sync.Mutex
	var res workloadResult
	var latencies []time.Duration
	record := func(what string, status, want int, took time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		res.total++
		latencies = append(latencies, took)
		if status != want {
			res.failed++
			if len(res.errors) < 5 {
				res.errors = append(res.errors, fmt.Sprintf("%s: %d", what, status))
			}
		}
	}
	client := &http.Client{Timeout: 15 * time.Second}
	send := func(method, url, key, body string, header http.Header) (int, []byte, time.Duration) {
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			return 0, nil, 0
		}
		if header != nil {
			req.Header = header.Clone()
		}
		req.Header.Set("Authorization", "Bearer "+token)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("Content-Type", "application/json")
		}
		start := time.Now()
		r, err := client.Do(req)
		if err != nil {
			return 0, nil, time.Since(start)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		return r.StatusCode, b, time.Since(start)
	}
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				st, body, took := send(http.MethodPost, api+"/v1/orders", uuid.NewString(), orderBody("quiet-c"), nil)
				record("create", st, http.StatusCreated, took)
				var o struct{ ID string }
				_ = json.Unmarshal(body, &o)
				time.Sleep(15 * time.Millisecond)
				st, _, took = send(http.MethodGet, api+"/v1/orders/"+o.ID+"?min_version=1", "", "", http.Header{"Prefer": {"wait=5"}})
				if st == http.StatusOK && took > maxViewLag {
					st = -1 // the read model was too far behind: a failure
				}
				record("read-your-writes", st, http.StatusOK, took)
				time.Sleep(15 * time.Millisecond)
				st, _, took = send(http.MethodGet, api+"/v1/orders/"+o.ID, "", "", nil)
				record("get", st, http.StatusOK, took)
				time.Sleep(15 * time.Millisecond)
				st, _, took = send(http.MethodGet, api+"/v1/orders?limit=10", "", "", nil)
				record("list", st, http.StatusOK, took)
				time.Sleep(15 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	slices.Sort(latencies)
	if len(latencies) > 0 {
		res.p99 = latencies[min(len(latencies)-1, len(latencies)*99/100)]
	}
	return res
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

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// hostileTransport keeps enough idle connections for the floods.
var hostileTransport = &http.Transport{MaxIdleConnsPerHost: 1000, MaxConnsPerHost: 0}

// hostileGet sends a GET and returns its status (0 on a transport error or
// cancellation) and the Retry-After it was given (at least 10 ms).
func hostileGet(ctx context.Context, url string, header http.Header) (int, time.Duration) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, time.Second
	}
	req.Header = header
	res, err := (&http.Client{Transport: hostileTransport}).Do(req)
	if err != nil {
		return 0, 10 * time.Millisecond
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	retry := 10 * time.Millisecond
	if res.Header.Get("Retry-After") != "" {
		retry = time.Second
	}
	return res.StatusCode, retry
}

// hostilePost creates an order with a fresh Idempotency-Key and returns the
// status and the Retry-After it was given (at least 10 ms). A 429 for any
// reason but the key quota is reported as 4291, so that the attack's shed
// status proves the quota refused it.
func hostilePost(ctx context.Context, url, token, body string) (int, time.Duration) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, time.Second
	}
	req.Header = http.Header{"Authorization": {"Bearer " + token}, "Idempotency-Key": {uuid.NewString()},
		"Content-Type": {"application/json"}}
	res, err := (&http.Client{Transport: hostileTransport}).Do(req)
	if err != nil {
		return 0, 10 * time.Millisecond
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	retry := 10 * time.Millisecond
	if res.Header.Get("Retry-After") != "" {
		retry = time.Second
	}
	if res.StatusCode == http.StatusTooManyRequests && !strings.Contains(string(b), "idempotency-quota-exceeded") {
		return 4291, retry
	}
	return res.StatusCode, retry
}

// trickle opens a socket, sends a POST's headers and then its body at one
// byte per 2 s, and returns the status the api answered (0 if none).
func trickle(ctx context.Context, s noisyStack) int {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", strings.TrimPrefix(s.api, "http://"))
	if err != nil {
		pause(ctx, 100*time.Millisecond)
		return 0
	}
	defer conn.Close()
	context.AfterFunc(ctx, func() { conn.Close() })
	fmt.Fprintf(conn, "POST /v1/orders HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\nIdempotency-Key: %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{", s.token, uuid.NewString())
	go func() {
		for ctx.Err() == nil {
			pause(ctx, 2*time.Second)
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
