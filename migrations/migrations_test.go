package migrations_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/migrations"
)

// connect opens a connection to a database of the test's own, closed when
// the test ends.
func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

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
	conn := connect(t)
	migrateTo(t, conn, 11)
	// Two tenants with the same order id, lines inserted out of order, and
	// an order without items.
	if _, err := conn.Exec(ctx, `
INSERT INTO orders (tenant_id, id, customer_id, status, currency, total, version, creating_key, created_at, updated_at)
VALUES ('t1', '00000000-0000-0000-0000-000000000001', 'c-1', 'pending', 'EUR', 9223372036854775807, 1, 'k1', now(), now()),
       ('t2', '00000000-0000-0000-0000-000000000001', 'c-1', 'pending', 'EUR', 6, 1, 'k1', now(), now()),
       ('t2', '00000000-0000-0000-0000-000000000002', 'c-1', 'pending', 'EUR', 0, 1, 'k2', now(), now());
INSERT INTO order_items (tenant_id, order_id, line_no, sku, quantity, unit_price, line_total)
VALUES ('t1', '00000000-0000-0000-0000-000000000001', 2, 'sku-b', 1, 1, 1),
       ('t2', '00000000-0000-0000-0000-000000000001', 1, 'sku-z', 3, 2, 6),
       ('t1', '00000000-0000-0000-0000-000000000001', 1, 'sku-a', 1, 9223372036854775806, 9223372036854775806)`); err != nil {
		t.Fatal(err)
	}
	type line struct {
		Tenant, ID, SKU                string
		No                             int
		Quantity, UnitPrice, LineTotal int64
	}
	want := []line{
		{"t1", "00000000-0000-0000-0000-000000000001", "sku-a", 1, 1, 9223372036854775806, 9223372036854775806},
		{"t1", "00000000-0000-0000-0000-000000000001", "sku-b", 2, 1, 1, 1},
		{"t2", "00000000-0000-0000-0000-000000000001", "sku-z", 1, 3, 2, 6},
	}

	migrateTo(t, conn, 12)
	var got []line
	noItems := -1
	rows, _ := conn.Query(ctx, `SELECT tenant_id, id::text, items FROM orders ORDER BY tenant_id, id`)
	for rows.Next() {
		var tenant, id string
		var raw []byte
		if err := rows.Scan(&tenant, &id, &raw); err != nil {
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
		if id == "00000000-0000-0000-0000-000000000002" {
			noItems = len(items)
		}
		for i, it := range items {
			got = append(got, line{tenant, id, it.SKU, i + 1, it.Quantity, it.UnitPrice, it.LineTotal})
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) || noItems != 0 {
		t.Fatalf("items after the migration = %+v (order without items: %d), want %+v and an empty array", got, noItems, want)
	}

	migrateTo(t, conn, 11)
	rows, _ = conn.Query(ctx, `SELECT tenant_id, order_id::text, sku, line_no, quantity, unit_price, line_total
FROM order_items ORDER BY tenant_id, order_id, line_no`)
	back, err := pgx.CollectRows(rows, pgx.RowToStructByPos[line])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, want) {
		t.Fatalf("order_items after the down migration = %+v, want %+v", back, want)
	}
}

// Migration 015 makes a key one per tenant: a key a tenant used on two
// routes keeps its oldest row, the later one is renamed apart (and kept),
// and the down migration restores both under their own names; or, if the
// old name was taken again since, drops the renamed (older) row.
func TestAKeyUsedOnTwoRoutesKeepsItsOldestRowAndBack(t *testing.T) {
	ctx := context.Background()
	conn := connect(t)
	migrateTo(t, conn, 14)
	if _, err := conn.Exec(ctx, `
INSERT INTO idempotency_keys (tenant_id, scope, key, fingerprint, fingerprint_version, request, created_at, expires_at)
VALUES ('t1', 'POST /v1/orders/{id}/pay', 'k', '\x01', 1, '{}', now() - interval '1 minute', now() + interval '1 hour'),
       ('t1', 'POST /v1/orders', 'k', '\x02', 1, '{}', now() - interval '2 minutes', now() + interval '1 hour'),
       ('t2', 'POST /v1/orders/{id}/pay', 'k', '\x03', 1, '{}', now(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	keys := func() []string {
		rows, _ := conn.Query(ctx, `SELECT tenant_id || ' ' || scope || ' ' || replace(key, E'\n', '\n') FROM idempotency_keys ORDER BY 1`)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	before := keys()
	renamed := []string{
		`t1 POST /v1/orders k`,
		`t1 POST /v1/orders/{id}/pay k\nPOST /v1/orders/{id}/pay`,
		`t2 POST /v1/orders/{id}/pay k`,
	}
	migrateTo(t, conn, 15)
	if got := keys(); !slices.Equal(got, renamed) {
		t.Errorf("after 015: %q, want %q", got, renamed)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, scope, key, fingerprint, fingerprint_version, request, expires_at)
VALUES ('t1', 'POST /v1/orders/{id}/ship', 'k', '\x04', 1, '{}', now())`); err == nil {
		t.Error("after 015 a tenant's key took a second route")
	}
	// An api of the release before, beside a new one in a rolling deploy,
	// still claims on (tenant_id, scope, key).
	if _, err := conn.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, scope, key, fingerprint, fingerprint_version, request, expires_at)
