package command

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/acme/orders/domain"
	"github.com/acme/orders/tracing"
)

// orderWritesSQL are the CTEs that write a new order (o), with its items,
// and its created event, if guard (the first %s) holds. If the order's key
// already created an order, the second %s decides: ON CONFLICT DO NOTHING
// leaves o empty, nothing raises a unique violation. Their parameters: $1
// tenant, $2 id, $3 customer, $4 status, $5 currency, $6 total, $7 version,
// $8 creating key, $9 created at, $10 the items (a jsonb array in line
// order), $11 the event's id, $12 type, $13 envelope, $14 and $15 its trace
// context (NULL untraced).
const orderWritesSQL = `o AS (
    INSERT INTO orders (tenant_id, id, customer_id, status, currency, total, version, creating_key, created_at, updated_at, items)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10
    WHERE %s
    %s
    RETURNING tenant_id, id
), event AS (
    INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_version, event_type, payload, traceparent, tracestate)
    SELECT $11, o.tenant_id, o.id, $7, $12, $13, $14, $15 FROM o
)`

var (
	// OrderCreateSQL writes a new order, with its items, and its first
	// event in one statement (orderWritesSQL's parameters). If the key already
	// created an order (its key row had expired), it writes nothing and
	// returns 0.
	OrderCreateSQL = "\nWITH " + fmt.Sprintf(orderWritesSQL, "true", "ON CONFLICT (tenant_id, creating_key) DO NOTHING") +
		"\nSELECT count(*) FROM o"

	// KeyedOrderCreateSQL is OrderCreateSQL in the statement that claims
	// its Idempotency-Key (a Preclaim): the key row, with the response in
	// it, and then the order, its items and its event, written only if the
	// key row was inserted. Parameters $1 to $11 are the key's
	// (KeyInsertCTE), $12 to $26 OrderCreateSQL's $1 to $15. It returns the
	// key's expires_at and the time its insert took (NULL if another request
	// holds the key) and the orders it wrote: 1, or 0 if it did not claim the
	// key. If the key created an order before (its key row expired), it
	// raises a unique violation, so that its transaction commits no key row
	// whose response names an order that was never written.
	KeyedOrderCreateSQL = "\nWITH " + KeyInsertCTE + ", " +
		shiftParams(fmt.Sprintf(orderWritesSQL, "EXISTS (SELECT FROM k)", ""), 11) +
		"\nSELECT (SELECT expires_at FROM k), (SELECT took FROM k), (SELECT count(*) FROM o)"
)

// shiftParams renumbers every parameter $n of sql to $n+by.
func shiftParams(sql string, by int) string {
	return paramRE.ReplaceAllStringFunc(sql, func(p string) string {
		n, _ := strconv.Atoi(p[1:])
		return "$" + strconv.Itoa(n+by)
	})
}

var paramRE = regexp.MustCompile(`\$[0-9]+`)

const (
	orderGetIDByKeySQL = `SELECT id FROM orders WHERE tenant_id = $1 AND creating_key = $2`

	orderGetForUpdateSQL = `
SELECT o.id, o.tenant_id, o.customer_id, o.status, o.currency, o.total, o.version, o.created_at, o.updated_at,
       o.paid_at, o.shipped_at, o.cancelled_at, o.cancel_reason, o.shipping_address, o.note, o.payment, o.refund,
       o.items
FROM orders o
WHERE o.tenant_id = $1 AND o.id = $2
FOR UPDATE OF o`

	orderUpdateSQL = `
UPDATE orders
SET status = $3, version = $4, updated_at = $5, paid_at = $6, shipped_at = $7, cancelled_at = $8,
    cancel_reason = $9, shipping_address = $10, note = $11, payment = $12, refund = $13
WHERE tenant_id = $1 AND id = $2 AND version = $4::bigint - $14::bigint`
)

// orderCreate writes a new order, its items and its created event ev. If
// an order created with the same key exists, it writes nothing and returns
// that order's id.
func orderCreate(ctx context.Context, tx pgx.Tx, o domain.Order, creatingKey string, ev outboxEvent) (existing uuid.UUID, err error) {
	var created int
	if err := tx.QueryRow(ctx, OrderCreateSQL, orderCreateArgs(ctx, o, creatingKey, ev)...).Scan(&created); err != nil {
		return uuid.Nil, fmt.Errorf("insert order: %w", err)
	}
	if created == 1 {
		return uuid.Nil, nil
	}
	return orderIDByKey(ctx, tx, o.TenantID, creatingKey)
}

// orderCreateArgs are OrderCreateSQL's arguments for o, created under
// creatingKey with its created event ev.
func orderCreateArgs(ctx context.Context, o domain.Order, creatingKey string, ev outboxEvent) []any {
	traceparent, tracestate := tracing.Inject(ctx)
	return []any{o.TenantID, o.ID, o.CustomerID, o.Status, o.Currency, o.Total, o.Version,
		creatingKey, o.CreatedAt, o.Items, ev.ID, ev.Type, ev.payload,
		nullIfEmpty(traceparent), nullIfEmpty(tracestate)}
}

// orderIDByKey returns the id of the order created under creatingKey.
func orderIDByKey(ctx context.Context, tx pgx.Tx, tenantID, creatingKey string) (id uuid.UUID, err error) {
	if err := tx.QueryRow(ctx, orderGetIDByKeySQL, tenantID, creatingKey).Scan(&id); err != nil {
		return uuid.Nil, fmt.Errorf("find order created by key: %w", err)
	}
	return id, nil
}

