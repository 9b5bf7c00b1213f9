package migrations_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/migrations"
)

// migrateTo moves the database at conn to version v, up or down.
func migrateTo(t *testing.T, conn *pgx.Conn, v int32) {
	t.Helper()
	ctx := context.Background()
	m, err := migrate.NewMigrator(ctx, conn, migrations.VersionTable)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.LoadMigrations(migrations.Files); err != nil {
		t.Fatal(err)
	}
	if err := m.MigrateTo(ctx, v); err != nil {
		t.Fatalf("migrate to %d: %v", v, err)
	}
}

// Migration 012 moves an order's items from order_items into the order's
// row, in line order and with every field, and its down migration moves
// them back: an existing database keeps every item both ways.
func TestOrderItemsMoveIntoTheOrderRowAndBack(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	migrateTo(t, conn, 11)
	if _, err := conn.Exec(ctx, `
INSERT INTO orders (tenant_id, id, customer_id, status, currency, total, version, creating_key, created_at, updated_at)
VALUES ('t1', '00000000-0000-0000-0000-000000000001', 'c-1', 'pending', 'EUR', 9223372036854775807, 1, 'k1', now(), now());
INSERT INTO order_items (tenant_id, order_id, line_no, sku, quantity, unit_price, line_total)
VALUES ('t1', '00000000-0000-0000-0000-000000000001', 2, 'sku-b', 1, 1, 1),
       ('t1', '00000000-0000-0000-0000-000000000001', 1, 'sku-a', 1, 9223372036854775806, 9223372036854775806)`); err != nil {
		t.Fatal(err)
	}

	migrateTo(t, conn, 12)
	var raw []byte
	if err := conn.QueryRow(ctx, `SELECT items FROM orders WHERE id = '00000000-0000-0000-0000-000000000001'`).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var items []struct {
		SKU       string `json:"sku"`
		Quantity  int64  `json:"quantity"`
		UnitPrice int64  `json:"unit_price"`
		LineTotal int64  `json:"line_total"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		t.Fatalf("items %s: %v", raw, err)
	}
	if len(items) != 2 || items[0].SKU != "sku-a" || items[0].LineTotal != 9223372036854775806 ||
		items[0].UnitPrice != 9223372036854775806 || items[1].SKU != "sku-b" || items[1].Quantity != 1 {
		t.Fatalf("items after the migration = %s, want sku-a (2^63 - 2) then sku-b", raw)
	}

	migrateTo(t, conn, 11)
	var lines, lastLine int
	var first string
	var firstTotal int64
	if err := conn.QueryRow(ctx, `SELECT count(*), max(line_no), min(sku), max(line_total) FROM order_items`).
		Scan(&lines, &lastLine, &first, &firstTotal); err != nil {
		t.Fatal(err)
	}
	if lines != 2 || lastLine != 2 || first != "sku-a" || firstTotal != 9223372036854775806 {
		t.Fatalf("after down: %d lines, last %d, first %q of %d", lines, lastLine, first, firstTotal)
	}
}
