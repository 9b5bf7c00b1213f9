package command

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/acme/orders/domain"
)

// The steps whose Idempotency-Key an order keeps for good (order_requests):
// those a late retry would run again (a pay of a declined order starts a
// new charge attempt) or be told wrongly did not run (an update, 412).
const (
	requestPay    = "pay"
	requestUpdate = "update"
	requestRefund = "refund"
)

const (
	// orderRequestInsertSQL keeps the key of a step that ran on an order;
	// 0 rows: the key ran on it before.
	orderRequestInsertSQL = `
INSERT INTO order_requests (tenant_id, order_id, scope, idempotency_key, version) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING`
	orderRequestGetSQL = `
SELECT version FROM order_requests WHERE tenant_id = $1 AND order_id = $2 AND scope = $3 AND idempotency_key = $4`
)

// changeKept is changeOrder for a step (scope) sent under the
// Idempotency-Key key, which the order keeps for good when the step
// changes it, or changes nothing where a later retry would be answered
// otherwise (keepsNoOpKey; conditional: the step carried If-Match; a refusal
// keeps nothing). A key it kept before (its key row has expired since: a
// live one replays without running the step) is refused with ranBefore,
// whatever the step would do now: run again, or be refused because the
// first run changed the order (a version or state it no longer has).
// The refusal wraps domain.ErrKeyRanBefore, which is never stored: the
// caller rolls back what the step wrote. An empty key (a command run
// without one, by a test or a tool) keeps nothing.
func changeKept(ctx context.Context, tx pgx.Tx, tenantID string, id uuid.UUID, scope, key string, conditional bool,
	change func(*domain.Order) (domain.Event, error)) (domain.Order, bool, error) {
	o, err := orderGetForUpdate(ctx, tx, tenantID, id)
	if err != nil {
		return domain.Order{}, false, err
	}
	if key == "" {
		return changeLoaded(ctx, tx, o, oneEvent(change), nil)
	}
	var keptBefore bool
	out, changed, err := changeLoaded(ctx, tx, o, oneEvent(change), func(b *pgx.Batch, o domain.Order) {
		b.Queue(orderRequestInsertSQL, o.TenantID, o.ID, scope, key, o.Version).Exec(func(tag pgconn.CommandTag) error {
			keptBefore = tag.RowsAffected() == 0
			return nil
		})
	})
	if err == nil && !changed {
		// A step that changed nothing ran too. Its key is kept at the
		// order's version when a retry after the key's row expired could
		// otherwise do what this run did not (keepsNoOpKey): start a charge
		// attempt once the one under way was declined, or be refused 412
		// (stored for a day) for an If-Match this run met; such a retry
		// that still changes nothing is answered as this run was. A pay
		// of a paid order or a refund asked again of a settled one,
		// without If-Match, keeps nothing: no retry of it can do more, and
		// keeping it would grow order_requests by a row per request.
		if keepsNoOpKey(scope, out, conditional) {
			if _, err := tx.Exec(ctx, orderRequestInsertSQL, o.TenantID, o.ID, scope, key, o.Version); err != nil {
				return domain.Order{}, false, fmt.Errorf("keep the key of a %s of order %s: %w", scope, id, err)
			}
		}
		return out, false, nil
	}
	switch kind := domain.KindOf(err); {
	case err == nil && !keptBefore:
		return out, changed, nil
	case err == nil, kind == domain.KindConflict, kind == domain.KindPreconditionFailed:
		version, found, lerr := keptRequest(ctx, tx, tenantID, id, scope, key)
		switch {
		case lerr != nil:
			return domain.Order{}, false, lerr
		case found:
			return domain.Order{}, false, ranBefore(o, scope, version)
		case err == nil: // cannot be: the insert found the key
			return domain.Order{}, false, fmt.Errorf("order %s: key of %s kept and not found", id, scope)
		}
	}
	return out, changed, err
}

// keepsNoOpKey says whether the key of a step (scope) that changed nothing
// on order o, sent with If-Match (conditional) or not, is kept: whether the
// step would be answered otherwise if sent again later. An update, or a
// step with If-Match, would be once the order moved on (a 412 saying it
// did not run); a pay or a refund while the attempt or the refund under
// way may still fail (it would start one).
func keepsNoOpKey(scope string, o domain.Order, conditional bool) bool {
	switch {
	case conditional, scope == requestUpdate:
		return true
	case scope == requestPay:
		return o.Status == domain.StatusPaymentPending
	case scope == requestRefund:
		return o.Refund.Status == domain.RefundPending
	}
	return false
}

// keptRequest returns the version the step scope under key made of order
// id, if the order kept that key.
func keptRequest(ctx context.Context, tx pgx.Tx, tenantID string, id uuid.UUID, scope, key string) (version int64, found bool, err error) {
	err = tx.QueryRow(ctx, orderRequestGetSQL, tenantID, id, scope, key).Scan(&version)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("look up the key of a %s of order %s: %w", scope, id, err)
	}
	return version, true, nil
}

// ranBefore is the refusal of a step whose key changed order o before,
// to version.
func ranBefore(o domain.Order, scope string, version int64) error {
	return &domain.Error{
		Kind: domain.KindConflict,
		Message: fmt.Sprintf("this Idempotency-Key already ran a %s of this order, at its version %d; its key record has expired, so that response cannot be replayed: read the order",
			scope, version),
		ResourceID: o.ID.String(),
		State:      string(o.Status),
		Err:        domain.ErrKeyRanBefore,
	}
}
