package projection

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/acme/orders/domain"
)

// failingProjection wraps a projection and fails every batch holding an event
// for which fail returns an error, with that error.
type failingProjection struct {
	Projection
	fail func(domain.Envelope) error
}

func (p failingProjection) Queue(b *pgx.Batch, events []domain.Envelope) error {
	for _, e := range events {
		if err := p.fail(e); err != nil {
			return err
		}
	}
	return p.Projection.Queue(b, events)
}

// orderEvents are the created, paid and shipped events (v1 to v3) of a new
// order of tenant.
func orderEvents(t *testing.T, tenant, customer string) []domain.Envelope {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	o, created, err := domain.CreateOrder(uuid.Must(uuid.NewV7()), tenant, domain.NewOrder{
		CustomerID: customer, Currency: "EUR", Lines: []domain.Line{{SKU: "s", Quantity: 2, UnitPrice: 500}},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	var envs []domain.Envelope
	add := func(e domain.Event, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		env, err := domain.NewEnvelope(uuid.Must(uuid.NewV7()), o, e, o.UpdatedAt)
		if err != nil {
			t.Fatal(err)
		}
		envs = append(envs, env)
	}
	add(created, nil)
	add(legacyPay(&o, now.Add(time.Second)))
	add(o.Ship(now.Add(2 * time.Second)))
	return envs
}

// poisonTrigger makes every write of tenant 'poison' to order_views fail
// with a real range error (SQLSTATE 22003, bigint out of range).
const poisonTrigger = `
CREATE FUNCTION poison_overflow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.tenant_id = 'poison' THEN
        PERFORM 9223372036854775807::bigint + 1;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER poison_overflow BEFORE INSERT OR UPDATE ON order_views
    FOR EACH ROW EXECUTE FUNCTION poison_overflow();`

// A failure no retry can fix is dead-lettered on its first delivery, however
// long the backoff would be; the order's later events park behind it, and
// other orders are applied.
func TestPermanentFailureIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		setup  string
		fail   func(domain.Envelope) error
		poison func(t *testing.T, created *domain.Envelope) // changes the poison order's v1
	}{
		{name: "range error", setup: poisonTrigger},
		{name: "check violation", setup: `ALTER TABLE order_views ADD CONSTRAINT no_poison CHECK (tenant_id <> 'poison')`},
		{name: "ErrPermanent", fail: func(e domain.Envelope) error {
			if e.TenantID == "poison" {
				return fmt.Errorf("%w: sum out of range", ErrPermanent)
			}
			return nil
		}},
		// An index row past PostgreSQL's limit (SQLSTATE 54000, program
		// limit exceeded): a customer id of 8,000 random characters in a
		// forged order.created (the api refuses more than 64).
		{name: "program limit", poison: func(t *testing.T, created *domain.Envelope) {
			b := make([]byte, 6000)
			if _, err := rand.Read(b); err != nil {
				t.Fatal(err)
			}
			var data map[string]any
			if err := json.Unmarshal(created.Data, &data); err != nil {
				t.Fatal(err)
			}
			data["customer_id"] = base64.RawURLEncoding.EncodeToString(b)
			var err error
			if created.Data, err = json.Marshal(data); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "malformed", fail: func(e domain.Envelope) error {
			if e.TenantID == "poison" {
				return fmt.Errorf("%w: unusable data", domain.ErrMalformedEvent)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A minute's backoff: only an immediate dead letter shows up in time.
			cfg := Config{Workers: 1, MaxDeliver: 10, RetryDelay: time.Minute, GapDelay: 10 * time.Millisecond}
			f := newFixture(t, cfg)
			ctx := context.Background()
			if tc.setup != "" {
				if _, err := f.db.Exec(ctx, tc.setup); err != nil {
					t.Fatal(err)
				}
			}
			if tc.fail != nil {
				f.runner = mustRunner(t, f.db, f.js, failingProjection{OrderViews{}, tc.fail}, slog.New(slog.NewTextHandler(testLogOutput(), nil)), cfg)
			}
			f.run(t)
			poison, healthy := orderEvents(t, "poison", "c-p"), orderEvents(t, "t1", "c-h")
			if tc.poison != nil {
				tc.poison(t, &poison[0])
			}
			for _, e := range append(poison, healthy...) {
				f.publish(t, e, e.ID.String())
			}
			eventually(t, "v1 is dead-lettered at once, v2 and v3 parked, the healthy order applied", func() bool {
				var v int64
				_ = f.db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM order_views WHERE tenant_id = 't1'`).Scan(&v)
				return v == 3 &&
					f.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'open' AND aggregate_version = 1 AND deliveries = 1`) == 1 &&
					f.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'parked'`) == 2
			})
		})
	}
}

func TestPermanentTellsUnfixableFromTransientFailures(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("apply 3 events: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{pg("22003"), true}, // numeric value out of range
		{pg("22012"), true}, // division by zero
		{pg("23505"), true}, // unique violation
		{pg("23514"), true}, // check violation
		{pg("54000"), true}, // program limit exceeded (an index row too large)
		{fmt.Errorf("sum: %w", ErrPermanent), true},
		{fmt.Errorf("decode: %w", domain.ErrMalformedEvent), true},
		{pg("40P01"), false}, // deadlock
		{pg("40001"), false}, // serialization failure
		{pg("55P03"), false}, // lock timeout
		{pg("57014"), false}, // statement timeout (query cancelled)
		{pg("08006"), false}, // connection failure
		{pg("53300"), false}, // too many connections
		{context.DeadlineExceeded, false},
		{errors.New("connection reset by peer"), false},
	} {
		if got := Permanent(tc.err); got != tc.want {
			t.Errorf("Permanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
