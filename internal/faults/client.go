package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// op is one logical operation of a client and its final answer.
type op struct {
	Kind     string // create, pay, ship, cancel
	Key      string
	OrderID  string
	Body     string // what a create or pay asked for
	Attempts int
	Status   int // final status; 0 if the client gave up
	Response []byte
	Total    int64 // expected total of a create
	// Settled is the order's status a pay's client saw once the payment
	// settled (paid, payment_failed, or shipped/cancelled meanwhile); ""
	// if it did not see it settle within its patience.
	Settled string
}

// definitive reports whether the answer settles the operation: a success,
// or a refusal that retrying would not change.
func definitive(status int, body []byte) bool {
	switch {
	case status >= 500, status == http.StatusTooManyRequests:
		return false
	case status == http.StatusConflict && bytes.Contains(body, []byte("idempotency-key-in-flight")):
		return false
	}
	return true
}

// client behaves like a careful real client: every logical operation gets
// one Idempotency-Key and is sent again, with the same key and body, to any
// api replica, after timeouts, connection errors, 409 in-flight and 5xx,
// with jittered exponential backoff, until a definitive answer or its
// deadline.
type client struct {
	id       int
	apis     []string // base URLs (through the proxies)
	token    string
	rng      *rand.Rand
	http     *http.Client
	deadline time.Duration // per operation
	ops      []*op
	orders   []*clientOrder // orders this client created
	retries  *atomic.Int64
}

// declining is the test card the clients pay with now and then: the
// provider declines it, and the client pays again with the default card.
const declining = "pm_card_chargeDeclined"

// clientOrder is what a client knows of an order it created.
type clientOrder struct {
	id   string
	paid bool // the client saw it paid (and has not shipped or cancelled it)
}

func (c *client) run(ctx context.Context, wg *sync.WaitGroup) {
	defer wg.Done()
	for n := 0; ctx.Err() == nil; n++ {
		kind := "create"
		if len(c.orders) > 0 && c.rng.IntN(10) >= 4 {
			kind = []string{"pay", "pay", "ship", "cancel"}[c.rng.IntN(4)]
		}
		var paid []*clientOrder
		for _, o := range c.orders {
			if o.paid {
				paid = append(paid, o)
			}
		}
		if kind == "ship" && len(paid) == 0 {
			kind = "pay" // ship only what was seen paid
		}
		o := &op{Kind: kind, Key: fmt.Sprintf("%s-%d-%d", kind, c.id, n)}
		method, path, body := http.MethodPost, "/v1/orders", ""
		var target *clientOrder
		switch kind {
		case "create":
			qty, price := 1+c.rng.Int64N(5), 100+c.rng.Int64N(10000)
			currency := []string{"EUR", "USD", "JPY"}[c.rng.IntN(3)]
			body = fmt.Sprintf(`{"customer_id":"c-%d-%d","currency":%q,"items":[{"sku":"s-%d","quantity":%d,"unit_price":%d}]}`,
				c.id, c.rng.IntN(5), currency, c.rng.IntN(20), qty, price)
			o.Body, o.Total = body, qty*price
		case "ship":
			target = paid[c.rng.IntN(len(paid))]
		case "cancel":
			if len(paid) > 0 && c.rng.IntN(2) == 0 {
				target = paid[c.rng.IntN(len(paid))] // a paid order: its cancel asks for a refund
			} else {
				target = c.orders[c.rng.IntN(len(c.orders))]
			}
			body = `{"reason":"fault suite"}`
		case "pay":
			target = c.orders[c.rng.IntN(len(c.orders))]
			if c.rng.IntN(6) == 0 {
				body = `{"payment_method":"` + declining + `"}`
			}
		}
		if target != nil {
			o.OrderID, o.Body = target.id, body
			path = "/v1/orders/" + target.id + "/" + kind
		}
		c.do(o, method, path, body)
		c.ops = append(c.ops, o)
		switch {
		case kind == "create" && o.Status == http.StatusCreated:
			var created struct{ ID string }
			_ = json.Unmarshal(o.Response, &created)
			o.OrderID = created.ID
			c.orders = append(c.orders, &clientOrder{id: created.ID})
		case kind == "pay" && (o.Status == http.StatusAccepted || o.Status == http.StatusOK):
			o.Settled = c.awaitPayment(target.id)
			target.paid = o.Settled == "paid"
			if o.Settled == "payment_failed" && body != "" && ctx.Err() == nil {
				// Declined: pay again with the default card, as a buyer would.
				again := &op{Kind: "pay", Key: fmt.Sprintf("pay-again-%d-%d", c.id, n), OrderID: target.id}
				c.do(again, http.MethodPost, path, "")
				c.ops = append(c.ops, again)
				if again.Status == http.StatusAccepted || again.Status == http.StatusOK {
					again.Settled = c.awaitPayment(target.id)
					target.paid = again.Settled == "paid"
				}
			}
		case kind == "ship" || kind == "cancel":
			if o.Status != 0 {
				target.paid = false // shipped or cancelled (or refused: no longer shippable)
			}
		}
	}
}

// settledStatuses are the order statuses at which a payment is no longer
// under way.
var settledStatuses = map[string]bool{"paid": true, "payment_failed": true, "shipped": true, "cancelled": true}

// awaitPayment polls the order (the read model, through any api) until its
// payment settled, for up to 20 s, and returns the status it then had ("" if
// it did not see it settle).
func (c *client) awaitPayment(id string) string {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		status, b, err := c.send(http.MethodGet, c.apis[c.rng.IntN(len(c.apis))]+"/v1/orders/"+id, "", "")
		if err == nil && status == http.StatusOK {
			var got struct{ Status string }
			if json.Unmarshal(b, &got) == nil && settledStatuses[got.Status] {
				return got.Status
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return ""
}

// do sends the operation until it has a definitive answer or its deadline.
// It does not stop for ctx: an operation once begun is seen through, as a
// real client would.
func (c *client) do(o *op, method, path, body string) {
	deadline := time.Now().Add(c.deadline)
	backoff := 50 * time.Millisecond
	for {
		o.Attempts++
		if o.Attempts > 1 {
			c.retries.Add(1)
		}
		status, resp, err := c.send(method, c.apis[c.rng.IntN(len(c.apis))]+path, o.Key, body)
		if err == nil && definitive(status, resp) {
			o.Status, o.Response = status, resp
			return
		}
		if time.Now().After(deadline) {
			return // gave up: the operation's outcome is unknown to the client
		}
		time.Sleep(time.Duration(c.rng.Int64N(int64(backoff))) + backoff/2) // jitter
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (c *client) send(method, url, key, body string) (int, []byte, error) {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, nil, errors.Join(errors.New("response cut short"), err)
	}
	return res.StatusCode, b, nil
}
