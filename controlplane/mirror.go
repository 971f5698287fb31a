package controlplane

import (
	"context"

	"github.com/rollgate/rollgate/controlplane/tasks"
)

// MirrorChanges writes task-queue state changes made outside the control
// plane's own routes (the Agent Lightning surface, controlplane/agl) to the
// rollouts table, and registers running rollouts' task ids with the
// gateway, as the queue's own changes are.
func (s *Server) MirrorChanges(c context.Context, changes []tasks.Change) { s.mirror(c, changes) }
