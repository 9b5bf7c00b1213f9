package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/internal/invariant"
)

// check runs, once the system has drained (bounded by within), every
// invariant the suite holds the service to, and returns the violations.
func check(ctx context.Context, s *stack, ops []*op, within time.Duration) ([]string, error) {
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/orders?sslmode=disable", s.pgPort))
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)

	var out []string
	// Read models agree with the write model, every event is published, each
	// projection's inbox holds each event once (G4, G5, G6).
	vs, err := invariant.Converge(ctx, conn, within)
	if err != nil {
		return nil, err
	}
	for _, v := range vs {
		out = append(out, v.String())
	}

	// Each key created at most one order (G1).
	rows, _ := conn.Query(ctx, `SELECT creating_key FROM orders GROUP BY tenant_id, creating_key HAVING count(*) > 1 LIMIT 5`)
	dup, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, k := range dup {
		out = append(out, "key "+k+" created more than one order")
	}

	// Each order has one event per step (charged once, shipped once, ...).
	rows, _ = conn.Query(ctx, `SELECT aggregate_id::text || ' ' || event_type || ' ×' || count(*) FROM outbox
		WHERE event_type <> 'order.updated' GROUP BY aggregate_id, event_type HAVING count(*) > 1 LIMIT 5`)
	twice, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, t := range twice {
		out = append(out, "an order's step happened more than once: "+t)
	}

	// What the clients were told agrees with what happened.
	type orderState struct {
		id                       string
		total                    int64
		paid, shipped, cancelled bool
	}
	rows, _ = conn.Query(ctx, `SELECT creating_key, id::text, total, paid_at IS NOT NULL, shipped_at IS NOT NULL, cancelled_at IS NOT NULL
		FROM orders WHERE tenant_id = 'faults'`)
	byKey, byID := map[string]orderState{}, map[string]orderState{}
	var key string
	var st orderState
	if _, err := pgx.ForEachRow(rows, []any{&key, &st.id, &st.total, &st.paid, &st.shipped, &st.cancelled}, func() error {
		byKey[key], byID[st.id] = st, st
		return nil
	}); err != nil {
		return nil, err
	}
	for _, o := range ops {
		switch {
		case o.Kind == "create" && o.Status == http.StatusCreated:
			var created struct {
				ID    string `json:"id"`
				Total int64  `json:"total"`
			}
			_ = json.Unmarshal(o.Response, &created)
			got, ok := byKey[o.Key]
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("create %s succeeded (order %s) but no order has its key", o.Key, created.ID))
			case got.id != created.ID || got.total != o.Total || created.Total != o.Total:
				out = append(out, fmt.Sprintf("create %s answered order %s total %d; the order with its key is %s total %d; asked %d",
					o.Key, created.ID, created.Total, got.id, got.total, o.Total))
			}
		case o.Kind == "create" && o.Status != 0:
			if _, ok := byKey[o.Key]; ok {
				out = append(out, fmt.Sprintf("create %s was refused (%d) but created an order", o.Key, o.Status))
			}
		case o.Status == http.StatusOK:
			got := byID[o.OrderID]
			if done := map[string]bool{"pay": got.paid, "ship": got.shipped, "cancel": got.cancelled}[o.Kind]; !done {
				out = append(out, fmt.Sprintf("%s of order %s succeeded (key %s) but the order shows no %s", o.Kind, o.OrderID, o.Key, o.Kind))
			}
		}
		if len(out) > 50 {
			break
		}
	}
	return out, nil
}
