package faults

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/acme/orders/internal/harness"
	"github.com/acme/orders/internal/noisy"
)

// DefaultNoisyPhase is Config.NoisyPhase's default: each measured phase
// of the noisy-neighbour run.
const DefaultNoisyPhase = 15 * time.Second

// noisyNeighbour runs the noisy-neighbour proof of internal/noisy on the
// real processes, before any fault is injected (so that the quiet tenant's
// p99 under each attack is compared with its p99 alone, not with a crash):
// a third api replica, api-noisy, started for it with noisy.APIEnv and
// stopped after it, reached directly (no proxy between the clients and it,
// nor between it and PostgreSQL), with tokens of two tenants of its own,
// noisy-quiet and noisy-hostile. Its events go through the relays and
// projectors of the stack, so the read-your-writes lag is the real one.
//
// A replica of its own, because noisy.APIEnv's key quota (1,000 keys kept
// 15 s) is made for tenants that never retry; the careful clients of the
// fault phase store far more keys and retry for up to 90 s, so api-1 and
// api-2 keep the default limits. The limits are per process and per
// tenant, so what is proven on api-noisy holds for each replica.
//
// It returns the report and the violations that are not the report's own
// (api-noisy exited by itself); an error only if the run could not be made.
func (s *stack) noisyNeighbour(ctx context.Context, phase time.Duration, logf func(string, ...any)) (noisy.Report, []string, error) {
	var rep noisy.Report
	quiet, err := s.createToken(ctx, "noisy-quiet")
	if err != nil {
		return rep, nil, err
	}
	hostile, err := s.createToken(ctx, "noisy-hostile")
	if err != nil {
		return rep, nil, err
	}
	port, err := harness.FreePort()
	if err != nil {
		return rep, nil, fmt.Errorf("noisy neighbour: %w", err)
	}
	env := append([]string{}, commonEnv...)
	env = append(env, "DATABASE_URL="+pgURL(s.pgPort), fmt.Sprintf("NATS_URL=nats://127.0.0.1:%d", s.natsPort),
		fmt.Sprintf("HTTP_ADDR=127.0.0.1:%d", port))
	limits := noisy.APIEnv()
	for _, k := range slices.Sorted(maps.Keys(limits)) {
		env = append(env, k+"="+limits[k])
	}
	p := &proc{name: "api-noisy", args: []string{"-relay=false"}, port: port, env: env}
	if err := s.start(p, nil, false); err != nil {
		return rep, nil, err
	}
	defer s.stop(p)
	if err := s.waitReady(ctx, p, 60*time.Second); err != nil {
		return rep, nil, err
	}
	rep, err = noisy.Run(ctx, noisy.Config{
		API: fmt.Sprintf("http://127.0.0.1:%d", port), QuietToken: quiet, HostileToken: hostile,
		Phase: phase, Logf: logf,
	})
	if err != nil {
		return rep, nil, err
	}
	s.stop(p)
	var violations []string
	s.mu.Lock()
	if r := p.crashReport(); r != "" {
		violations = append(violations, r)
	}
	s.mu.Unlock()
	return rep, violations, nil
}
