package main

import (
	"log/slog"
	"net/http"
	"net/http/pprof"
)

// servePprof serves Go's profiling endpoints (/debug/pprof/...) on addr, for
// `go tool pprof http://ADDR/debug/pprof/profile?seconds=10` under load. It
// is a separate listener so the gateway's own port never exposes them.
func servePprof(addr string, log *slog.Logger) error {
	ln, err := listen("--debug-listen", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	log.Info("pprof profiles served", "url", "http://"+ln.Addr().String()+"/debug/pprof/")
	go func() {
		if err := http.Serve(ln, mux); err != nil {
			log.Warn("pprof listener stopped", "err", err)
		}
	}()
	return nil
}
