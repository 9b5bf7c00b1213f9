// Package health serves the liveness and readiness endpoints that every
// process of the service exposes.
package health

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Check reports whether one dependency is usable; nil means it is.
type Check func(ctx context.Context) error

// Detail is information /readyz shows without judging it (a backlog, say).
type Detail func(ctx context.Context) (any, error)

// Register adds GET /healthz (the process is alive: always 200) and GET
// /readyz (every check passes within two seconds: 200, else 503, with each
// check's result and the details in the JSON body) to mux.
func Register(mux interface {
	Get(pattern string, h http.HandlerFunc)
}, checks map[string]Check, details map[string]Detail) {
	mux.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.Get("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		results := make(map[string]string, len(checks))
		var mu sync.Mutex
		var wg sync.WaitGroup
		status := http.StatusOK
		for name, check := range checks {
			wg.Go(func() {
				res := "ok"
				if err := check(ctx); err != nil {
					res = err.Error()
				}
				mu.Lock()
				defer mu.Unlock()
				results[name] = res
				if res != "ok" {
					status = http.StatusServiceUnavailable
				}
			})
		}
		info := make(map[string]any, len(details))
		for name, detail := range details {
			wg.Go(func() {
				v, err := detail(ctx)
				if err != nil {
					v = err.Error()
				}
				mu.Lock()
				defer mu.Unlock()
				info[name] = v
			})
		}
		wg.Wait()
		word := "ok"
		if status != http.StatusOK {
			word = "unavailable"
		}
		body := map[string]any{"status": word, "checks": results}
		if len(info) > 0 {
			body["details"] = info
		}
		writeJSON(w, status, body)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
