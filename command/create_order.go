package command

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// CreateOrder places a new order. Its JSON encoding (the embedded NewOrder) is
// the canonical form that the idempotency fingerprint is computed from.
type CreateOrder struct {
	TenantID string `json:"-"`
	// Key is the Idempotency-Key of the request. The order keeps it for good,
	// so no later retry can create a second order, even after the key row
	// expired.
	Key string `json:"-"`
	domain.NewOrder
}

// CreateOrderHandler handles CreateOrder.
type CreateOrderHandler struct {
	now func() time.Time
}

// NewCreateOrderHandler returns a CreateOrderHandler on the wall clock.
func NewCreateOrderHandler() CreateOrderHandler {
	return CreateOrderHandler{now: now}
}

// Handle creates the order, its items and its order.created event in tx. It
// returns a KindInvalid *domain.Error for a command that breaks a rule and a
// KindConflict *domain.Error (with the existing order's id) if an order was
// created with the same key before; in both cases it has written nothing.
func (h CreateOrderHandler) Handle(ctx context.Context, tx pgx.Tx, cmd CreateOrder) (domain.Order, error) {
	o, _, err := h.handle(ctx, tx, cmd)
	return o, err
}

// Run runs cmd under its Idempotency-Key with idem, in one transaction with
// the key row, and returns the response render made of the outcome (or the
// stored one, for a retry). See Idempotency.Do for the errors.
//
// The order is minted and its response rendered before the transaction, and
// written in the statement that claims the key, with the response in the key
// row (a Preclaim): one round trip, one transaction.
func (h CreateOrderHandler) Run(ctx context.Context, idem *Idempotency, req OrderRequest[CreateOrder], render Render) (Result, error) {
	keyed := KeyedRequest{TenantID: req.TenantID, Scope: req.Scope, Key: req.Key, Command: req.Command}
	order, ev, err := h.mint(req.Command)
	if err != nil {
		if domain.KindOf(err) == "" {
			return Result{}, err
		}
		// Refused by a rule: rendered and stored like any refusal.
		return runKeyed(ctx, idem, h, req, render)
	}
	resp, err := render(Outcome{Order: order, Changed: true})
	if err != nil {
		return Result{}, err
	}
	return idem.DoPreclaimed(ctx, keyed, req.Wait, Preclaim{
		Response: resp,
		SQL:      KeyedOrderCreateSQL,
		Args: func(ctx context.Context) []any {
			return orderCreateArgs(ctx, order, req.Command.Key, ev)
		},
		// The key's row expired or went since the claim found it, or the
		// key created an order before: the general way.
		Otherwise: executor(h, req.Command, render),
	})
}

// mint builds the order cmd creates and its created event, or refuses cmd.
func (h CreateOrderHandler) mint(cmd CreateOrder) (domain.Order, outboxEvent, error) {
	order, created, err := domain.CreateOrder(newID(), cmd.TenantID, cmd.NewOrder, h.now())
	if err != nil {
		return domain.Order{}, outboxEvent{}, err
	}
	ev, err := newOutboxEvent(order, order.Version, created, order.CreatedAt)
	if err != nil {
		return domain.Order{}, outboxEvent{}, err
	}
	return order, ev, nil
}

// createdBefore is the refusal of a create whose key created order existing
// before (the key's row has expired since).
func createdBefore(existing uuid.UUID) error {
	return &domain.Error{
		Kind:       domain.KindConflict,
		Message:    "an order was already created with this Idempotency-Key; its key record has expired",
		ResourceID: existing.String(),
		Err:        domain.ErrKeyRanBefore,
	}
}

func (h CreateOrderHandler) handle(ctx context.Context, tx pgx.Tx, cmd CreateOrder) (domain.Order, bool, error) {
	order, ev, err := h.mint(cmd)
	if err != nil {
		return domain.Order{}, false, err
	}
	existing, err := orderCreate(ctx, tx, order, cmd.Key, ev)
	if err != nil {
		return domain.Order{}, false, err
	}
	if existing != uuid.Nil {
		return domain.Order{}, false, createdBefore(existing)
	}
	return order, true, nil
}

// now is the service's clock, truncated to what PostgreSQL stores, so a
// response and a later read of the same order show the same instants.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// newID returns a UUIDv7: time-ordered, so inserts land at the right of the index.
func newID() uuid.UUID { return uuid.Must(uuid.NewV7()) }
