package projection

import (
	"fmt"
	"strings"
)

// ApplyBenchScript renders, as a pgbench script, one projector transaction
// of a batch of n new order.created events for projection name, from the
// same SQL constants the runner and the projection issue: the shared lock,
// the position lock, the inbox insert, the projection's writes, the position
// advance, the notify and the checkpoint. `make bench` measures its TPS × n as the
// ceiling of that projector's drain rate.
func ApplyBenchScript(name string, n int) (string, error) {
	series := fmt.Sprintf("generate_series(1, %d) AS g", n)
	arr := func(expr, typ string) string { return fmt.Sprintf("ARRAY(SELECT (%s)::%s FROM %s)", expr, typ, series) }
	aggs := arr(`md5('o' || :n || '-' || g)::uuid`, "uuid")
	events := arr(`md5('e' || :n || '-' || g)::uuid`, "uuid")
	tenants := arr(`'bench'`, "text")
	ones := arr("1", "bigint")
	seqs := arr("g", "bigint")
	statements := []string{
		"BEGIN",
		bind(sharedLockSQL, fmt.Sprint(advisoryClass), "'"+name+"'"),
		bind(positionsLockSQL, "'"+name+"'", aggs),
		bind(inboxInsertSQL, "'"+name+"'", events, tenants, aggs, ones, seqs),
	}
	switch name {
	case "order_views":
		statements = append(statements, bind(orderViewInsertSQL, tenants, aggs, arr("'c-1'", "text"), arr("'pending'", "text"),
			arr("'EUR'", "text"), arr(`'[{"sku":"s","quantity":1,"unit_price":100,"line_total":100}]'`, "jsonb"), arr("100", "bigint"),
			ones, arr("now()", "timestamptz")))
	case "customer_summaries":
		statements = append(statements, bind(customerSummariesUpsertSQL, arr("'bench'", "text"), arr("'c-' || (:n::bigint % 1000) || '-' || g", "text"),
			arr("'EUR'", "text"), ones, arr("0", "bigint"), arr("0", "bigint"), arr("0", "bigint"), arr("0", "bigint"), arr("0", "bigint"),
			arr("now()", "timestamptz")))
	case "daily_sales":
		statements = append(statements, bind(dailySalesUpsertSQL, arr("'bench'", "text"), arr("current_date - g", "date"),
			arr("'EUR'", "text"), ones, arr("0", "bigint"), arr("0", "bigint")))
	default:
		return "", fmt.Errorf("no projection %q", name)
	}
	statements = append(statements,
		bind(positionsAdvanceSQL, "'"+name+"'", tenants, aggs, ones),
		bind(notifyAppliedSQL, "'"+name+"'"),
		bind(checkpointAdvanceSQL, "'"+name+"'", ":n"),
		"COMMIT")
	var b strings.Builder
	b.WriteString("\\set n random(1, 9000000000000000000)\n")
	for _, s := range statements {
		b.WriteString(strings.Join(strings.Fields(s), " "))
		b.WriteString(";\n")
	}
	return b.String(), nil
}

// bind replaces $1…$n in sql with the SQL expressions args.
func bind(sql string, args ...string) string {
	for i := len(args); i >= 1; i-- { // $10 before $1
		sql = strings.ReplaceAll(sql, fmt.Sprintf("$%d", i), "("+args[i-1]+")")
	}
	return sql
}
