package main

import (
	"flag"
	"fmt"
	"log/slog"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/tokenize/hf"
	"github.com/rollgate/rollgate/ui"
)

// uiFlags are the trajectory viewer's settings.
type uiFlags struct {
	enabled   *bool
	tokenizer *string
}

// registerUIFlags registers the viewer's flags on fs.
func registerUIFlags(fs *flag.FlagSet) uiFlags {
	return uiFlags{
		enabled:   fs.Bool("ui", true, "serve the read-only trajectory viewer at /ui (behind --admin-token when one is set)"),
		tokenizer: fs.String("ui-tokenizer", "", "tokenizer.json the viewer decodes token ids with (empty: ask the replica that served the call, POST /detokenize; ids alone when it cannot)"),
	}
}

// mount serves the viewer of store on srv's /ui.
func (f uiFlags) mount(srv *gateway.Server, store export.Store, adminToken string, log *slog.Logger) error {
	if !*f.enabled {
		return nil
	}
	cfg := ui.Config{AdminToken: adminToken, Logger: log}
	if *f.tokenizer != "" {
		t, err := hf.LoadFile(*f.tokenizer)
		if err != nil {
			return fmt.Errorf("--ui-tokenizer: %w", err)
		}
		cfg.Decoder = ui.LocalDecoder{T: t}
	} else {
		cfg.Decoder = &ui.EngineDecoder{Resolve: replicaResolver(srv)}
	}
	v, err := ui.New(store, cfg)
	if err != nil {
		return err
	}
	srv.SetUI(v.Handle)
	return nil
}

// replicaResolver finds a replica's base URL in srv's routing table: the
// one named backend, else any replica of model.
func replicaResolver(srv *gateway.Server) func(backend, model string) (string, bool) {
	return func(backend, model string) (string, bool) {
		view := srv.Backends()
		fallback := ""
		for _, b := range view.Backends {
			for _, r := range b.Replicas {
				if r.Name == backend || r.URL == backend {
					return r.URL, true
				}
				if fallback == "" && (b.Model == model || b.Model == "*") {
					fallback = r.URL
				}
			}
		}
		return fallback, fallback != ""
	}
}
