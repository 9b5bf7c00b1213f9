package bench

import (
	"fmt"
	"strings"

	"github.com/acme/orders/command"
	"github.com/acme/orders/outbox"
	"github.com/acme/orders/projection"
)

// The pgbench scripts of the ceilings: each renders the very statements
// (the production packages' exported SQL constants) that one transaction of
// the measured component issues, so the ceiling and the code cannot drift
// apart.

// createOrderScript renders, as a pgbench script, the very statements
// (the same SQL constants) that one successful create transaction issues,
// bound to the values of a one-item order under a fresh key. `make bench`
// measures this script's TPS as the ceiling the API's create throughput is
// compared with, so the two cannot drift apart.
func createOrderScript() string {
	const (
		tenant  = `'bench'`
		scope   = `'POST /v1/orders'`
		key     = `('pgbench-' || :n)`
		orderID = `md5('o' || :n)::uuid`
		eventID = `md5('e' || :n)::uuid`
		request = `'{"customer_id":"c-1","currency":"EUR","items":[{"sku":"sku-1","quantity":2,"unit_price":1250}]}'`
	)
	envelope := fmt.Sprintf(`jsonb_build_object('id', %s, 'type', 'order.created', 'schema_version', 1, 'tenant_id', 'bench', `+
		`'aggregate_id', %s, 'aggregate_version', 1, 'occurred_at', now(), 'data', %s::jsonb)`, eventID, orderID, request)
	body := `convert_to('{"id":"' || md5('o' || :n)::uuid || '","customer_id":"c-1","status":"pending","currency":"EUR",` +
		`"items":[{"sku":"sku-1","quantity":2,"unit_price":1250,"line_total":2500}],"total":2500,"version":1}', 'UTF8')`
	statements := []string{
		// One round trip, one transaction, as the api sends it (a pipeline
		// that ends in one Sync: see command.Preclaim).
		`\startpipeline`,
		bind(command.KeyLockTimeout, `'5000ms'`),
		bind(command.KeyedOrderCreateSQL, tenant, scope, key, `sha256(:n::text::bytea)`, "1", request, "86400",
			"201", `'{"Content-Type":"application/json","ETag":"\"1\""}'`, body, "700",
			tenant, orderID, `'c-1'`, `'pending'`, `'EUR'`, "2500", "1", key, "now()",
			`'[{"sku":"sku-1","quantity":2,"unit_price":1250,"line_total":2500}]'`, eventID, `'order.created'`, envelope,
			"NULL", "NULL"), // untraced, as with tracing off
		`\endpipeline`,
	}
	return script(statements)
}

// applyScript renders, as a pgbench script, one projector transaction
// of a batch of n new order.created events for projection name, from the
// same SQL constants the runner and the projection issue: the shared lock,
// the position lock, the inbox insert, the projection's writes and the
// position advance (the checkpoint and the read-your-writes notification go
// out after the commit, outside it). `make bench` measures its TPS × n as the ceiling of
// that projector's drain rate.
func applyScript(name string, n int) (string, error) {
	series := fmt.Sprintf("generate_series(1, %d) AS g", n)
	arr := func(expr, typ string) string { return fmt.Sprintf("ARRAY(SELECT (%s)::%s FROM %s)", expr, typ, series) }
	aggs := arr(`md5('o' || :n || '-' || g)::uuid`, "uuid")
	events := arr(`md5('e' || :n || '-' || g)::uuid`, "uuid")
	tenants := arr(`'bench'`, "text")
	ones := arr("1", "bigint")
	seqs := arr("g", "bigint")
	statements := []string{
		"BEGIN",
		bind(projection.SharedLockSQL, fmt.Sprint(projection.AdvisoryClass), "'"+name+"'"),
		bind(projection.PositionsLockSQL, "'"+name+"'", aggs),
		bind(projection.InboxInsertSQL, "'"+name+"'", events, tenants, aggs, ones, seqs),
	}
	switch name {
	case "order_views":
		statements = append(statements, bind(projection.OrderViewInsertSQL, tenants, aggs, arr("'c-1'", "text"), arr("'pending'", "text"),
			arr("'EUR'", "text"), arr(`'[{"sku":"s","quantity":1,"unit_price":100,"line_total":100}]'`, "jsonb"), arr("100", "bigint"),
			ones, arr("now()", "timestamptz")))
	case "customer_summaries":
		statements = append(statements, bind(projection.CustomerSummariesUpsertSQL, arr("'bench'", "text"), arr("'c-' || (:n::bigint % 1000) || '-' || g", "text"),
			arr("'EUR'", "text"), ones, arr("0", "bigint"), arr("0", "bigint"), arr("0", "bigint"), arr("0", "bigint"), arr("0", "bigint"),
			arr("now()", "timestamptz"), arr("0", "bigint"), arr("0", "bigint")))
	case "daily_sales":
		statements = append(statements, bind(projection.DailySalesUpsertSQL, arr("'bench'", "text"), arr("current_date - g", "date"),
			arr("'EUR'", "text"), ones, arr("0", "bigint"), arr("0", "bigint")))
	default:
		return "", fmt.Errorf("no projection %q", name)
	}
	statements = append(statements,
		bind(projection.PositionsAdvanceSQL, "'"+name+"'", tenants, aggs, ones, arr("0", "bigint")),
		"COMMIT")
	return script(statements), nil
}

