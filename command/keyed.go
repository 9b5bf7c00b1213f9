package command

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/domain"
)

// OrderRequest is one keyed request for an order command: who asks, under
// which Idempotency-Key and scope, how long it may wait for an in-flight
// request with the same key, and the validated command (whose JSON encoding
// is the request's fingerprint).
type OrderRequest[C any] struct {
	TenantID string
	// Scope is the method and route template, e.g. "POST /v1/orders".
	Scope string
	Key   string
	// Wait bounds the wait for an in-flight request with the same key.
	Wait    time.Duration
	Command C
}

// Outcome is what an order command did, for a Render to turn into a
// response: the order as it is afterwards and whether the command changed
// it, or the domain's refusal (a *domain.Error; Order is zero then).
type Outcome struct {
	Order   domain.Order
	Changed bool
	Refusal error
}

// Render turns an Outcome into the response to store and replay. It must
// not block nor depend on the database: it runs inside the key's
// transaction, or for a create before it (its response goes into the key's
// row with the order, see Preclaim). An error it returns rolls the
// transaction back (or ends the request before it) and is never stored.
type Render func(Outcome) (Response, error)

// orderTx is a command handler that runs inside the key's transaction.
type orderTx[C any] interface {
	handle(ctx context.Context, tx pgx.Tx, cmd C) (o domain.Order, changed bool, err error)
}

// runKeyed runs h for req under req's Idempotency-Key with idem: the key
// claim, the command and the stored response share one transaction (G1),
// a retry gets the stored response (G2), another request under the same key
// is refused (G3). A domain refusal is rendered (and stored, except a 404);
// any other error rolls everything back and is returned.
func runKeyed[C any](ctx context.Context, idem *Idempotency, h orderTx[C], req OrderRequest[C], render Render) (Result, error) {
	return idem.Do(ctx, KeyedRequest{TenantID: req.TenantID, Scope: req.Scope, Key: req.Key, Command: req.Command}, req.Wait,
		executor(h, req.Command, render))
}

// executor runs h for cmd in the key's transaction and renders the outcome:
// a domain refusal is rendered (and stored, except a 404); any other error
// rolls everything back and is returned.
func executor[C any](h orderTx[C], cmd C, render Render) Executor {
	return func(ctx context.Context, tx pgx.Tx) (Response, error) {
		o, changed, err := h.handle(ctx, tx, cmd)
		if err != nil {
			if domain.KindOf(err) == "" {
				return Response{}, err
			}
			resp, rerr := render(Outcome{Refusal: err})
			if errors.Is(err, domain.ErrKeyRanBefore) {
				// Found after the step wrote (changeKept): never stored,
				// so that what it wrote rolls back, whatever render says.
				resp.Unstored = true
			}
			return resp, rerr
		}
		return render(Outcome{Order: o, Changed: changed})
	}
}
