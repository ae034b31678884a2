package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// serveDebug serves Go's profiles (/debug/pprof) on cfg.DebugAddress until
// ctx ends. Profiles reveal internals, so only a loopback address is
// accepted and nothing is served by default.
func serveDebug(ctx context.Context, cfg Config) error {
	if cfg.DebugAddress == "" {
		return nil
	}
	if !loopbackOnly(cfg.DebugAddress) {
		return fmt.Errorf("--debug-address %s: must be a loopback address (profiles are not authenticated)", cfg.DebugAddress)
	}
	ln, err := net.Listen("tcp", cfg.DebugAddress)
	if err != nil {
		return fmt.Errorf("--debug-address %s: %w", cfg.DebugAddress, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Logger.Warn("debug server stopped", "error", err)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	cfg.Logger.Info("serving profiles", "address", ln.Addr().String())
	return nil
}
