package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/acme/orders/internal/harness"
)

// Create targets at the most clients (issue #12): of the minimal ceiling.
const (
	targetCreate        = 0.35 // the whole pipeline running
	targetCreateAPIOnly = 0.5  // relay and projector off
	burstLength         = 10 * time.Second
	targetCaughtUp      = 2.0 // seconds after a burst's end
)

// minimalSchema creates the minimal ceilings' tables (schema "ceiling") in
// the stack's database.
func (r *runner) minimalSchema(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, r.s.databaseURL)
	if err != nil {
		return fmt.Errorf("connect for the minimal schema: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, minimalSchemaSQL); err != nil {
		return fmt.Errorf("create the minimal schema: %w", err)
	}
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
		minimal, err := r.pgbench(ctx, "create-minimal", minimalCreateScript(), c)
		if err != nil {
			return 0, err
		}
		own, err := r.pgbench(ctx, "create", createOrderScript(), c)
		if err != nil {
			return 0, err
		}
		row := r.attack(ctx, "create", c, r.createTargeter())
		row.Ceiling, row.Ratio = minimal, row.Rate/minimal
		row.OwnCeiling, row.OwnRatio = own, row.Rate/own
		if c == most {
			maxCreate, minimalMost, ownMost = row.Rate, minimal, own
			row.Target = fmt.Sprintf("≥ %.2f of minimal ceiling", targetCreate)
			row.Met = ptr(row.Ratio >= targetCreate)
		}
		r.add(row)
	}

	// The api alone: no relay in it, no projector; the same ceilings.
	if err := r.restartAPI(ctx, false); err != nil {
		return 0, err
	}
	row := r.attack(ctx, "create (api only)", most, r.createTargeter())
	row.Ceiling, row.Ratio = minimalMost, row.Rate/minimalMost
	row.OwnCeiling, row.OwnRatio = ownMost, row.Rate/ownMost
	row.Target, row.Met = fmt.Sprintf("≥ %.2f of minimal ceiling", targetCreateAPIOnly), ptr(row.Ratio >= targetCreateAPIOnly)
	row.Note = "relay and projector off"
	r.add(row)
	if err := r.restartAPI(ctx, true); err != nil {
		return 0, err
	}
	// What the api-only phase left in the outbox is not the burst's.
	if err := r.waitIdle(ctx, 5*time.Minute); err != nil {
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