VALUES ('t2', 'POST /v1/orders/{id}/pay', 'k', '\x06', 1, '{}', now())
ON CONFLICT (tenant_id, scope, key) DO NOTHING`); err != nil {
		t.Errorf("the previous release's claim after 015: %v", err)
	}
	migrateTo(t, conn, 14)
	if got := keys(); !slices.Equal(got, before) {
		t.Errorf("after 015 and back: %q, want %q", got, before)
	}

	// The oldest row expires and goes; the key is used again on the
	// renamed row's route; then down: the renamed (older) row goes.
	migrateTo(t, conn, 15)
	if _, err := conn.Exec(ctx, `DELETE FROM idempotency_keys WHERE tenant_id = 't1' AND key = 'k';
INSERT INTO idempotency_keys (tenant_id, scope, key, fingerprint, fingerprint_version, request, expires_at)
VALUES ('t1', 'POST /v1/orders/{id}/pay', 'k', '\x05', 1, '{}', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	migrateTo(t, conn, 14)
	want := []string{`t1 POST /v1/orders/{id}/pay k`, `t2 POST /v1/orders/{id}/pay k`}
	if got := keys(); !slices.Equal(got, want) {
		t.Errorf("down with the old name taken again: %q, want %q", got, want)
	}
	var fp []byte
	if err := conn.QueryRow(ctx, `SELECT fingerprint FROM idempotency_keys WHERE tenant_id = 't1'`).Scan(&fp); err != nil || string(fp) != "\x05" {
		t.Errorf("t1's row after down: fingerprint %x %v, want the newer row's 05", fp, err)
	}
}

// Migration 019 makes (tenant_id, key) the key rows' primary key, in place
// of (tenant_id, scope, key) beside a unique index on (tenant_id, key),
// keeping the rows; down restores both indexes.
func TestTheKeyRowsPrimaryKeyBecomesTenantAndKeyAndBack(t *testing.T) {
	ctx := context.Background()
	conn := connect(t)
	indexes := func() []string {
		rows, _ := conn.Query(ctx, `SELECT indexdef FROM pg_indexes WHERE tablename = 'idempotency_keys' AND indexdef LIKE 'CREATE UNIQUE%' ORDER BY 1`)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for i, def := range got {
			got[i] = def[strings.Index(def, " INDEX ")+7:]
		}
		return got
	}
	migrateTo(t, conn, 18)
	if _, err := conn.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, scope, key, fingerprint, fingerprint_version, request, expires_at, stored_bytes)
VALUES ('t1', 'POST /v1/orders', 'k', '\x01', 1, '{}', now() + interval '1 hour', 7)`); err != nil {
		t.Fatal(err)
	}
	before := indexes()
	migrateTo(t, conn, 19)
	want := []string{`idempotency_keys_pkey ON public.idempotency_keys USING btree (tenant_id, key) INCLUDE (stored_bytes)`}
	if got := indexes(); !slices.Equal(got, want) {
		t.Errorf("after 019: %q, want %q", got, want)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE tenant_id = 't1' AND key = 'k' AND stored_bytes = 7`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the key row after 019: %d rows, %v", n, err)
	}
	migrateTo(t, conn, 18)
	if got := indexes(); !slices.Equal(got, before) {
		t.Errorf("after 019 and back: %q, want %q", got, before)
	}
}

