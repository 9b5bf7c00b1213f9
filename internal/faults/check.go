package faults

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/fakepsp"
	"github.com/acme/orders/internal/invariant"
)

// check runs, once the system has drained (bounded by within: no payment or
// refund under way, then the read models converged), every invariant the
// suite holds the service to, and returns the violations and how many
// second charges the provider's ledger shows.
func check(ctx context.Context, s *stack, ops []*op, within time.Duration) ([]string, int, error) {
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/orders?sslmode=disable", s.pgPort))
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close(ctx)

	var out []string
	// Every payment and refund settles (the workers retry through every
	// provider fault).
	deadline := time.Now().Add(within)
	for {
		var pending int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM orders WHERE status = 'payment_pending' OR refund->>'status' = 'pending'`).Scan(&pending); err != nil {
			return nil, 0, fmt.Errorf("count unsettled payments: %w", err)
		}
		if pending == 0 {
			fmt.Fprintf(os.Stderr, "faults: every payment and refund settled %s into the drain check\n", time.Since(deadline.Add(-within)).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			out = append(out, fmt.Sprintf("%d orders still have a payment or refund under way after %s", pending, within))
			break
		}
		time.Sleep(250 * time.Millisecond)
	}

	// Read models agree with the write model, every event is published, each
	// projection's inbox holds each event once (G4, G5, G6).
	vs, err := invariant.Converge(ctx, conn, max(time.Until(deadline), 10*time.Second))
	if err != nil {
		return nil, 0, err
	}
	fmt.Fprintf(os.Stderr, "faults: read models converged %s into the drain check\n", time.Since(deadline.Add(-within)).Round(time.Millisecond))
	for _, v := range vs {
		out = append(out, v.String())
	}

	// Each key created at most one order (G1).
	rows, _ := conn.Query(ctx, `SELECT creating_key FROM orders GROUP BY tenant_id, creating_key HAVING count(*) > 1 LIMIT 5`)
	dup, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, 0, err
	}
	for _, k := range dup {
		out = append(out, "key "+k+" created more than one order")
	}

	// Each order has one event per step (paid once, shipped once, ...); an
	// order may be declined and pay again.
	rows, _ = conn.Query(ctx, `SELECT aggregate_id::text || ' ' || event_type || ' ×' || count(*) FROM outbox
		WHERE event_type NOT IN ('order.updated', 'payment.requested', 'order.payment_failed') GROUP BY aggregate_id, event_type HAVING count(*) > 1 LIMIT 5`)
	twice, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, 0, err
	}
	for _, t := range twice {
		out = append(out, "an order's step happened more than once: "+t)
	}

	// The provider's ledger agrees with our orders and payments rows (G8).
	ledger, err := s.pspLedger(ctx)
	if err != nil {
		return nil, 0, err
	}
	rows, _ = conn.Query(ctx, `SELECT id::text AS id, status, currency, total, paid_at IS NOT NULL AS paid,
		cancelled_at IS NOT NULL AS cancelled, coalesce(refund->>'status', '') AS refund FROM orders`)
	orders, err := pgx.CollectRows(rows, pgx.RowToStructByNameLax[orderRow])
	if err != nil {
		return nil, 0, fmt.Errorf("read orders: %w", err)
	}
	rows, _ = conn.Query(ctx, `SELECT order_id::text AS orderid, kind, idempotency_key AS key, provider_id AS providerid,
		currency, status, amount FROM payments`)
	payments, err := pgx.CollectRows(rows, pgx.RowToStructByNameLax[paymentRow])
	if err != nil {
		return nil, 0, fmt.Errorf("read payments: %w", err)
	}
	ledgerOut, secondCharges := ledgerViolations(ledger, orders, payments)
	out = append(out, ledgerOut...)

	// What the clients were told agrees with what happened.
	byID := map[string]orderRow{}
	for _, o := range orders {
		byID[o.ID] = o
	}
	var creatingKey, id string
	var total int64
	byKey := map[string]orderRow{}
	rows, _ = conn.Query(ctx, `SELECT creating_key, id::text, total FROM orders WHERE tenant_id = 'faults'`)
	if _, err := pgx.ForEachRow(rows, []any{&creatingKey, &id, &total}, func() error {
		byKey[creatingKey] = byID[id]
		return nil
	}); err != nil {
		return nil, 0, err
	}
	out = append(out, opViolations(ops, byKey, byID)...)
	return out, secondCharges, nil
}

// opViolations holds each client operation's answer against the orders as
// they are after the drain (by creating key and by id).
func opViolations(ops []*op, byKey, byID map[string]orderRow) []string {
	var out []string
	for _, o := range ops {
		got, ok := byID[o.OrderID]
		switch {
		case o.Kind == "create" && o.Status == http.StatusCreated && o.Order == nil:
			out = append(out, fmt.Sprintf("create %s answered 201 with no readable order: %v", o.Key, o.Err))
		case o.Kind == "create" && o.Status == http.StatusCreated:
			created := o.Order
			got, ok := byKey[o.Key]
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("create %s succeeded (order %s) but no order has its key", o.Key, created.ID))
			case got.ID != created.ID || got.Total != o.Total || created.Total != o.Total:
				out = append(out, fmt.Sprintf("create %s answered order %s total %d; the order with its key is %s total %d; asked %d",
					o.Key, created.ID, created.Total, got.ID, got.Total, o.Total))
			}
		case o.Kind == "create" && o.Status != 0:
			if _, ok := byKey[o.Key]; ok {
				out = append(out, fmt.Sprintf("create %s was refused (%d) but created an order", o.Key, o.Status))
			}
		case o.Kind != "create" && o.Status != 0 && !ok:
			out = append(out, fmt.Sprintf("%s %s answered %d for order %s, which does not exist", o.Kind, o.Key, o.Status, o.OrderID))
		case o.Kind == "pay" && (o.Status == http.StatusAccepted || o.Status == http.StatusOK):
			// A new attempt (202) or one under way or done (200): either
			// way the order went through a payment, which has settled.
			if !got.Paid && got.Status != "payment_failed" && got.Status != "cancelled" {
				out = append(out, fmt.Sprintf("pay %s of order %s answered %d but the order is %s, never paid", o.Key, o.OrderID, o.Status, got.Status))
			}
			if o.Settled == "paid" && !got.Paid {
				out = append(out, fmt.Sprintf("the client of pay %s saw order %s paid, but it has no paid_at", o.Key, o.OrderID))
			}
		case o.Kind == "pay" && o.Status == http.StatusConflict:
			if got.Status != "cancelled" && got.Status != "shipped" {
				out = append(out, fmt.Sprintf("pay %s of order %s was refused 409 but the order is %s", o.Key, o.OrderID, got.Status))
			}
		case o.Kind == "ship" && o.Status == http.StatusOK:
			if got.Status != "shipped" || !got.Paid {
				out = append(out, fmt.Sprintf("ship %s of order %s succeeded but the order is %s (paid %t)", o.Key, o.OrderID, got.Status, got.Paid))
			}
		case o.Kind == "cancel" && o.Status == http.StatusOK:
			if !got.Cancelled {
				out = append(out, fmt.Sprintf("cancel %s of order %s succeeded but the order is %s", o.Key, o.OrderID, got.Status))
			}
		}
		if len(out) > 50 {
			break
		}
	}
	return out
}

// orderRow is what the ledger check needs of an order (our write model).
type orderRow struct {
	ID, Status, Currency string
	Total                int64
	Paid, Cancelled      bool   // paid_at, cancelled_at set
	Refund               string // refund->>'status': "", pending, succeeded, failed
}

// paymentRow is one row of our payments table.
type paymentRow struct {
	OrderID, Kind, Key, ProviderID, Currency, Status string
	Amount                                           int64
}

// providerStatus is the ledger's statuses of each of our payments
// statuses, by kind: a declined charge is requires_payment_method (the
// card declined it) or canceled (it waited for the customer to
// authenticate, and the worker cancelled it); one left in requires_action
// agrees with nothing of ours: the customer could still make it charge.
var providerStatus = map[string]map[string][]string{
	"charge": {"succeeded": {"succeeded"}, "declined": {"requires_payment_method", "canceled"}},
	"refund": {"succeeded": {"succeeded"}, "failed": {"failed"}},
}

// ledgerViolations holds the provider's ledger against our orders and
// payments rows (G8): every paid order (shipped, cancelled after paid too)
// has exactly one succeeded charge for its total and currency and no other
// order has one; every cancelled paid order whose refund succeeded has
// exactly one succeeded refund of its total, and no other order has one; no
// refund is still pending; no idempotency key was used twice; each ledger
// entry has a payments row that agrees with it to the cent, and the other
// way round. secondCharges counts succeeded charges beyond an order's first
// plus charges made again under a key already charged.
func ledgerViolations(l fakepsp.Ledger, orders []orderRow, rows []paymentRow) (out []string, secondCharges int) {
	type entry struct {
		kind, order, key, id, charge, status, currency string
		amount                                         int64
	}
	// The provider counts some currencies in other units than ours
	// (domain.ChargeUnits); one that is no whole number of ours is -1,
	// which no row of ours agrees with.
	minor := func(currency string, units int64) int64 {
		if amount, ok := domain.FromChargeUnits(strings.ToUpper(currency), units); ok {
			return amount
		}
		return -1
	}
	var entries []entry
	for _, c := range l.Charges {
		entries = append(entries, entry{"charge", orderOf(c.Metadata, deref(c.IdempotencyKey)), deref(c.IdempotencyKey), c.ID, c.ChargeID, c.Status, c.Currency, minor(c.Currency, c.Amount)})
	}
	for _, r := range l.Refunds {
		entries = append(entries, entry{"refund", orderOf(r.Metadata, deref(r.IdempotencyKey)), deref(r.IdempotencyKey), r.ID, r.ID, r.Status, r.Currency, minor(r.Currency, r.Amount)})
	}
	ours := map[string]paymentRow{}
	for _, r := range rows {
		ours[r.Key] = r
	}
	byKey := map[string]int{}
	succeeded := map[string][]entry{} // kind + " " + order id → succeeded entries
	for _, e := range entries {
		if e.key == "" {
			out = append(out, fmt.Sprintf("provider %s %s has no idempotency key", e.kind, e.id))
			continue
		}
		if byKey[e.key]++; byKey[e.key] > 1 && e.kind == "charge" {
			secondCharges++
		}
		if e.status == "succeeded" {
			succeeded[e.kind+" "+e.order] = append(succeeded[e.kind+" "+e.order], e)
		}
		r, ok := ours[e.key]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("provider %s %s (key %s) has no payments row", e.kind, e.id, e.key))
		case r.Kind != e.kind || r.OrderID != e.order || (r.ProviderID != e.id && r.ProviderID != e.charge) ||
			!slices.Contains(providerStatus[r.Kind][r.Status], e.status) || r.Amount != e.amount || !strings.EqualFold(r.Currency, e.currency):
			out = append(out, fmt.Sprintf("payments row %s: ours %s %s %s %d %s, provider's %s %s %d %s",
				r.Key, r.Kind, r.ProviderID, r.Status, r.Amount, r.Currency, e.id, e.status, e.amount, e.currency))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		if byKey[k] > 1 {
			out = append(out, fmt.Sprintf("key %s charged %d times", k, byKey[k]))
		}
	}
	for _, r := range rows {
		// A decline or failed refund with no provider id made nothing:
		// the provider spent its key on a stored 500 (provider_failed).
		if byKey[r.Key] == 0 && (r.ProviderID != "" || r.Status == "succeeded") {
			out = append(out, fmt.Sprintf("payments row %s (%s %s) has no provider record", r.Key, r.Kind, r.ProviderID))
		}
	}
	known := map[string]bool{}
	for _, o := range orders {
		known[o.ID] = true
		charges, refunds := succeeded["charge "+o.ID], succeeded["refund "+o.ID]
		want := 0
		if o.Paid {
			want = 1
		}
		if len(charges) != want {
			out = append(out, fmt.Sprintf("order %s (%s) has %d succeeded charges, want %d", o.ID, o.Status, len(charges), want))
		}
		secondCharges += max(0, len(charges)-1)
		for _, c := range charges {
			if c.amount != o.Total || !strings.EqualFold(c.currency, o.Currency) {
				out = append(out, fmt.Sprintf("order %s charged %d %s, its total is %d %s", o.ID, c.amount, c.currency, o.Total, o.Currency))
			}
		}
		if o.Refund == "pending" {
			out = append(out, fmt.Sprintf("order %s refund still pending after the drain", o.ID))
			continue
		}
		want = 0
		if o.Paid && o.Cancelled && o.Refund == "succeeded" {
			want = 1
		}
		if o.Paid && o.Cancelled && o.Refund != "succeeded" && o.Refund != "failed" {
			out = append(out, fmt.Sprintf("order %s was cancelled after it was paid but its refund is %q", o.ID, o.Refund))
		}
		if len(refunds) != want {
			out = append(out, fmt.Sprintf("order %s (%s, refund %s) has %d succeeded refunds, want %d", o.ID, o.Status, o.Refund, len(refunds), want))
		}
		for _, r := range refunds {
			if r.amount != o.Total || !strings.EqualFold(r.currency, o.Currency) {
				out = append(out, fmt.Sprintf("order %s refunded %d %s, its total is %d %s", o.ID, r.amount, r.currency, o.Total, o.Currency))
			}
		}
	}
	for _, e := range entries {
		if !known[e.order] {
			out = append(out, fmt.Sprintf("provider %s %s is for order %q, which we do not have", e.kind, e.id, e.order))
		}
	}
	return out, secondCharges
}

// orderOf is the order a provider entry is for: its metadata's order_id,
// else the id in its key (<tenant>:order:<id>:charge|refund:<attempt>).
func orderOf(metadata map[string]string, key string) string {
	if id := metadata["order_id"]; id != "" {
		return id
	}
	if _, rest, ok := strings.Cut(key, ":order:"); ok {
		id, _, _ := strings.Cut(rest, ":")
		return id
	}
	return ""
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
