package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/internal/invariant"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/stream"
)

// A randomized workload through the real api and projector: every read
// model converges on what the orders table implies, and stays exact when
// every event is delivered a second time under a new message id.
func TestConvergence(t *testing.T) {
	t.Parallel()
	env, api, token := startStack(t)

	const orders = 500
	workload(t, testenv.Pool(t, env["DATABASE_URL"]), []string{api}, token, "", orders, 8, 42)

	converged(t, env, "after the workload")
	if n := countRows(t, env, `SELECT count(*) FROM orders`); n != orders {
		t.Fatalf("%d orders, want %d", n, orders)
	}

	// Every event again, under a fresh Nats-Msg-Id (as a relay that was
	// down longer than the duplicate window would send it), in shuffled
	// order: nothing may change.
	copies := republishShuffled(t, env)
	waitIdle(t, env)
	converged(t, env, "after duplicating every event")
	if events := countRows(t, env, `SELECT count(*) FROM outbox`); copies != events {
		t.Fatalf("republished %d copies of %d events", copies, events)
	}
}

// runPlan creates order i and runs its steps, each retried once with the
// same key (the retry must replay exactly). A pay step that started a
// payment (202) is settled at once with a succeeded charge through
// testenv.SettlePayment, standing in for the payment worker, which this
// stack does not run.
func runPlan(t *testing.T, db postgres.DB, api, token, prefix string, i int, currency string, steps []string) error {
	body := fmt.Sprintf(`{"customer_id":"c-%d","currency":%q,"items":[{"sku":"s-%d","quantity":%d,"unit_price":%d}]}`,
		i%37, currency, i%5, 1+i%4, 100+i)
	created := call(t, http.MethodPost, api+"/v1/orders", token, fmt.Sprintf("%screate-%d", prefix, i), body)
	if created.status != http.StatusCreated {
		return fmt.Errorf("order %d: create %d %s", i, created.status, created.body)
	}
	var o struct {
		ID      string `json:"id"`
		Version int64  `json:"version"`
	}
	if err := json.Unmarshal([]byte(created.body), &o); err != nil {
		return err
	}
	for n, step := range steps {
		key := fmt.Sprintf("%s%s-%d-%d", prefix, step, i, n)
		method, path, payload := http.MethodPost, "/v1/orders/"+o.ID+"/"+step, ""
		header := map[string]string{}
		switch step {
		case "cancel":
			payload = `{"reason":"changed my mind"}`
		case "patch":
			method, path = http.MethodPatch, "/v1/orders/"+o.ID
			payload = `{"note":"leave at the door","shipping_address":{"name":"Ada","line1":"1 Main St","city":"Berlin","postal_code":"10115","country":"DE"}}`
			header["If-Match"] = fmt.Sprintf(`"%d"`, o.Version)
		}
		first := callWith(t, method, api+path, token, key, payload, header)
		again := callWith(t, method, api+path, token, key, payload, header)
		if again.body != first.body || again.status != first.status || again.header.Get("Idempotent-Replayed") != "true" {
			return fmt.Errorf("order %d %s: retry got %d %s, want the replay of %d %s", i, step, again.status, again.body, first.status, first.body)
		}
		switch {
		case first.status == http.StatusOK:
			if err := json.Unmarshal([]byte(first.body), &o); err != nil {
				return err
			}
		case first.status == http.StatusAccepted && step == "pay":
			if err := json.Unmarshal([]byte(first.body), &o); err != nil {
				return err
			}
			o.Version = testenv.SettlePayment(t, db, uuid.MustParse(o.ID), true).Version
		case first.status == http.StatusConflict && step == "cancel": // a shipped order
		default:
			return fmt.Errorf("order %d %s: %d %s", i, step, first.status, first.body)
		}
	}
	return nil
}

func callWith(t *testing.T, method, url, token, key, body string, header map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req, _ = http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return do(t, req)
}

// waitIdle waits until every projection's consumer has nothing pending and
// nothing awaiting an ack.
func waitIdle(t *testing.T, env map[string]string) {
	t.Helper()
	ctx := context.Background()
	js := testenv.JetStreamAt(t, env["NATS_URL"])
	for _, name := range invariant.Projections {
		testenv.Eventually(t, 60*time.Second, "consumer "+name+" is idle", func() bool {
			c, err := js.Consumer(ctx, stream.Name, name)
			if err != nil {
				t.Fatal(err)
			}
			info, err := c.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return info.NumPending == 0 && info.NumAckPending == 0
		})
	}
}

// republishShuffled publishes a copy of every event in the stream, in
// random order, each under a new Nats-Msg-Id, and returns how many.
func republishShuffled(t *testing.T, env map[string]string) int {
	t.Helper()
	ctx := context.Background()
	js := testenv.JetStreamAt(t, env["NATS_URL"])
	s, err := js.Stream(ctx, stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	for i, m := range msgs {
		if _, err := js.Publish(ctx, m.Subject, m.Data, jetstream.WithMsgID(fmt.Sprintf("copy-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	return len(msgs)
}