// Migration 020 makes due the rows parked behind an open dead letter of a
// later version of their order (no next attempt: they waited for nothing
// that could ever come), and leaves alone those behind an earlier open one
// and those on a clock.
func TestRowsParkedBehindALaterOpenDeadLetterBecomeDue(t *testing.T) {
	ctx := context.Background()
	conn := connect(t)
	migrateTo(t, conn, 19)
	const a, b = "0193b1a8-7c2e-7000-8000-00000000000a", "0193b1a8-7c2e-7000-8000-00000000000b"
	if _, err := conn.Exec(ctx, `
INSERT INTO dead_letters (projection, tenant_id, aggregate_id, aggregate_version, stream_seq, subject, payload, error, deliveries, status, next_attempt_at)
VALUES ('order_views', 't1', $1, 5, 5, 's', '\x7b7d', 'never applicable', 10, 'open', NULL),
       ('order_views', 't1', $1, 4, 4, 's', '\x7b7d', 'behind the later v5', 1, 'parked', NULL),
       ('order_views', 't1', $2, 2, 7, 's', '\x7b7d', 'poison', 1, 'open', NULL),
       ('order_views', 't1', $2, 3, 8, 's', '\x7b7d', 'behind the earlier v2', 1, 'parked', NULL),
       ('order_views', 't2', $2, 4, 9, 's', '\x7b7d', 'another tenant''s, behind nothing of its own', 1, 'parked', NULL),
       ('payment_worker_charges', 't1', $1, 2, 10, 's', '\x7b7d', 'on its backoff', 1, 'parked', '2100-01-01')`, a, b); err != nil {
		t.Fatal(err)
	}
	migrateTo(t, conn, 20)
	rows, _ := conn.Query(ctx, `SELECT error FROM dead_letters WHERE next_attempt_at <= now() ORDER BY id`)
	due, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"behind the later v5", "another tenant's, behind nothing of its own"}; !slices.Equal(due, want) {
		t.Errorf("due after 020: %q, want %q", due, want)
	}
	var later int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM dead_letters WHERE next_attempt_at = '2100-01-01'`).Scan(&later); err != nil || later != 1 {
		t.Errorf("the row on a clock: %d left at its time, %v", later, err)
	}
	migrateTo(t, conn, 19)
}

// A database a newer release migrated (past this build's last migration)
// is left alone: a process of the release before still starts on it.
func TestApplyLeavesANewerSchemaAlone(t *testing.T) {
	ctx := context.Background()
	conn := connect(t)
	if err := migrations.Apply(ctx, conn); err != nil {
		t.Fatal(err)
	}
	var newer int32
	if err := conn.QueryRow(ctx, `UPDATE schema_version SET version = version + 1 RETURNING version`).Scan(&newer); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Apply(ctx, conn); err != nil {
		t.Fatalf("Apply on a schema at version %d, one past this build's: %v", newer, err)
	}
	var now int32
	if err := conn.QueryRow(ctx, `SELECT version FROM schema_version`).Scan(&now); err != nil || now != newer {
		t.Fatalf("schema version %d (%v) after Apply, want %d untouched", now, err, newer)
	}
}

// Migration 024 keeps the keys of pays, updates and refunds stored before
// order_requests existed (so a late retry of one is refused, not run
// again), with the version from the stored ETag; it keeps nothing else.
func TestKeysStoredBeforeOrderRequestsAreKept(t *testing.T) {
	ctx := context.Background()
	conn := connect(t)
	migrateTo(t, conn, 23)
	const order = "01900000-0000-7000-8000-000000000001"
	key := func(scope, key string, status int, request, headers string) {
		t.Helper()
		if _, err := conn.Exec(ctx, `
INSERT INTO idempotency_keys (tenant_id, scope, key, fingerprint, fingerprint_version, request, status_code, response_headers, response_body, expires_at)
VALUES ('t1', $1, $2, '\x00', 1, $3::jsonb, $4, $5::jsonb, '{}', now() + interval '1 day')`, scope, key, request, status, headers); err != nil {
			t.Fatal(err)
		}
	}
	req := `{"order_id":"` + order + `"}`
	key("POST /v1/orders/{id}/pay", "pay-started", 202, req, `{"ETag":"\"2\""}`)
	key("PATCH /v1/orders/{id}", "edited", 200, req, `{"ETag":"\"4\""}`)
	key("POST /v1/orders/{id}/refund", "refund-asked", 202, req, `{"ETag":"\"7\""}`)
	key("POST /v1/orders/{id}/pay", "pay-refused", 409, req, `{"Content-Type":"application/problem+json"}`)
	key("POST /v1/orders/{id}/pay", "pay-under-way", 200, req, `{"ETag":"\"2\""}`)
	key("POST /v1/orders", "create", 201, `{"customer_id":"c"}`, `{"ETag":"\"1\""}`)
	key("POST /v1/orders/{id}/pay", "weak-etag", 202, req, `{"ETag":"W/\"2\""}`)
	key("POST /v1/orders/{id}/pay", "no-order", 202, `{"order_id":"not-a-uuid"}`, `{"ETag":"\"2\""}`)
	key("PATCH /v1/orders/{id}", "kept-already", 200, req, `{"ETag":"\"5\""}`)
	if _, err := conn.Exec(ctx, `INSERT INTO order_requests (tenant_id, order_id, scope, idempotency_key, version) VALUES ('t1', $1, 'update', 'kept-already', 5)`, order); err != nil {
		t.Fatal(err)
	}

	migrateTo(t, conn, 24)
	rows, _ := conn.Query(ctx, `SELECT scope || ' ' || idempotency_key || ' ' || version FROM order_requests WHERE order_id = $1 ORDER BY idempotency_key`, order)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"update edited 4", "update kept-already 5", "pay pay-started 2", "refund refund-asked 7"}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("order_requests after 024: %q, want %q", got, want)
	}

	// 025: the pays and refunds that changed nothing (200) too.
	key("POST /v1/orders/{id}/refund", "refund-under-way", 200, req, `{"ETag":"\"7\""}`)
	key("POST /v1/orders/{id}/refund", "refund-no-etag", 200, req, `{"Content-Type":"application/json"}`)
	migrateTo(t, conn, 25)
	rows, _ = conn.Query(ctx, `SELECT scope || ' ' || idempotency_key || ' ' || version FROM order_requests WHERE order_id = $1 ORDER BY idempotency_key`, order)
	if got, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	want = append(want, "pay pay-under-way 2", "refund refund-under-way 7")
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("order_requests after 025: %q, want %q", got, want)
	}
}
