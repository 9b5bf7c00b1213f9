package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Where the time goes during a measurement: the CPU each of the stack's
// processes used, and (where the server has pg_stat_statements) the
// statements PostgreSQL ran, per created order.

// cpuTicks sums utime+stime (clock ticks) of the stack's processes by
// name: every process whose command line names dir (the api, projector,
// worker, fakepsp, nats-server and the postmaster, all started from or on
// it) and, as "postgres", the postmaster's children (its backends).
func cpuTicks(dir string) map[string]float64 {
	type proc struct {
		name  string
		ppid  int
		ticks float64
		ours  bool
	}
	procs := map[int]proc{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		// pid (comm) state ppid … utime(14) stime(15)
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < 0 {
			continue
		}
		f := strings.Fields(s[end+2:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		procs[pid] = proc{name: s[open+1 : end], ppid: ppid, ticks: ut + st, ours: strings.Contains(string(cmd), dir)}
	}
	out := map[string]float64{}
	for _, p := range procs {
		switch parent, ok := procs[p.ppid]; {
		case p.ours:
			out[p.name] += p.ticks
		case ok && parent.ours && parent.name == "postgres":
			out["postgres"] += p.ticks
		}
	}
	return out
}

// cpuSince renders the CPU the stack's processes used since before (a
// cpuTicks reading) over d, as % of one core each, busiest first.
func cpuSince(dir string, before map[string]float64, d time.Duration) string {
	const ticksPerSecond = 100 // USER_HZ on Linux
	after := cpuTicks(dir)
	type use struct {
		name string
		pct  float64
	}
	var uses []use
	for name, t := range after {
		if pct := 100 * (t - before[name]) / ticksPerSecond / d.Seconds(); pct >= 1 {
			uses = append(uses, use{name, pct})
		}
	}
	var b strings.Builder
	for len(uses) > 0 {
		i := 0
		for j := range uses {
			if uses[j].pct > uses[i].pct {
				i = j
			}
		}
		fmt.Fprintf(&b, "%s %.0f%%, ", uses[i].name, uses[i].pct)
		uses = append(uses[:i], uses[i+1:]...)
	}
	return strings.TrimSuffix(b.String(), ", ")
}

// statementsReset starts counting statements afresh; it reports false if
// the server has no pg_stat_statements (not in shared_preload_libraries).
func (r *runner) statementsReset(ctx context.Context) bool {
	conn, err := pgx.Connect(ctx, r.s.databaseURL)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return false
	}
	_, err = conn.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	return err == nil
}

// statementsTop renders the top statements by execution time since the
// last statementsReset, each with its calls and time per created order,
// and a last row summing every statement (the top ones and the rest): the
// round trips and the server time one order costs in all.
func (r *runner) statementsTop(ctx context.Context, created float64, n int) (string, error) {
	conn, err := pgx.Connect(ctx, r.s.databaseURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, _ := conn.Query(ctx, `
SELECT calls, total_exec_time, total_plan_time, wal_bytes, left(regexp_replace(query, '\s+', ' ', 'g'), 90)
FROM pg_stat_statements
WHERE query NOT LIKE '%pg_stat_statements%'
ORDER BY total_exec_time + total_plan_time DESC`)
	type stmt struct {
		Calls      int64
		Exec, Plan float64
		WAL        float64
		Query      string
	}
	stmts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stmt])
	if err != nil {
		return "", fmt.Errorf("read pg_stat_statements: %w", err)
	}
	var all stmt
	for _, s := range stmts {
		all.Calls, all.Exec, all.Plan, all.WAL = all.Calls+s.Calls, all.Exec+s.Exec, all.Plan+s.Plan, all.WAL+s.WAL
	}
	all.Query = fmt.Sprintf("all %d statements", len(stmts))
	var b strings.Builder
	fmt.Fprintf(&b, "| calls per order | exec µs per order | plan µs per order | WAL bytes per order | statement |\n| ---: | ---: | ---: | ---: | --- |\n")
	for _, s := range append(stmts[:min(n, len(stmts))], all) {
		fmt.Fprintf(&b, "| %.2f | %.0f | %.0f | %.0f | `%s` |\n", float64(s.Calls)/created, 1000*s.Exec/created, 1000*s.Plan/created,
			s.WAL/created, strings.ReplaceAll(s.Query, "|", `\|`))
	}
	return b.String(), nil
}
