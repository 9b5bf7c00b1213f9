package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/internal/harness"
	"github.com/acme/orders/migrations"
)

// Create targets at the most clients (issue #12): of the minimal ceiling.
const (
	targetCreate        = 0.35 // the whole pipeline running
	targetCreateAPIOnly = 0.5  // relay and projector off
	burstLength         = 10 * time.Second
	targetCaughtUp      = 2.0 // seconds after a burst's end
)

// ceilingDB is the database, on the stack's server, where the ceilings
// that write run: our migrations (for the own-SQL scripts) and the minimal
// schema "ceiling". What they write is then neither relayed nor projected
// by the running pipeline during the phases that follow them, as it was
// when the own-SQL create ceiling wrote into the service's own outbox.
const ceilingDB = "orders_ceiling"

// ceilingDatabase creates ceilingDB, migrated as the bench's own
// migrations are (the own-SQL scripts render the bench's SQL constants, so
// schema and statements come from the same build), with the minimal schema.
func (r *runner) ceilingDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, r.s.databaseURL)
	if err != nil {
		return fmt.Errorf("connect to create the ceilings' database: %w", err)
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+ceilingDB)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("create the ceilings' database: %w", err)
	}
	cfg, err := pgx.ParseConfig(r.s.databaseURL)
	if err != nil {
		return err
	}
	cfg.Database = ceilingDB
	if conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
		return fmt.Errorf("connect to the ceilings' database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := migrations.Apply(ctx, conn); err != nil {
		return fmt.Errorf("migrate the ceilings' database: %w", err)
	}
	if _, err := conn.Exec(ctx, minimalSchemaSQL); err != nil {
		return fmt.Errorf("create the minimal schema: %w", err)
	}
	return nil
}

// settle readies the stack for a measured phase: it waits until the
// relay and the projector have caught up with what earlier phases and
// ceilings left, then flushes their dirty pages (CHECKPOINT), so that a
// phase pays neither an earlier one's backlog nor its checkpoint.
func (r *runner) settle(ctx context.Context) error {
	if err := r.waitIdle(ctx, 5*time.Minute); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, r.s.databaseURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("checkpoint before a phase: %w", err)
	}
	return nil
}

// groupCeiling is how many creates one transaction of the grouped minimal
// ceiling holds: what the api's group commit forms at 64 clients with its
// default 4 slots (the rest wait in the queue).
const groupCeiling = 16

// groupedCeiling measures, and adds as a row, the minimal create grouped as
// the api's group commit groups it: groupCeiling creates per transaction,
// with clients creates in flight (clients / groupCeiling pgbench clients),
// and the ratio of apiOnly (create, api only, at clients) to it.
func (r *runner) groupedCeiling(ctx context.Context, clients int, apiOnly float64) error {
	if err := r.settle(ctx); err != nil {
		return err
	}
	tps, err := r.pgbench(ctx, ceilingDB, "create-minimal-grouped", minimalGroupedCreateScript(groupCeiling), max(1, clients/groupCeiling))
	if err != nil {
		return err
	}
	rate := tps * groupCeiling
	r.add(Row{Name: fmt.Sprintf("minimal create ceiling, %d per transaction (ratio: api only's)", groupCeiling), Clients: clients, Rate: rate,
		Ratio: apiOnly / rate,
		Note:  fmt.Sprintf("the least work of a create whose commit is shared, %d transactions in flight; ratio: create (api only) of it", max(1, clients/groupCeiling))})
	return nil
}

