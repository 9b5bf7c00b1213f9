package httpapi_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/httpapi"
	"github.com/acme/orders/internal/testenv"
)

// A reader that hangs up while it waits for its order to be projected is
// not a server failure: no "request failed" at ERROR (which alerts and
// counts as a 5xx), but "client closed request" at info. Under overload
// hundreds of readers give up this way (the bench's overloaded step logged
// 322 of them as 500s).
func TestAClientThatHangsUpIsNotAServerFailure(t *testing.T) {
	t.Parallel()
	var logs testenv.LogBuffer
	a := newLimitedAPILogging(t, httpapi.TenantLimitConfig{}, 0, 0, slog.New(slog.NewJSONHandler(&logs, nil)))
	tok := a.token(t, "gone")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url+"/v1/orders/"+uuid.NewString()+"?min_version=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Prefer", "wait=10")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
			t.Errorf("the read answered %d before its client hung up", res.StatusCode)
		}
	}()
	testenv.Eventually(t, 5*time.Second, "the read waits for the order", func() bool { return a.tenants.Stats().Waiting == 1 })
	cancel()
	<-done

	testenv.Eventually(t, 5*time.Second, "the hung-up read is logged", func() bool {
		return strings.Contains(logs.String(), `"msg":"client closed request"`)
	})
	if out := logs.String(); strings.Contains(out, `"level":"ERROR"`) {
		t.Fatalf("a client that hung up was logged as a server failure:\n%s", out)
	}
}
