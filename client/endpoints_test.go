package client_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/client"
	"github.com/acme/orders/internal/testenv"
)

// Every endpoint through its typed method, against the real stack: an
// order's life with read-your-writes at each step.
func TestEveryEndpoint(t *testing.T) {
	t.Parallel()
	env, api := stack()
	c, _ := newClient(t, api)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var meta client.Meta
	o, err := c.CreateOrder(ctx, newOrder("c-life"), client.WithMeta(&meta))
	if err != nil || meta.Status != http.StatusCreated || meta.Location != "/v1/orders/"+o.ID || meta.ETag != `"1"` || meta.KeyExpires.IsZero() {
		t.Fatalf("create: %v, meta %+v", err, meta)
	}
	createKey := meta.IdempotencyKey
	if o.Total != 3998 || len(o.Items) != 1 || o.Items[0].LineTotal != 3998 {
		t.Fatalf("created %+v", o)
	}
	if v, err := c.WaitForVersion(ctx, o.ID, 1); err != nil || v.ID != o.ID || v.Version != 1 {
		t.Fatalf("WaitForVersion 1: %+v, %v", v, err)
	}

	note := "ring twice"
	addr := &client.Address{Name: "Ada", Line1: "1 Main St", City: "Berlin", PostalCode: "10115", Country: "DE"}
	if _, err := c.UpdateOrder(ctx, o.ID, 7, client.OrderUpdate{Note: &note}); !client.IsPreconditionFailed(err) {
		t.Fatalf("update with a stale version: %v; want precondition-failed", err)
	}
	o, err = c.UpdateOrder(ctx, o.ID, 1, client.OrderUpdate{Note: &note, ShippingAddress: addr})
	if err != nil || o.Version != 2 || o.Note != note || o.ShippingAddress == nil || *o.ShippingAddress != *addr {
		t.Fatalf("update: %+v, %v", o, err)
	}

	o, err = c.PayOrder(ctx, o.ID, "pm_card_visa", client.WithMeta(&meta))
	if err != nil || meta.Status != http.StatusAccepted || o.Status != "payment_pending" || o.Version != 3 || o.Payment == nil || o.Payment.Method != "pm_card_visa" {
		t.Fatalf("pay: %+v, %v, status %d", o, err, meta.Status)
	}
	if _, err := c.CancelOrder(ctx, o.ID, "too early"); !client.IsConflict(err) {
		t.Fatalf("cancel while payment_pending: %v; want a conflict", err)
	}
	paid := testenv.SettlePayment(t, testenv.Pool(t, env["DATABASE_URL"]), uuid.MustParse(o.ID), true)
	o, err = c.WaitForVersion(ctx, o.ID, paid.Version)
	if err != nil || o.Status != "paid" || o.Version != paid.Version {
		t.Fatalf("WaitForVersion %d: %+v, %v", paid.Version, o, err)
	}
	if _, err := c.ShipOrder(ctx, o.ID, client.WithIfMatch(o.Version-1)); !client.IsPreconditionFailed(err) {
		t.Fatalf("ship at a stale version: %v; want precondition-failed", err)
	}
	o, err = c.ShipOrder(ctx, o.ID, client.WithIfMatch(o.Version), client.WithRequestID("ship-1"), client.WithMeta(&meta))
	if err != nil || o.Status != "shipped" || meta.RequestID != "ship-1" {
		t.Fatalf("ship: %+v, %v, request id %q", o, err, meta.RequestID)
	}

	other, err := c.CreateOrder(ctx, newOrder("c-life"))
	if err != nil {
		t.Fatal(err)
	}
	other, err = c.CancelOrder(ctx, other.ID, "ordered twice")
	if err != nil || other.Status != "cancelled" {
		t.Fatalf("cancel: %+v, %v", other, err)
	}
	if _, err := c.RefundOrder(ctx, other.ID); !client.IsConflict(err) {
		t.Fatalf("refund of an order never paid: %v; want a conflict", err)
	}

	sum, err := c.WaitForSummary(ctx, "c-life", client.Position{OrderID: o.ID, Version: o.Version})
	if err != nil || sum.Orders["shipped"] != 1 || len(sum.Totals) != 1 || sum.Totals[0].Paid.Int64() != 3998 {
		t.Fatalf("summary: %+v, %v", sum, err)
	}
	if _, err := c.WaitForVersion(ctx, other.ID, other.Version); err != nil {
		t.Fatal(err)
	}
	first, err := c.ListOrders(ctx, client.ListOptions{CustomerID: "c-life", Limit: 1})
	if err != nil || len(first.Orders) != 1 || first.Orders[0].ID != o.ID || first.NextCursor == "" {
		t.Fatalf("list page 1: %+v, %v", first, err)
	}
	second, err := c.ListOrders(ctx, client.ListOptions{CustomerID: "c-life", Limit: 1, Cursor: first.NextCursor})
	if err != nil || len(second.Orders) != 1 || second.Orders[0].ID != other.ID {
		t.Fatalf("list page 2: %+v, %v", second, err)
	}
	if last, err := c.ListOrders(ctx, client.ListOptions{Status: "cancelled"}); err != nil || len(last.Orders) != 1 || last.NextCursor != "" {
		t.Fatalf("list cancelled: %+v, %v", last, err)
	}

	testenv.Eventually(t, 10*time.Second, "daily sales show the payment", func() bool {
		ds, err := c.DailySales(ctx, client.DailySalesOptions{Currency: "EUR"})
		if err != nil {
			t.Fatal(err)
		}
		return len(ds.Days) == 1 && ds.Days[0].Orders == 2 && ds.Days[0].PaidAmount.Int64() == 3998
	})

	info, err := c.IdempotencyKey(ctx, createKey)
	if err != nil || len(info.Records) != 1 || info.Records[0].Scope != "POST /v1/orders" ||
		info.Records[0].Response.Status != 201 || info.Records[0].Response.Location == "" {
		t.Fatalf("key lookup: %+v, %v", info, err)
	}
	if _, err := c.IdempotencyKey(ctx, "never-used"); !client.IsNotFound(err) {
		t.Fatalf("unknown key: %v; want not-found", err)
	}
}