// orderGetForUpdate loads an order with its items and locks its row until tx
// ends. It returns a KindNotFound *domain.Error if the tenant has no such order.
func orderGetForUpdate(ctx context.Context, tx pgx.Tx, tenantID string, id uuid.UUID) (domain.Order, error) {
	return scanOrder(tx.QueryRow(ctx, orderGetForUpdateSQL, tenantID, id), id)
}

// queueOrderGetForUpdate queues orderGetForUpdate in b, to scan into o.
func queueOrderGetForUpdate(b *pgx.Batch, tenantID string, id uuid.UUID, o *domain.Order) {
	b.Queue(orderGetForUpdateSQL, tenantID, id).QueryRow(func(row pgx.Row) (err error) {
		*o, err = scanOrder(row, id)
		return err
	})
}

// scanOrder reads the row of orderGetForUpdateSQL for order id.
func scanOrder(row pgx.Row, id uuid.UUID) (domain.Order, error) {
	var o domain.Order
	err := row.Scan(
		&o.ID, &o.TenantID, &o.CustomerID, &o.Status, &o.Currency, &o.Total, &o.Version, &o.CreatedAt, &o.UpdatedAt,
		&o.PaidAt, &o.ShippedAt, &o.CancelledAt, &o.CancelReason, &o.ShippingAddress, &o.Note, &o.Payment, &o.Refund, &o.Items)
	if errors.Is(err, pgx.ErrNoRows) {
		return domain.Order{}, domain.Errorf(domain.KindNotFound, "order %s not found", id)
	}
	if err != nil {
		return domain.Order{}, fmt.Errorf("load order: %w", err)
	}
	return o.UTC(), nil
}

// queueOrderUpdate queues, in b, the write of the changed state of o, which
// must be steps versions past the row that the transaction holds locked.
func queueOrderUpdate(b *pgx.Batch, o domain.Order, steps int) {
	b.Queue(orderUpdateSQL, o.TenantID, o.ID, o.Status, o.Version, o.UpdatedAt,
		o.PaidAt, o.ShippedAt, o.CancelledAt, o.CancelReason, o.ShippingAddress, o.Note, o.Payment, o.Refund, steps).
		Exec(func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("update order %s to version %d: the row is not at version %d", o.ID, o.Version, o.Version-int64(steps))
			}
			return nil
		})
}

// changeOrder runs one lifecycle step on an order: it loads the order under
// its row lock, lets change decide (a nil event means "nothing to do"), and
// writes the new state and the event in tx. It returns the order as it is
// afterwards and whether it changed, or change's error with nothing written.
func changeOrder(ctx context.Context, tx pgx.Tx, tenantID string, id uuid.UUID, change func(*domain.Order) (domain.Event, error)) (domain.Order, bool, error) {
	return changeOrderMany(ctx, tx, tenantID, id, oneEvent(change))
}

// checkExpected refuses a change to o made on another version than
// expected (If-Match); 0 expects none.
func checkExpected(o *domain.Order, expected int64) error {
	if expected == 0 {
		return nil
	}
	return o.CheckVersion(expected)
}

// checkExpectedUnlessDone is checkExpected for a step whose outcome is a
// state (shipped, cancelled): an order already in it (done) passes
// whatever its version, and the step changes nothing. The change asked for
// is already reflected, as for a retry of a ship or cancel that ran whose
// key expired, or whose answer was lost while another client did the
// same: a 412 would tell it the step did not happen. RFC 9110, 13.1.1,
// allows a 2xx in exactly this case.
func checkExpectedUnlessDone(o *domain.Order, expected int64, done bool) error {
	if done {
		return nil
	}
	return checkExpected(o, expected)
}

// oneEvent turns a step raising at most one event into one raising many.
func oneEvent(change func(*domain.Order) (domain.Event, error)) func(*domain.Order) ([]domain.Event, error) {
	return func(o *domain.Order) ([]domain.Event, error) {
		ev, err := change(o)
		if ev == nil {
			return nil, err
		}
		return []domain.Event{ev}, err
	}
}

// changeOrderMany is changeOrder for a step that may raise several events,
// each one version after the other (the last at the order's new version).
// The order's row and its events are written in one round trip.
func changeOrderMany(ctx context.Context, tx pgx.Tx, tenantID string, id uuid.UUID, change func(*domain.Order) ([]domain.Event, error)) (domain.Order, bool, error) {
	o, err := orderGetForUpdate(ctx, tx, tenantID, id)
	if err != nil {
		return domain.Order{}, false, err
	}
	return changeLoaded(ctx, tx, o, change, nil)
}

// changeLoaded is changeOrderMany for order o, loaded under its row lock
// in tx already; also, if set, queues more rows of the same change (such
// as a payment's) into the same round trip.
func changeLoaded(ctx context.Context, tx pgx.Tx, o domain.Order, change func(*domain.Order) ([]domain.Event, error),
	also func(b *pgx.Batch, o domain.Order)) (domain.Order, bool, error) {
	evs, err := change(&o)
	if err != nil || len(evs) == 0 {
		return o, false, err
	}
	b := &pgx.Batch{}
	queueOrderUpdate(b, o, len(evs))
	for i, ev := range evs {
		version := o.Version - int64(len(evs)-1-i)
		if err := queueOutboxAppendAt(ctx, b, o, version, ev); err != nil {
			return domain.Order{}, false, fmt.Errorf("%s: %w", ev.EventType(), err)
		}
	}
	if also != nil {
		also(b, o)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return domain.Order{}, false, fmt.Errorf("write order %s: %w", o.ID, err)
	}
	return o, true, nil
}
