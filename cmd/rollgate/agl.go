package main

import (
	"flag"
	"log/slog"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/controlplane"
	"github.com/rollgate/rollgate/controlplane/agl"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/trainer-bridge/tasks"
)

// addAGLFlags registers the --agl-* flags (the `agl:` block of the config
// file; flags given win).
func addAGLFlags(fs *flag.FlagSet) *agl.Config {
	var c agl.Config
	c.RegisterFlags(fs)
	return &c
}

// mountAGL serves Agent Lightning's API gateway routes on srv when cfg
// enables them.
func mountAGL(cfg agl.Config, srv *gateway.Server, cp *controlplane.Server, q *tasks.Queue, store export.Store, pipe *capture.Pipeline, log *slog.Logger) error {
	if !cfg.Enabled {
		return nil
	}
	s, err := agl.New(cfg, srv, agl.Deps{Queue: q, Store: store, Capture: pipe, Mirror: cp.MirrorChanges, Log: log})
	if err != nil {
		return err
	}
	s.Mount()
	log.Info("serving Agent Lightning's API gateway routes (/api/rollouts, /api/models, /proxy/...)", "model_name", cfg.ModelName)
	return nil
}