// New refuses settings that cannot work, naming them.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		base, token string
		opts        []client.Option
	}{
		{"localhost:8080", "ord_x", nil},
		{"http://", "ord_x", nil},
		{"http://localhost:8080", "", nil},
		{"http://localhost:8080", "ord_x", []client.Option{client.WithMaxAttempts(-1)}},
		{"http://localhost:8080", "ord_x", []client.Option{client.WithBackoff(time.Second, time.Millisecond)}},
	} {
		if _, err := client.New(tc.base, tc.token, tc.opts...); err == nil {
			t.Errorf("New(%q, %q, …) accepted", tc.base, tc.token)
		}
	}
	if _, err := client.New("http://localhost:8080/", "ord_x"); err != nil {
		t.Fatal(err)
	}
}

// WaitForVersion asks again after each view-behind answer until the read
// model has the version.
func TestWaitForVersionRetriesViewBehind(t *testing.T) {
	t.Parallel()
	env, _ := stack()
	p, base := newProxy(t, func(int) fault { return pass })
	c, _ := newClient(t, base)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o, err := c.CreateOrder(ctx, newOrder("c-1"))
	if err == nil {
		o, err = c.PayOrder(ctx, o.ID, "")
	}
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		o   *client.Order
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := c.WaitForVersion(ctx, o.ID, o.Version+1, client.WithWait(0))
		done <- result{v, err}
	}()
	testenv.Eventually(t, 10*time.Second, "two view-behind answers", func() bool {
		n := 0
		for _, a := range p.seen() {
			if a.method == http.MethodGet && a.status == http.StatusPreconditionFailed {
				n++
			}
		}
		return n >= 2
	})
	testenv.SettlePayment(t, testenv.Pool(t, env["DATABASE_URL"]), uuid.MustParse(o.ID), true)
	r := <-done
	if r.err != nil || r.o.Status != "paid" || r.o.Version != o.Version+1 {
		t.Fatalf("WaitForVersion: %+v, %v; want the paid order", r.o, r.err)
	}
}
