package projection

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
)

// A rebuild reads the retained event log. An order whose events were all
// pruned from the outbox (relay retention) is not in it; the rebuild must
// still keep that order's position, so that a later redelivery of one of its
// events is stale by the version gate alone, even once its inbox row has been
// pruned too.
func TestRebuildKeepsThePositionsOfOrdersBeyondTheEventLog(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()

	pruned, kept := createdEvent(t, uuid.Must(uuid.NewV7())), createdEvent(t, uuid.Must(uuid.NewV7()))
	var events []*event
	for _, env := range []any{pruned, kept} {
		b, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, &event{data: b, deliveries: 1})
	}
	for _, e := range decode(events) {
		if _, err := f.db.Exec(ctx, `INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_version, event_type, payload, published_at)
VALUES ($1, $2, $3, $4, $5, $6, now())`, e.env.ID, e.env.TenantID, e.env.AggregateID, e.env.AggregateVersion, e.env.Type, e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.runner.commit(ctx, events); err != nil {
		t.Fatal(err)
	}
	// Relay retention prunes the first order's event from the log.
	if _, err := f.db.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, pruned.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.runner.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	for _, env := range []struct {
		name string
		id   uuid.UUID
	}{{"pruned", pruned.AggregateID}, {"kept", kept.AggregateID}} {
		if v := f.count(t, `SELECT coalesce(max(version), 0) FROM projection_positions WHERE projection = 'order_views' AND aggregate_id = $1`, env.id); v != 1 {
			t.Errorf("%s order's position after the rebuild = %d, want 1", env.name, v)
		}
	}

	// The inbox pruner deletes its row; the event is delivered again.
	if _, err := f.db.Exec(ctx, `DELETE FROM inbox WHERE event_id = $1`, pruned.ID); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(pruned)
	if err != nil {
		t.Fatal(err)
	}
	again := decode([]*event{{data: b, deliveries: 1}})
	if err := f.runner.commit(ctx, again); err != nil {
		t.Fatal(err)
	}
	if again[0].outcome != Stale {
		t.Errorf("the redelivered event of the pruned order was %s, want stale", again[0].outcome)
	}
}
