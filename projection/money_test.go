package projection

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
)

// moneyDay is the day every event of the money tests happens on.
var moneyDay = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// paidOrder returns the events of one order of customer c-1 created, asked
// to pay and charged with total (v1 to v3), and, if cancel, cancelled, its
// refund requested and confirmed (v4 to v6). Totals above
// domain.MaxAmount are what orders placed before that limit can carry.
func paidOrder(t *testing.T, total int64, cancel bool) []domain.Envelope {
	t.Helper()
	o := domain.Order{ID: uuid.Must(uuid.NewV7()), TenantID: "t1", CustomerID: "c-1", Status: domain.StatusPending,
		Currency: "EUR", Total: total, Version: 1, CreatedAt: moneyDay, UpdatedAt: moneyDay,
		Items: []domain.Item{{SKU: "s", Quantity: 1, UnitPrice: total, LineTotal: total}}}
	var envs []domain.Envelope
	add := func(e domain.Event) {
		env, err := domain.NewEnvelope(uuid.Must(uuid.NewV7()), o, e, o.UpdatedAt)
		if err != nil {
			t.Fatal(err)
		}
		envs = append(envs, env)
	}
	add(domain.OrderCreated{CustomerID: o.CustomerID, Status: o.Status, Currency: o.Currency, Items: o.Items, Total: total, CreatedAt: moneyDay})
	step := func(e domain.Event, err error) {
		t.Helper()
		if err != nil || e == nil {
			t.Fatalf("step: %v %v", e, err)
		}
		add(e)
	}
	if domain.Chargeable(o.Currency, total) {
		step(o.Pay(domain.DefaultPaymentMethod, moneyDay))
	} else {
		// Pay refuses such a total now; an order placed before it did
		// asked for it as Pay wrote it then.
		o.Total = 1
		ev, err := o.Pay(domain.DefaultPaymentMethod, moneyDay)
		o.Total = total
		asked, ok := ev.(domain.PaymentRequested)
		if !ok {
			t.Fatalf("pay: %v %v", ev, err)
		}
		asked.Total, asked.Amount = total, total
		step(asked, err)
	}
	step(o.RecordCharge(1, domain.ChargeOutcome{ChargeID: "pi_1", Amount: total, Currency: "EUR", Succeeded: true}, moneyDay))
	if cancel {
		// Cancelling raises two events, one version apart.
		evs, err := o.Cancel("test", moneyDay)
		if err != nil || len(evs) != 2 {
			t.Fatalf("cancel: %v %v", evs, err)
		}
		for i, e := range evs {
			env, err := domain.NewEnvelopeAt(uuid.Must(uuid.NewV7()), o, o.Version-int64(len(evs)-1-i), e, o.UpdatedAt)
			if err != nil {
				t.Fatal(err)
			}
			envs = append(envs, env)
		}
		step(o.RecordRefund(1, domain.RefundOutcome{RefundID: "re_1", Amount: total, Currency: "EUR", Succeeded: true}, moneyDay))
	}
	return envs
}

// applyBatch applies events with p in one transaction, as the runner does.
func applyBatch(t *testing.T, db *pgxpool.Pool, p Projection, events []domain.Envelope) error {
	t.Helper()
	b := &pgx.Batch{}
	if err := p.Queue(b, events); err != nil {
		return err
	}
	ctx := context.Background()
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
}

// moneySums reads a projection's (paid, refunded) sums as decimal text.
func moneySums(t *testing.T, db *pgxpool.Pool, p Projection) (paid, refunded string) {
	t.Helper()
	sql := `SELECT total_paid::text, total_refunded::text FROM customer_summaries`
	if p.Name() == "daily_sales" {
		sql = `SELECT paid_amount::text, refunded_amount::text FROM daily_sales`
	}
	if err := db.QueryRow(context.Background(), sql).Scan(&paid, &refunded); err != nil {
		t.Fatal(err)
	}
	return paid, refunded
}

var moneyProjections = []Projection{CustomerSummaries{}, DailySales{}}

