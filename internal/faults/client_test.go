package faults

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// replica is an api stand-in that answers every request with status and
// body, recording the Idempotency-Key of each.
type replica struct {
	mu   sync.Mutex
	keys []string
}

func (r *replica) serve(t *testing.T, status int, body string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.keys = append(r.keys, req.Header.Get("Idempotency-Key"))
		r.mu.Unlock()
		ct := "application/json"
		if status >= 400 {
			ct = "application/problem+json"
		}
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A careful client's operation goes to any replica, attempt by attempt,
// with one key, until a definitive answer; its op records the key, the
// attempts, the status and the order, and counts the retries. One that
// gives up records status 0 (outcome unknown) though its last answer was a
// 503.
func TestCarefulClientRecordsKeyAttemptsAndOutcome(t *testing.T) {
	var down, up replica
	downURL := down.serve(t, http.StatusServiceUnavailable, `{"type":"about:blank","status":503}`)
	upURL := up.serve(t, http.StatusCreated, `{"id":"o-1","status":"pending","total":300,"version":1}`)
	api, err := newAPIClient([]string{downURL, upURL}, "ord_test", 7, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var retries atomic.Int64
	c := &client{api: api, rng: rand.New(rand.NewPCG(7, 0)), deadline: 10 * time.Second, retries: &retries}
	for range 5 {
		o := &op{Kind: "pay"}
		c.do(o, c.pay("o-1", ""))
		if o.Status != http.StatusCreated || o.Order == nil || o.Order.ID != "o-1" || o.Key == "" {
			t.Fatalf("op %+v; want 201 with order o-1 and its key", o)
		}
		if got := len(down.keys) + len(up.keys); got != o.Attempts {
			t.Fatalf("%d requests, op says %d attempts", got, o.Attempts)
		}
		for _, k := range append(down.keys, up.keys...) {
			if k != o.Key {
				t.Fatalf("an attempt carried key %q, the op %q", k, o.Key)
			}
		}
		if retries.Load() != int64(o.Attempts-1) {
			t.Fatalf("%d retries counted for %d attempts", retries.Load(), o.Attempts)
		}
		if len(down.keys) > 0 {
			break // a retry went from the failing replica to the other
		}
		down.keys, up.keys = nil, nil
		retries.Store(0)
	}
	if len(down.keys) == 0 {
		t.Fatal("no attempt reached the first replica in 5 operations")
	}

	api, err = newAPIClient([]string{downURL}, "ord_test", 7, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c = &client{api: api, rng: rand.New(rand.NewPCG(7, 0)), deadline: 300 * time.Millisecond, retries: &retries}
	o := &op{Kind: "ship"}
	c.do(o, c.pay("o-1", ""))
	if o.Status != 0 || o.Attempts < 2 || o.Key == "" || o.Err == nil || !strings.Contains(o.Err.Error(), "503") {
		t.Fatalf("op %+v; want given up (status 0) after several 503s, with its key and error", o)
	}
}

// A create answered 201 whose order the client could not read is a
// violation, not a silent success.
func TestUnreadableCreateIsAViolation(t *testing.T) {
	out := opViolations([]*op{{Kind: "create", Key: "k-1", Status: http.StatusCreated}}, map[string]orderRow{}, map[string]orderRow{})
	if len(out) != 1 || !strings.Contains(out[0], "no readable order") {
		t.Fatalf("violations %q; want the unreadable create", out)
	}
}
