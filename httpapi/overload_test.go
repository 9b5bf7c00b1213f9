package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/auth"
	"github.com/acme/orders/command"
	"github.com/acme/orders/httpapi"
	"github.com/acme/orders/internal/testenv"
)

// Past its in-flight limit the api sheds requests at once with 429
// problem+json and Retry-After, stores nothing for them, and keeps serving
// its health endpoints; the request it admitted completes normally.
func TestOverloadIsShedWith429(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	idem, err := command.NewIdempotency(db, command.IdempotencyConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	clients := auth.NewClients(db, 0)
	limit := httpapi.NewInFlightLimit(1)
	srv := httptest.NewServer(validated(t, httpapi.New(httpapi.Deps{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Auth: clients,
		Idempotency: idem, Keys: idem, CreateOrder: command.NewCreateOrderHandler(),
		InFlight: limit,
	})))
	defer srv.Close()
	token, err := clients.CreateToken(ctx, "t1", "test")
	if err != nil {
		t.Fatal(err)
	}
	post := func(key string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(validBody))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	// Hold the first request inside the api: its key claim waits for a
	// table lock held here.
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `LOCK TABLE idempotency_keys IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	first := make(chan int, 1)
	go func() {
		res := post("held")
		res.Body.Close()
		first <- res.StatusCode
	}()
	testenv.Eventually(t, 5*time.Second, "the first request is in flight", func() bool { return limit.InFlight() == 1 })

	res := post("shed")
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Content-Type") != "application/problem+json" ||
		res.Header.Get("Retry-After") == "" || json.Unmarshal(body, &p) != nil || p.Status != 429 {
		t.Fatalf("over the limit: %d %v %s; want 429 problem+json with Retry-After", res.StatusCode, res.Header, body)
	}
	if limit.Shed() != 1 {
		t.Fatalf("shed = %d, want 1", limit.Shed())
	}
	if res, err := http.Get(srv.URL + "/healthz"); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("/healthz under the limit: %v %v", res, err)
	}

	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if status := <-first; status != http.StatusCreated {
		t.Fatalf("the admitted request: %d, want 201", status)
	}
	var keys int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = 'shed'`).Scan(&keys); err != nil || keys != 0 {
		t.Fatalf("the shed request stored %d key rows (err %v), want none", keys, err)
	}
	// The shed key is free: its retry runs afresh.
	if res := post("shed"); res.StatusCode != http.StatusCreated {
		t.Fatalf("retry of the shed request: %d, want 201", res.StatusCode)
	}
}
