package app_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/internal/app"
	"github.com/acme/orders/internal/testenv"
)

// `api token revoke` ends a token on a running api within its
// -token-cache-ttl; `token create -expires` makes one that ends by itself.
func TestTokenRevokeAndExpiry(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	env["TOKEN_CACHE_TTL"] = "1s"
	api := start(t, "api", app.RunAPI, env)
	token := newToken(t, env, "acme")
	if r := call(t, http.MethodGet, api+"/v1/orders", token, "", ""); r.status != 200 {
		t.Fatalf("before revoke: %d %s", r.status, r.body)
	}
	var out bytes.Buffer
	if err := app.RunAPI(context.Background(), []string{"api", "token", "revoke", "-token", token},
		func(k string) string { return env[k] }, &out); err != nil || !strings.HasPrefix(out.String(), "revoked 1 ") {
		t.Fatalf("api token revoke: %v, printed %q", err, out.String())
	}
	testenv.Eventually(t, 3*time.Second, "the revoked token is refused", func() bool {
		return call(t, http.MethodGet, api+"/v1/orders", token, "", "").status == 401
	})

	out.Reset()
	if err := app.RunAPI(context.Background(), []string{"api", "token", "create", "-tenant", "acme", "-expires", "1s"},
		func(k string) string { return env[k] }, &out); err != nil {
		t.Fatalf("api token create -expires: %v", err)
	}
	short := strings.TrimSpace(out.String())
	if r := call(t, http.MethodGet, api+"/v1/orders", short, "", ""); r.status != 200 {
		t.Fatalf("before expiry: %d %s", r.status, r.body)
	}
	testenv.Eventually(t, 4*time.Second, "the expired token is refused", func() bool {
		return call(t, http.MethodGet, api+"/v1/orders", short, "", "").status == 401
	})
}