// creates measures, at each number of clients, the minimal and the own-SQL
// create ceilings and create with the whole pipeline on; then, at the most
// clients, create with the api alone (relay and projector off) and how
// long the read models take to catch up after a saturating burst. It
// returns the create rate at the most clients.
func (r *runner) creates(ctx context.Context) (float64, error) {
	most := slices.Max(r.cfg.Clients)
	var maxCreate, minimalMost, ownMost float64
	for _, c := range r.cfg.Clients {
		// The ceilings, then the api, each from a caught-up pipeline.
		if err := r.settle(ctx); err != nil {
			return 0, err
		}
		minimal, err := r.pgbench(ctx, ceilingDB, "create-minimal", minimalCreateScript(), c)
		if err != nil {
			return 0, err
		}
		own, err := r.pgbench(ctx, ceilingDB, "create", createOrderScript(), c)
		if err != nil {
			return 0, err
		}
		if err := r.settle(ctx); err != nil {
			return 0, err
		}
		var row Row
		if c == most {
			row = r.profiled(ctx, "create at "+fmt.Sprint(c)+" clients, pipeline on", func() Row { return r.attack(ctx, "create", c, r.createTargeter()) })
		} else {
			row = r.attack(ctx, "create", c, r.createTargeter())
		}
		row.Ceiling, row.Ratio = minimal, row.Rate/minimal
		row.OwnCeiling, row.OwnRatio = own, row.Rate/own
		if c == most {
			maxCreate, minimalMost, ownMost = row.Rate, minimal, own
			row.Target = fmt.Sprintf("≥ %.2f of minimal ceiling", targetCreate)
			row.Met = ptr(row.Ratio >= targetCreate)
		}
		r.add(row)
	}

	// The api alone: no relay in it, no projector; the same ceilings. The
	// pipeline catches up before it stops: nothing would drain it after.
	if err := r.settle(ctx); err != nil {
		return 0, err
	}
	if err := r.restartAPI(ctx, false); err != nil {
		return 0, err
	}
	row := r.profiled(ctx, "create at "+fmt.Sprint(most)+" clients, api only", func() Row { return r.attack(ctx, "create (api only)", most, r.createTargeter()) })
	row.Ceiling, row.Ratio = minimalMost, row.Rate/minimalMost
	row.OwnCeiling, row.OwnRatio = ownMost, row.Rate/ownMost
	row.Target, row.Met = fmt.Sprintf("≥ %.2f of minimal ceiling", targetCreateAPIOnly), ptr(row.Ratio >= targetCreateAPIOnly)
	row.Note = "relay and projector off; " + row.Note
	r.add(row)
	if err := r.restartAPI(ctx, true); err != nil {
		return 0, err
	}
	// After the restart: its settle waits for the pipeline to catch up.
	if err := r.groupedCeiling(ctx, most, row.Rate); err != nil {
		return 0, err
	}
	// What the api-only phase left in the outbox is not the burst's.
	if err := r.settle(ctx); err != nil {
		return 0, err
	}
	if err := r.burstLag(ctx, most); err != nil {
		return 0, err
	}
	return maxCreate, nil
}

// restartAPI stops the api and the projector and starts the api again,
// with its relay and the projector (pipeline) or without either.
func (r *runner) restartAPI(ctx context.Context, pipeline bool) error {
	r.notePeaks()
	stopProcess(r.s.api)
	stopProcess(r.s.projector)
	r.s.projector = nil
	env := []string{"RELAY=false"}
	if pipeline {
		env = nil
		if err := r.s.startProjector(); err != nil {
			return fmt.Errorf("start projector: %w", err)
		}
		if err := harness.WaitReady(ctx, r.s.projPort, 60*time.Second, "projector"); err != nil {
			return err
		}
	}
	if err := r.s.startAPI(env...); err != nil {
		return fmt.Errorf("start api: %w", err)
	}
	return harness.WaitReady(ctx, r.s.apiPort, 60*time.Second, "api")
}

// burstLag creates orders closed loop at `clients` for burstLength with
// the whole pipeline on, then measures how long after the burst's end the
// outbox is published and every projection has applied everything.
func (r *runner) burstLag(ctx context.Context, clients int) error {
	row := r.attackFor(ctx, "create", clients, r.createTargeter(), burstLength)
	end := time.Now()
	if err := r.waitIdle(ctx, 5*time.Minute); err != nil {
		return fmt.Errorf("after the burst: %w", err)
	}
	lag := time.Since(end).Seconds()
	r.add(Row{Name: fmt.Sprintf("read models caught up after a %s burst (s)", burstLength), Clients: clients, Rate: lag,
		Note:   fmt.Sprintf("seconds from the end of a %s create burst at %.0f/s until the outbox is published and every projection idle (polled every 100 ms)", burstLength, row.Rate),
		Target: fmt.Sprintf("≤ %.0f s", targetCaughtUp), Met: ptr(lag <= targetCaughtUp)})
	return nil
}

// profiled runs measure and notes where its time went: the CPU of each of
// the stack's processes (in the row's Note) and, if the server has
// pg_stat_statements, its top statements per created order (in the
// report's Profiles, under name).
func (r *runner) profiled(ctx context.Context, name string, measure func() Row) Row {
	tracked := r.statementsReset(ctx)
	stages := r.scrapeStages(ctx)
	before, start := cpuTicks(r.cfg.Dir), time.Now()
	row := measure()
	took := time.Since(start)
	cpu := cpuSince(r.cfg.Dir, before, took)
	row.Note = strings.TrimPrefix(row.Note+"; CPU (% of one core): "+cpu, "; ")
	profile := fmt.Sprintf("CPU (%% of one core): %s\n\n%s", cpu, stagesSince(stages, r.scrapeStages(ctx)))
	if tracked {
		top, err := r.statementsTop(ctx, row.Rate*took.Seconds(), 30)
		if err != nil {
			profile += fmt.Sprintf("pg_stat_statements: %v\n", err)
		} else {
			profile += "\n" + top
		}
	} else {
		profile += "(no pg_stat_statements: run with PG_OPTS='-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_planning=on')\n"
	}
	if r.rep.Profiles == nil {
		r.rep.Profiles = map[string]string{}
	}
	r.rep.Profiles[name] = profile
	r.say("where the time went, %s:\n%s", name, profile)
	return row
}
