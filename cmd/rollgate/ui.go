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

// uiConfig is the trajectory viewer's settings (ui, ui_tokenizer).
type uiConfig struct {
	// Enabled serves the viewer at /ui.
	Enabled bool `yaml:"ui"`
	// Tokenizer is a tokenizer.json the viewer decodes token ids with.
	Tokenizer string `yaml:"ui_tokenizer"`
}

// RegisterFlags registers the viewer's flags on fs.
func (c *uiConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Enabled, "ui", true, "serve the read-only trajectory viewer at /ui (behind ROLLGATE_ADMIN_TOKEN when it is set)")
	fs.StringVar(&c.Tokenizer, "ui-tokenizer", c.Tokenizer, "tokenizer.json the viewer decodes token ids with (empty: ask the replica that served the call, POST /detokenize; ids alone when it cannot)")
}

// mount serves the viewer of store on srv's /ui.
func (c uiConfig) mount(srv *gateway.Server, store export.Store, adminToken string, log *slog.Logger) error {
	if !c.Enabled {
		return nil
	}
	cfg := ui.Config{AdminToken: adminToken, Logger: log}
	if c.Tokenizer != "" {
		t, err := hf.LoadFile(c.Tokenizer)
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
	srv.SetUI(v.Handle, v.Refuse)
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
