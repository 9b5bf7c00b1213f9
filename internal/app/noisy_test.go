package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/noisy"
)

// A hostile tenant cannot take a quiet tenant's service away: under each
// attack of internal/noisy the quiet tenant's requests all succeed, its p99
// stays close to what it was alone, its read model keeps up, and the attack
// was really made and shed. `make faults` runs the same on the real
// processes, with longer phases.
func TestNoisyNeighbour(t *testing.T) {
	env := newEnv(t)
	for k, v := range noisy.APIEnv() {
		env[k] = v
	}
	api := start(t, "api", app.RunAPI, env)
	start(t, "projector", app.RunProjector, env)
	rep, err := noisy.Run(context.Background(), noisy.Config{
		API: api, QuietToken: newToken(t, env, "quiet"), HostileToken: newToken(t, env, "hostile"),
		Phase: 3 * time.Second, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range rep.Attacks {
		t.Log(a)
	}
	for _, v := range rep.Violations() {
		t.Error(v)
	}
}
