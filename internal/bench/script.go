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
		"BEGIN",
		bind(command.KeyLockTimeout, `'5000ms'`),
		bind(command.KeyInsert, tenant, scope, key, `sha256(:n::text::bytea)`, "1", request, "86400"),
		command.KeyLockTimeoutReset,
		bind(command.OrderCreateSQL, tenant, orderID, `'c-1'`, `'pending'`, `'EUR'`, "2500", "1", key, "now()",
			"ARRAY[1]", "ARRAY['sku-1']", "ARRAY[2]", "ARRAY[1250]", "ARRAY[2500]", eventID, `'order.created'`, envelope),
		bind(command.KeyComplete, tenant, scope, key, "201", `'{"Content-Type":"application/json","ETag":"\"1\""}'`, body),
		"COMMIT",
	}
	return script(statements)
}

// applyScript renders, as a pgbench script, one projector transaction
// of a batch of n new order.created events for projection name, from the
// same SQL constants the runner and the projection issue: the shared lock,
// the position lock, the inbox insert, the projection's writes, the position
// advance, the notify and the checkpoint. `make bench` measures its TPS × n as the
// ceiling of that projector's drain rate.
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
		bind(projection.PositionsAdvanceSQL, "'"+name+"'", tenants, aggs, ones),
		bind(projection.NotifyAppliedSQL, "'"+name+"'"),
		bind(projection.CheckpointAdvanceSQL, "'"+name+"'", ":n"),
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
// random :n that makes every transaction's keys fresh.
func script(statements []string) string {
	var b strings.Builder
	b.WriteString("\\set n random(1, 9000000000000000000)\n")
	for _, s := range statements {
		b.WriteString(oneLine(s))
		b.WriteString(";\n")
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
