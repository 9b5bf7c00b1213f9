package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	apiclient "github.com/acme/orders/client"
)

// op is one logical operation of a client and its final answer.
type op struct {
	Kind     string // create, pay, ship, cancel
	Key      string // the Idempotency-Key every attempt carried (apiclient.Meta)
	OrderID  string
	Body     string // what a create or pay asked for (for the report)
	Attempts int
	// Status is the final answer's status; 0 if the client gave up (its
	// outcome is unknown to it, whatever the last answer was).
	Status int
	// Order is the order a successful answer carried.
	Order *apiclient.Order
	Err   error // the client's error, if the call did not succeed
	Total int64 // expected total of a create
	// Settled is the order's status a pay's client saw once the payment
	// settled (paid, payment_failed, or shipped/cancelled meanwhile); ""
	// if it did not see it settle within its patience.
	Settled string
}

// newAPIClient returns the client.Client a fault-suite client drives the api
// with: every attempt goes to a random api replica (through its proxy), each
// attempt is bounded by attemptTimeout, and a logical call is retried (same
// key, same body) with jittered exponential backoff from 50 ms to 2 s until
// its context ends — the patience of a careful real client.
func newAPIClient(apis []string, token string, seed uint64, attemptTimeout time.Duration) (*apiclient.Client, error) {
	if len(apis) == 0 {
		return nil, errors.New("fault client: no api")
	}
	rt := &anyReplica{apis: apis, rng: rand.New(rand.NewPCG(seed, 7)), next: http.DefaultTransport}
	c, err := apiclient.New(apis[0], token,
		apiclient.WithHTTPClient(&http.Client{Timeout: attemptTimeout, Transport: rt}),
		apiclient.WithMaxAttempts(1<<30),
		apiclient.WithBackoff(50*time.Millisecond, 2*time.Second))
	if err != nil {
		return nil, fmt.Errorf("fault client: %w", err)
	}
	return c, nil
}

// anyReplica sends each request to a random one of apis (same path, query,
// headers and body): a retry may reach another replica than the attempt
// before, as behind a load balancer.
type anyReplica struct {
	apis []string // http://host:port
	next http.RoundTripper
	mu   sync.Mutex
	rng  *rand.Rand
}

// RoundTrip sends r to a random replica.
func (a *anyReplica) RoundTrip(r *http.Request) (*http.Response, error) {
	a.mu.Lock()
	base := a.apis[a.rng.IntN(len(a.apis))]
	a.mu.Unlock()
	u, err := r.URL.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("replica %q: %w", base, err)
	}
	r = r.Clone(r.Context())
	r.URL.Scheme, r.URL.Host, r.Host = u.Scheme, u.Host, u.Host
	return a.next.RoundTrip(r)
}

// client behaves like a careful real client, through apiclient.Client: every
// logical operation gets one Idempotency-Key and is sent again, with the
// same key and body, to any api replica, after timeouts, connection errors,
// 409 in-flight, 429 and 5xx, with full-jitter exponential backoff, until a
// definitive answer or its deadline.
type client struct {
	id       int
	api      *apiclient.Client
	rng      *rand.Rand
	deadline time.Duration // per operation
	ops      []*op
	orders   []*clientOrder // orders this client created
	retries  *atomic.Int64
}

