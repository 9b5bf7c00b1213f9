package projection

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
)

// lifecycleEvents returns the envelopes of one order created, paid, shipped.
func lifecycleEvents(t *testing.T, customer string) []domain.Envelope {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	o, created, err := domain.CreateOrder(uuid.Must(uuid.NewV7()), "t1", domain.NewOrder{
		CustomerID: customer, Currency: "EUR", Lines: []domain.Line{{SKU: "s", Quantity: 2, UnitPrice: 500}},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	var envs []domain.Envelope
	add := func(e domain.Event) {
		env, err := domain.NewEnvelope(uuid.Must(uuid.NewV7()), o, e, o.UpdatedAt)
		if err != nil {
			t.Fatal(err)
		}
		envs = append(envs, env)
	}
	add(created)
	paid, err := legacyPay(&o, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	add(paid)
	shipped, err := o.Ship(now.Add(2 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	add(shipped)
	return envs
}

// Events of one order arrive v1, v3, v2, and every one of them twice more
// under new message ids: every projection ends exactly where the order is.
func TestEveryProjectionAppliesInVersionOrderAndOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{GapDelay: 20 * time.Millisecond})
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	runners := []*Runner{f.runner}
	for _, p := range []Projection{CustomerSummaries{}, DailySales{}} {
		runners = append(runners, mustRunner(t, f.db, f.js, p, logger, Config{GapDelay: 20 * time.Millisecond}))
	}
	for _, r := range runners[1:] {
		fr := f
		fr.runner = r
		fr.run(t)
	}
	f.run(t)

	envs := lifecycleEvents(t, "c-9")
	for _, i := range []int{0, 2, 1} {
		f.publish(t, envs[i], envs[i].ID.String())
	}
	for copyNo, i := range []int{2, 1, 0, 1} {
		f.publish(t, envs[i], envs[i].ID.String()+"-copy-"+string(rune('a'+copyNo)))
	}

	for _, r := range runners {
		eventually(t, r.proj.Name()+" has applied 3 events and skipped 4 copies", func() bool {
			s := r.Stats()
			return s.Applied == 3 && s.Duplicates+s.Stale == 4
		})
	}
	ctx := context.Background()
	var status string
	var version int64
	if err := f.db.QueryRow(ctx, `SELECT status, version FROM order_views WHERE order_id = $1`, envs[0].AggregateID).Scan(&status, &version); err != nil {
		t.Fatal(err)
	}
	if status != "shipped" || version != 3 {
		t.Fatalf("order view: %s v%d, want shipped v3", status, version)
	}
	var pending, paid, shipped, totalPaid int64
	if err := f.db.QueryRow(ctx, `SELECT orders_pending, orders_paid, orders_shipped, total_paid FROM customer_summaries WHERE customer_id = 'c-9'`).
		Scan(&pending, &paid, &shipped, &totalPaid); err != nil {
		t.Fatal(err)
	}
	if pending != 0 || paid != 0 || shipped != 1 || totalPaid != 1000 {
		t.Fatalf("summary: pending %d paid %d shipped %d total_paid %d; want 0 0 1 1000", pending, paid, shipped, totalPaid)
	}
	var orders, paidAmount int64
	if err := f.db.QueryRow(ctx, `SELECT sum(orders), sum(paid_amount) FROM daily_sales`).Scan(&orders, &paidAmount); err != nil {
		t.Fatal(err)
	}
	if orders != 1 || paidAmount != 1000 {
		t.Fatalf("daily sales: %d orders, %d paid; want 1 and 1000", orders, paidAmount)
	}
	for _, name := range []string{"order_views", "customer_summaries", "daily_sales"} {
		if n := f.count(t, `SELECT count(*) FROM inbox WHERE projection = $1`, name); n != 3 {
			t.Fatalf("%s inbox rows = %d, want 3", name, n)
		}
	}
}
