package outbox_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/acme/orders/command"
	"github.com/acme/orders/domain"
	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/outbox"
	"github.com/acme/orders/postgres"
	"github.com/acme/orders/stream"
)

func TestRelayPublishesOnceAndRepublishIsAbsorbed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	ns := testenv.NATS(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := stream.Ensure(ctx, js, 1)
	if err != nil {
		t.Fatal(err)
	}

	const n = 25
	create := command.NewCreateOrderHandler()
	for i := range n {
		err := postgres.InTx(ctx, db, func(tx pgx.Tx) error {
			_, err := create.Handle(ctx, tx, command.CreateOrder{
				TenantID: "t1", Key: "k" + string(rune('a'+i)),
				NewOrder: domain.NewOrder{CustomerID: "c", Currency: "EUR", Lines: []domain.Line{{SKU: "s", Quantity: 1, UnitPrice: 1}}},
			})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	relay := outbox.NewRelay(db, js, slog.New(slog.NewTextHandler(io.Discard, nil)), outbox.Config{BatchSize: 10})
	for {
		claimed, err := relay.RelayBatch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if claimed == 0 {
			break
		}
	}
	var unpublished int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	if unpublished != 0 || relay.Stats().Published != n {
		t.Fatalf("unpublished = %d, stats = %+v; want 0 and %d published", unpublished, relay.Stats(), n)
	}

	// Every message carries its event id as Nats-Msg-Id, in outbox order.
	rows, _ := db.Query(ctx, `SELECT id::text FROM outbox ORDER BY id`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		msg, err := s.GetMsg(ctx, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		if got := msg.Header.Get(jetstream.MsgIDHeader); got != id {
			t.Fatalf("message %d: Nats-Msg-Id %q, want %q", i+1, got, id)
		}
		env, err := domain.DecodeEnvelope(msg.Data)
		if err != nil || env.ID.String() != id {
			t.Fatalf("message %d: envelope %+v, err %v", i+1, env, err)
		}
	}

	// A relay that crashed after publishing and before marking publishes
	// the rows again: the stream's duplicate window drops every copy.
	if _, err := db.Exec(ctx, `UPDATE outbox SET published_at = NULL`); err != nil {
		t.Fatal(err)
	}
	for {
		claimed, err := relay.RelayBatch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if claimed == 0 {
			break
		}
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n || relay.Stats().Duplicates != n {
		t.Fatalf("stream holds %d messages, %d duplicates reported; want %d and %d", info.State.Msgs, relay.Stats().Duplicates, n, n)
	}
}
