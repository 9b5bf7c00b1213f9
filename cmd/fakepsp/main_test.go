package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/acme/orders/fakepsp"
)

// TestRunServesStripeWireFormat runs the program on a fresh database and
// speaks raw HTTP to it: auth, the replay header, idempotency_error, the
// ledger and the fault switches.
func TestRunServesStripeWireFormat(t *testing.T) {
	admin := os.Getenv("TEST_DATABASE_URL")
	require.NotEmpty(t, admin, "TEST_DATABASE_URL must name the admin database of a PostgreSQL server")
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	dbName := "fakepsp_cmd_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), admin)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		_, err = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{dbName}.Sanitize()+" WITH (FORCE)")
		require.NoError(t, err)
	})

	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	env := map[string]string{"DATABASE_URL": admin, "FAKEPSP_DATABASE": dbName, "LOG_FORMAT": "json"}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"fakepsp", "-addr", "127.0.0.1:0"}, func(k string) string { return env[k] }, pw)
		pw.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addr <- line.Addr
			}
		}
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("run returned early: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("fakepsp did not listen within 30s")
	}

	post := func(path, key, auth string, form url.Values) (*http.Response, map[string]any) {
		req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", key)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return resp, body
	}
	charge := url.Values{"amount": {"700"}, "currency": {"usd"}, "confirm": {"true"}, "payment_method": {"pm_card_visa"}, "metadata[order_id]": {"o9"}}

	resp, body := post("/v1/payment_intents", "k1", "", charge)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, "invalid_request_error", body["error"].(map[string]any)["type"])
	resp, _ = post("/v1/payment_intents", "k1", "Bearer sk_live_nope", charge)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	resp, body = post("/v1/payment_intents", "k1", "Bearer sk_test_123", charge)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, resp.Header.Get("Idempotent-Replayed"))
	require.Equal(t, "payment_intent", body["object"])
	require.Equal(t, "succeeded", body["status"])
	id := body["id"].(string)

	// Basic auth with the key as user name works too; the same request replays.
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/payment_intents", strings.NewReader(charge.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "k1")
	req.SetBasicAuth("sk_test_123", "")
	r2, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var replay map[string]any
	require.NoError(t, json.NewDecoder(r2.Body).Decode(&replay))
	r2.Body.Close()
	require.Equal(t, http.StatusOK, r2.StatusCode)
	require.Equal(t, "true", r2.Header.Get("Idempotent-Replayed"))
	require.Equal(t, id, replay["id"])

	other := url.Values{}
	for k, v := range charge {
		other[k] = v
	}
	other.Set("amount", "701")
	resp, body = post("/v1/payment_intents", "k1", "Bearer sk_test_123", other)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, "idempotency_error", body["error"].(map[string]any)["type"])

	declined := url.Values{"amount": {"700"}, "currency": {"usd"}, "confirm": {"true"}, "payment_method": {"pm_card_chargeDeclined"}}
	resp, body = post("/v1/payment_intents", "k2", "Bearer sk_test_123", declined)
	require.Equal(t, http.StatusPaymentRequired, resp.StatusCode)
	e := body["error"].(map[string]any)
	require.Equal(t, "card_error", e["type"])
	require.Equal(t, "card_declined", e["code"])
	require.Equal(t, "requires_payment_method", e["payment_intent"].(map[string]any)["status"])

	resp, body = post("/v1/refunds", "r1", "Bearer sk_test_123", url.Values{"payment_intent": {id}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "refund", body["object"])
	require.Equal(t, float64(700), body["amount"])

	getJSON := func(path string, v any) {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
	}
	var ledger fakepsp.Ledger
	getJSON("/_ledger", &ledger)
	require.Len(t, ledger.Charges, 2)
	require.Equal(t, id, ledger.Charges[0].ID)
	require.Equal(t, "k1", *ledger.Charges[0].IdempotencyKey)
	require.Len(t, ledger.Refunds, 1)
	require.Equal(t, "r1", *ledger.Refunds[0].IdempotencyKey)

	fr, err := http.Post(base+"/_admin/faults", "application/json", strings.NewReader(`{"latency_ms": 5, "lose_next": 2, "lose_mode": "stall"}`))
	require.NoError(t, err)
	fr.Body.Close()
	require.Equal(t, http.StatusOK, fr.StatusCode)
	var f fakepsp.Faults
	getJSON("/_admin/faults", &f)
	require.Equal(t, fakepsp.Faults{LatencyMS: 5, LoseNext: 2, LoseMode: fakepsp.LoseStall}, f)
	fr, err = http.Post(base+"/_admin/faults", "application/json", strings.NewReader(`{"error_rate": 2}`))
	require.NoError(t, err)
	fr.Body.Close()
	require.Equal(t, http.StatusBadRequest, fr.StatusCode)
	var stats fakepsp.Stats
	getJSON("/_admin/stats", &stats)
	require.Equal(t, int64(1), stats.Replays)
	require.Equal(t, int64(1), stats.IdempotencyMismatches)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}
