package app

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"
)

// pprofUsage is the help text of every process's -pprof-addr flag.
const pprofUsage = "address to serve Go's runtime profiles (/debug/pprof/) on, e.g. 127.0.0.1:6060; empty: off. Keep it on loopback: profiles need no token"

// servePprof serves the runtime profiles of net/http/pprof on addr, on a
// listener of its own (never the api's), until ctx ends; an empty addr
// serves nothing. A failure to listen is logged, not fatal: profiles are a
// diagnosis aid, not part of the service.
func servePprof(ctx context.Context, addr string, logger *slog.Logger) {
	if addr == "" {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	logger = logger.With("server", "pprof")
	go func() {
		if err := Serve(ctx, addr, mux, logger, time.Second); err != nil {
			logger.Error("pprof server stopped", "addr", addr, "err", err)
		}
	}()
}