// declining is the test card the clients pay with now and then: the
// provider declines it, and the client pays again with the default card.
// authenticating asks the customer to authenticate (3D Secure), which the
// worker cannot: the worker cancels the PaymentIntent and declines it.
const (
	declining      = "pm_card_chargeDeclined"
	authenticating = "pm_card_authenticationRequired"
)

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
		o := &op{Kind: kind}
		var call func(context.Context, ...apiclient.CallOption) (*apiclient.Order, error)
		var target *clientOrder
		switch kind {
		case "create":
			qty, price := 1+c.rng.Int64N(5), 100+c.rng.Int64N(10000)
			currency := []string{"EUR", "USD", "JPY"}[c.rng.IntN(3)]
			no := apiclient.NewOrder{CustomerID: fmt.Sprintf("c-%d-%d", c.id, c.rng.IntN(5)), Currency: currency,
				Items: []apiclient.NewItem{{SKU: fmt.Sprintf("s-%d", c.rng.IntN(20)), Quantity: qty, UnitPrice: price}}}
			o.Body, o.Total = fmt.Sprintf("%+v", no), qty*price
			call = func(ctx context.Context, opts ...apiclient.CallOption) (*apiclient.Order, error) {
				return c.api.CreateOrder(ctx, no, opts...)
			}
		case "ship":
			target = paid[c.rng.IntN(len(paid))]
			call = func(ctx context.Context, opts ...apiclient.CallOption) (*apiclient.Order, error) {
				return c.api.ShipOrder(ctx, target.id, opts...)
			}
		case "cancel":
			if len(paid) > 0 && c.rng.IntN(2) == 0 {
				target = paid[c.rng.IntN(len(paid))] // a paid order: its cancel asks for a refund
			} else {
				target = c.orders[c.rng.IntN(len(c.orders))]
			}
			call = func(ctx context.Context, opts ...apiclient.CallOption) (*apiclient.Order, error) {
				return c.api.CancelOrder(ctx, target.id, "fault suite", opts...)
			}
		case "pay":
			target = c.orders[c.rng.IntN(len(c.orders))]
			switch c.rng.IntN(12) {
			case 0, 1:
				o.Body = declining
			case 2:
				o.Body = authenticating
			}
			call = c.pay(target.id, o.Body)
		}
		if target != nil {
			o.OrderID = target.id
		}
		c.do(o, call)
		c.ops = append(c.ops, o)
		switch {
		case kind == "create" && o.Status == http.StatusCreated:
			o.OrderID = o.Order.ID
			c.orders = append(c.orders, &clientOrder{id: o.Order.ID})
		case kind == "pay" && (o.Status == http.StatusAccepted || o.Status == http.StatusOK):
			o.Settled = c.awaitPayment(target.id)
			target.paid = o.Settled == "paid"
			if o.Settled == "payment_failed" && o.Body != "" && ctx.Err() == nil {
				// Declined: pay again with the default card, as a buyer would.
				again := &op{Kind: "pay", OrderID: target.id}
				c.do(again, c.pay(target.id, ""))
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

// pay is the call of a pay with method ("" for the default card).
func (c *client) pay(id, method string) func(context.Context, ...apiclient.CallOption) (*apiclient.Order, error) {
	return func(ctx context.Context, opts ...apiclient.CallOption) (*apiclient.Order, error) {
		return c.api.PayOrder(ctx, id, method, opts...)
	}
}

// settledStatuses are the order statuses at which a payment is no longer
// under way.
var settledStatuses = map[string]bool{"paid": true, "payment_failed": true, "shipped": true, "cancelled": true}

// awaitPayment polls the order (the read model, through any api) until its
// payment settled, for up to 20 s, and returns the status it then had ("" if
// it did not see it settle).
func (c *client) awaitPayment(id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		got, err := c.api.GetOrder(ctx, id)
		if err == nil && settledStatuses[got.Status] {
			return got.Status
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return ""
}

// do runs the logical operation call through the client until it has a
// definitive answer or its deadline, and records the key, the attempts and
// the answer in o. It does not stop for the run's context: an operation
// once begun is seen through, as a real client would.
func (c *client) do(o *op, call func(context.Context, ...apiclient.CallOption) (*apiclient.Order, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
	defer cancel()
	var meta apiclient.Meta
	order, err := call(ctx, apiclient.WithMeta(&meta))
	o.Key, o.Attempts, o.Order, o.Err = meta.IdempotencyKey, meta.Attempts, order, err
	c.retries.Add(int64(max(0, meta.Attempts-1)))
	if meta.Definitive {
		o.Status = meta.Status // else 0: gave up, the outcome is unknown to the client
	}
}