// publishScript renders, as a pgbench script, the database side of one
// relay batch of n rows, from the relay's SQL constants: the claim (its
// payloads read out) and the mark of exactly the claimed rows. Like the
// relay's workers, pgbench client k of `workers` claims only its own share
// of the partitions. `make bench` measures its TPS × n, at `workers`
// clients, as the database ceiling of the relay's drain rate.
func publishScript(n, workers int) string {
	share := (outbox.Partitions + workers - 1) / workers
	owned := fmt.Sprintf("ARRAY(SELECT generate_series(:client_id * %d, :client_id * %d + %d))::smallint[]", share, share, share-1)
	claim := bind(outbox.OutboxClaimSQL, fmt.Sprint(n), owned)
	return outbox.LeaseSettingsSQL + ";\n" + // as on the relay's connection
		"BEGIN;\n" +
		// The ids go to the mark through a pgbench variable.
		"WITH claimed AS (" + oneLine(claim) + ") SELECT coalesce(array_agg(id), '{}') AS ids, sum(length(payload::text)) AS bytes FROM claimed\n\\gset\n" +
		oneLine(bind(outbox.OutboxMarkPublishedSQL, ":ids::uuid[]")) + ";\n" +
		"COMMIT;\n"
}

// script renders statements as a pgbench script: each on one line, after a
// random :n that makes every transaction's keys fresh. A statement that
// starts with a backslash is a pgbench meta-command (\startpipeline: the
// statements up to \endpipeline go in one round trip, one transaction).
func script(statements []string) string {
	var b strings.Builder
	b.WriteString("\\set n random(1, 9000000000000000000)\n")
	for _, s := range statements {
		b.WriteString(oneLine(s))
		if !strings.HasPrefix(s, `\`) {
			b.WriteString(";")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// bind replaces $1…$n in sql with the SQL expressions args.
func bind(sql string, args ...string) string {
	for i := len(args); i >= 1; i-- { // $10 before $1
		sql = strings.ReplaceAll(sql, fmt.Sprintf("$%d", i), "("+args[i-1]+")")
	}
	return sql
}

// The minimal ceilings: the least any keyed create, or any projection, must
// write, on a schema of their own (primary keys only, in schema "ceiling" of
// the ceilings' database, ceilingDB), not our statements. The gap between a minimal ceiling
// and the own-SQL one is the cost of our schema and SQL.

// minimalSchemaSQL creates the minimal ceilings' schema; it is idempotent.
const minimalSchemaSQL = `
CREATE SCHEMA IF NOT EXISTS ceiling;
CREATE TABLE IF NOT EXISTS ceiling.idempotency_keys (
    tenant_id   text        NOT NULL,
    key         text        NOT NULL,
    fingerprint bytea       NOT NULL,
    status      smallint    NOT NULL,
    response    bytea       NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, key));
CREATE TABLE IF NOT EXISTS ceiling.orders (
    tenant_id   text        NOT NULL,
    id          uuid        NOT NULL,
    customer_id text        NOT NULL,
    status      text        NOT NULL,
    currency    text        NOT NULL,
    total       bigint      NOT NULL,
    version     bigint      NOT NULL,
    items       jsonb       NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id));
CREATE TABLE IF NOT EXISTS ceiling.outbox (
    id          uuid        PRIMARY KEY,
    payload     jsonb       NOT NULL);
CREATE TABLE IF NOT EXISTS ceiling.inbox (
    projection  text        NOT NULL,
    event_id    uuid        NOT NULL,
    PRIMARY KEY (projection, event_id));
CREATE TABLE IF NOT EXISTS ceiling.order_views (
    tenant_id   text        NOT NULL,
    order_id    uuid        NOT NULL,
    customer_id text        NOT NULL,
    status      text        NOT NULL,
    total       bigint      NOT NULL,
    items       jsonb       NOT NULL,
    version     bigint      NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, order_id))`

// Realistic payloads of the minimal create: a created order's items
// (three lines), the 201 response the key row stores (about 420 bytes, as
// the api's) and the order.created envelope (about 560 bytes).
const (
	minimalItems = `[{"sku":"sku-1","quantity":2,"unit_price":1250,"line_total":2500},` +
		`{"sku":"sku-2","quantity":1,"unit_price":990,"line_total":990},` +
		`{"sku":"sku-3","quantity":4,"unit_price":375,"line_total":1500}]`
	minimalResponse = `'{"id":"' || md5('o' || :n)::uuid || '","customer_id":"c-1","status":"pending","currency":"EUR","items":` +
		minimalItems + `,"total":4990,"version":1,"created_at":"' || now() || '","updated_at":"' || now() ||
		'","status_history":[{"status":"pending","at":"' || now() || '"}]}'`
)

