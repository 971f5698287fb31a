package main

import (
	"errors"
	"log/slog"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/controlplane"
	"github.com/rollgate/rollgate/controlplane/agl"
	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
)

// mountAGL serves Agent Lightning's API gateway routes on srv when cfg
// enables them. exposed: the gateway listens beyond loopback without
// --insecure-admin, where the routes need a key.
func mountAGL(cfg agl.Config, exposed bool, srv *gateway.Server, cp *controlplane.Server, q *tasks.Queue, store export.Store, pipe *capture.Pipeline, log *slog.Logger) error {
	if !cfg.Enabled {
		return nil
	}
	if cfg.Key == "" && exposed {
		return errors.New("--agl on a non-loopback --listen needs a key (agl.key, --agl-key: AGL's server key, AGL_KEY): " +
			"without one anyone who reaches the port could register model endpoints for its proxy route, create rollouts and read every call; " +
			"or pass --insecure-admin to accept that")
	}
	s, err := agl.New(cfg, srv, agl.Deps{Queue: q, Store: store, Capture: pipe, Mirror: cp.MirrorChanges, Log: log})
	if err != nil {
		return err
	}
	s.Mount()
	log.Info("serving Agent Lightning's API gateway routes (/api/rollouts, /api/models, /proxy/...)", "model_name", cfg.ModelName)
	return nil
}
