package command

import (
	"fmt"
	"strings"
)

// CreateOrderBenchScript renders, as a pgbench script, the very statements
// (the same SQL constants) that one successful create transaction issues,
// bound to the values of a one-item order under a fresh key. `make bench`
// measures this script's TPS as the ceiling the API's create throughput is
// compared with, so the two cannot drift apart.
func CreateOrderBenchScript() string {
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
		bind(keyLockTimeout, `'5000ms'`),
		bind(keyInsert, tenant, scope, key, `sha256(:n::text::bytea)`, "1", request, "86400"),
		keyLockTimeoutReset,
		bind(orderCreateSQL, tenant, orderID, `'c-1'`, `'pending'`, `'EUR'`, "2500", "1", key, "now()",
			"ARRAY[1]", "ARRAY['sku-1']", "ARRAY[2]", "ARRAY[1250]", "ARRAY[2500]", eventID, `'order.created'`, envelope),
		bind(keyComplete, tenant, scope, key, "201", `'{"Content-Type":"application/json","ETag":"\"1\""}'`, body),
		"COMMIT",
	}
	var b strings.Builder
	b.WriteString("\\set n random(1, 9000000000000000000)\n")
	for _, s := range statements {
		b.WriteString(strings.Join(strings.Fields(s), " "))
		b.WriteString(";\n")
	}
	return b.String()
}

// bind replaces $1…$n in sql with the SQL expressions args.
func bind(sql string, args ...string) string {
	for i := len(args); i >= 1; i-- { // $10 before $1
		sql = strings.ReplaceAll(sql, fmt.Sprintf("$%d", i), "("+args[i-1]+")")
	}
	return sql
}