// minimalCreateScript renders, as a pgbench script, the least a keyed
// create must write in one transaction: the key row (tenant, key, a 32-byte
// fingerprint, the stored response), the order row (its items as jsonb)
// and one outbox row with the event's envelope. No statement of ours.
func minimalCreateScript() string { return minimalGroupedCreateScript(1) }

// minimalGroupedCreateScript is minimalCreateScript with group creates in
// each transaction (one pipeline, one commit): the least work of a create
// whose commit is shared, as the api's group commit shares it
// (command.IdempotencyConfig.GroupSlots).
func minimalGroupedCreateScript(group int) string {
	statements := []string{`\startpipeline`} // one round trip: the least a transaction of three statements needs
	for i := range group {
		n := ":n"
		if group > 1 {
			n = fmt.Sprintf(":n || '-%d'", i)
		}
		orderID := `md5('o' || ` + n + `)::uuid`
		eventID := `md5('e' || ` + n + `)::uuid`
		response := strings.ReplaceAll(minimalResponse, "md5('o' || :n)", "md5('o' || "+n+")")
		envelope := `jsonb_build_object('id', ` + eventID + `, 'type', 'order.created', 'schema_version', 1, 'tenant_id', 'bench', ` +
			`'aggregate_id', ` + orderID + `, 'aggregate_version', 1, 'occurred_at', now(), 'trace', '00-' || md5('t' || ` + n + `) || '-' || left(md5('s' || ` + n + `), 16) || '-01', ` +
			`'data', jsonb_build_object('customer_id', 'c-1', 'status', 'pending', 'currency', 'EUR', 'total', 4990, 'created_at', now(), 'items', '` + minimalItems + `'::jsonb))`
		statements = append(statements,
			`INSERT INTO ceiling.idempotency_keys (tenant_id, key, fingerprint, status, response, expires_at) VALUES `+
				`('bench', 'pgbench-' || `+n+`, sha256((`+n+`)::text::bytea), 201, convert_to(`+response+`, 'UTF8'), now() + interval '1 day')`,
			`INSERT INTO ceiling.orders (tenant_id, id, customer_id, status, currency, total, version, items, created_at) VALUES `+
				`('bench', `+orderID+`, 'c-1', 'pending', 'EUR', 4990, 1, '`+minimalItems+`', now())`,
			`INSERT INTO ceiling.outbox (id, payload) VALUES (`+eventID+`, `+envelope+`)`)
	}
	return script(append(statements, `\endpipeline`))
}

// minimalApplyScript renders, as a pgbench script, the least one
// projection must write for a batch of n new events in one transaction:
// an inbox row per event and an upsert of its read-model row.
func minimalApplyScript(n int) string {
	series := fmt.Sprintf("generate_series(1, %d) AS g", n)
	return script([]string{
		"BEGIN",
		`INSERT INTO ceiling.inbox (projection, event_id) SELECT 'order_views', md5('e' || :n || '-' || g)::uuid FROM ` + series +
			` ON CONFLICT DO NOTHING`,
		`INSERT INTO ceiling.order_views (tenant_id, order_id, customer_id, status, total, items, version, updated_at) ` +
			`SELECT 'bench', md5('o' || :n || '-' || g)::uuid, 'c-1', 'pending', 4990, '` + minimalItems + `', 1, now() FROM ` + series +
			` ON CONFLICT (tenant_id, order_id) DO UPDATE SET status = excluded.status, total = excluded.total, items = excluded.items, ` +
			`version = excluded.version, updated_at = excluded.updated_at WHERE ceiling.order_views.version < excluded.version`,
		"COMMIT",
	})
}
