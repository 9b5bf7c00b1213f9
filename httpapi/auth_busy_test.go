package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/acme/orders/auth"
	"github.com/acme/orders/httpapi"
)

// busyAuth answers every token with auth.ErrBusy, as *auth.Clients does when
// its look-up slots stay busy.
type busyAuth struct{}

func (busyAuth) Authenticate(context.Context, string) (string, error) { return "", auth.ErrBusy }

// A token that could not be checked because look-ups are busy gets 503
// auth-busy with Retry-After, not 401: the token may be valid, and a client
// must not drop it.
func TestAuthBusyIs503(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(validated(t, httpapi.New(httpapi.Deps{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Auth: busyAuth{},
	})))
	t.Cleanup(srv.Close)
	tok, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/v1/orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var p struct{ Type string }
	b, _ := io.ReadAll(res.Body)
	_ = json.Unmarshal(b, &p)
	if res.StatusCode != http.StatusServiceUnavailable || !strings.HasSuffix(p.Type, "/auth-busy") ||
		res.Header.Get("Retry-After") == "" || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("busy auth: %d %s Retry-After=%q %s; want 503 auth-busy problem+json with Retry-After",
			res.StatusCode, res.Header.Get("Content-Type"), res.Header.Get("Retry-After"), b)
	}
}
