package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/acme/orders/client"
)

// Create an order. The call carries one Idempotency-Key however often it
// is retried, so it creates one order even if responses are lost.
func Example() {
	baseURL, token := exampleAPI() // e.g. "http://localhost:8080", "ord_…"
	c, err := client.New(baseURL, token, client.WithMaxAttempts(5))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var meta client.Meta
	o, err := c.CreateOrder(ctx, client.NewOrder{
		CustomerID: "c-1",
		Currency:   "EUR",
		Items:      []client.NewItem{{SKU: "book-42", Quantity: 2, UnitPrice: 1250}},
	}, client.WithMeta(&meta))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(meta.Status, o.Status, o.Version, o.Total, o.Currency)
	// Output: 201 pending 1 2500 EUR
}

// Read your own write: wait until the read model has the version a
// command returned.
func ExampleClient_WaitForVersion() {
	baseURL, token := exampleAPI()
	c, err := client.New(baseURL, token)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	o, err := c.CreateOrder(ctx, client.NewOrder{CustomerID: "c-1", Currency: "EUR",
		Items: []client.NewItem{{SKU: "book-42", Quantity: 1, UnitPrice: 1250}}})
	if err != nil {
		log.Fatal(err)
	}
	o, err = c.PayOrder(ctx, o.ID, "") // 202: payment_pending, version 2
	if err != nil {
		log.Fatal(err)
	}
	view, err := c.WaitForVersion(ctx, o.ID, o.Version)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(view.Status, view.Version)
	// Output: payment_pending 2
}

// An Idempotency-Key belongs to one request: reusing it with another body
// is refused, naming the fields that differ. Branch on the problem type,
// never on prose.
func ExampleIsMismatch() {
	baseURL, token := exampleAPI()
	c, err := client.New(baseURL, token)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	order := client.NewOrder{CustomerID: "c-1", Currency: "EUR",
		Items: []client.NewItem{{SKU: "book-42", Quantity: 1, UnitPrice: 1250}}}
	if _, err := c.CreateOrder(ctx, order, client.WithIdempotencyKey("order-4711")); err != nil {
		log.Fatal(err)
	}
	order.CustomerID = "c-2"
	_, err = c.CreateOrder(ctx, order, client.WithIdempotencyKey("order-4711"))
	var p *client.Problem
	if errors.As(err, &p) && client.IsMismatch(err) {
		fmt.Println(p.Status, p.Kind(), p.MismatchedFields)
	}
	// Output: 422 idempotency-key-mismatch [customer_id]
}

// A step the order can no longer take is a conflict that says its status.
func ExampleIsConflict() {
	baseURL, token := exampleAPI()
	c, err := client.New(baseURL, token)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	o, err := c.CreateOrder(ctx, client.NewOrder{CustomerID: "c-1", Currency: "EUR",
		Items: []client.NewItem{{SKU: "book-42", Quantity: 1, UnitPrice: 1250}}})
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.ShipOrder(ctx, o.ID) // not paid yet
	if client.IsConflict(err) {
		fmt.Println("cannot ship a", client.AsProblem(err).CurrentStatus, "order")
	}
	// Output: cannot ship a pending order
}