// A batch whose paid or refunded sum for one row passes math.MaxInt64 is an
// error wrapping ErrPermanent, and queues nothing; a sum of exactly
// math.MaxInt64 is fine.
func TestBatchSumPastInt64IsPermanent(t *testing.T) {
	t.Parallel()
	for _, p := range moneyProjections {
		t.Run(p.Name(), func(t *testing.T) {
			t.Parallel()
			for _, tt := range []struct {
				name   string
				events []domain.Envelope
				err    bool
			}{
				{"paid sum exactly MaxInt64", append(paidOrder(t, math.MaxInt64-1, false), paidOrder(t, 1, false)...), false},
				{"paid sum MaxInt64+1", append(paidOrder(t, math.MaxInt64, false), paidOrder(t, 1, false)...), true},
				{"the reported pair: 2 × 9223372036854775800", append(paidOrder(t, 9223372036854775800, false), paidOrder(t, 9223372036854775800, false)...), true},
				{"refunded sum MaxInt64+1", append(paidOrder(t, math.MaxInt64, true)[3:], paidOrder(t, 1, true)[3:]...), true},
			} {
				b := &pgx.Batch{}
				err := p.Queue(b, tt.events)
				if !tt.err {
					if err != nil {
						t.Fatalf("%s: Queue = %v, want nil", tt.name, err)
					}
					continue
				}
				if !errors.Is(err, ErrPermanent) {
					t.Fatalf("%s: Queue = %v, want an error wrapping ErrPermanent", tt.name, err)
				}
				if b.Len() != 0 {
					t.Fatalf("%s: Queue queued %d statements after an overflow, want none", tt.name, b.Len())
				}
			}
		})
	}
}

// The read-model sums are exact past 2^63 (the case of the report: the paid
// sum of orders placed before domain.MaxAmount existed) and up to their
// documented limit, 10^38 - 1 minor units; past it PostgreSQL refuses the
// batch with a range error instead of storing a wrapped value.
func TestReadModelSumsAreExactPastInt64AndUpToTheirLimit(t *testing.T) {
	t.Parallel()
	for _, p := range moneyProjections {
		t.Run(p.Name(), func(t *testing.T) {
			t.Parallel()
			db := testenv.DB(t)
			// Batch 1: a sum of exactly MaxInt64, paid and refunded.
			if err := applyBatch(t, db, p, append(paidOrder(t, math.MaxInt64-599_984, true), paidOrder(t, 599_984, true)...)); err != nil {
				t.Fatalf("batch 1: %v", err)
			}
			if paid, refunded := moneySums(t, db, p); paid != "9223372036854775807" || refunded != "9223372036854775807" {
				t.Fatalf("after batch 1: paid %s, refunded %s; want 9223372036854775807 both", paid, refunded)
			}
			// Batch 2 takes both sums past 2^63: 2^64 + 599,984 (the report's figure).
			if err := applyBatch(t, db, p, paidOrder(t, math.MaxInt64, true)); err != nil {
				t.Fatalf("batch 2: %v", err)
			}
			if err := applyBatch(t, db, p, paidOrder(t, 599_986, true)); err != nil {
				t.Fatalf("batch 3: %v", err)
			}
			const past = "18446744073710151600" // 2^64 + 599,984
			if paid, refunded := moneySums(t, db, p); paid != past || refunded != past {
				t.Fatalf("after batch 3: paid %s, refunded %s; want %s both", paid, refunded, past)
			}

			// Up to the columns' limit, 10^38 - 1, exactly; one more is a range error.
			set := `UPDATE customer_summaries SET total_paid = 10::numeric^38 - 6, total_refunded = 10::numeric^38 - 6`
			if p.Name() == "daily_sales" {
				set = `UPDATE daily_sales SET paid_amount = 10::numeric^38 - 6, refunded_amount = 10::numeric^38 - 6`
			}
			if _, err := db.Exec(context.Background(), set); err != nil {
				t.Fatal(err)
			}
			if err := applyBatch(t, db, p, paidOrder(t, 5, true)); err != nil {
				t.Fatalf("batch up to the limit: %v", err)
			}
			const limit = "99999999999999999999999999999999999999"
			if paid, refunded := moneySums(t, db, p); paid != limit || refunded != limit {
				t.Fatalf("at the limit: paid %s, refunded %s; want %s both", paid, refunded, limit)
			}
			err := applyBatch(t, db, p, paidOrder(t, 1, false))
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "22003" {
				t.Fatalf("batch past the limit: %v, want a PostgreSQL numeric_value_out_of_range (22003) error", err)
			}
			if paid, refunded := moneySums(t, db, p); paid != limit || refunded != limit {
				t.Fatalf("after the refused batch: paid %s, refunded %s; want %s both", paid, refunded, limit)
			}
		})
	}
}
