package fanout

import (
	"context"

	"github.com/fanfare-im/fanfare/store"
)

// Group administration goes through the engine, never around it: the
// gateway's admin routes hold no store. A change of an existing group runs
// on the group's worker between batches (Engine.onWorker), ordered with
// the group's sends, like AddMembers and RemoveMember.

// CreateGroup creates g in the store (g.GID 0 assigns one) and returns
// it. A new group has no members and no worker state, so nothing else
// changes.
func (e *Engine) CreateGroup(ctx context.Context, g store.Group) (store.Group, error) {
	return e.st.CreateGroup(ctx, g)
}

// Group returns one group (store.ErrGroupNotFound): the admin routes'
// read of a group.
func (e *Engine) Group(ctx context.Context, gid int64) (store.Group, error) {
	return e.st.Group(ctx, gid)
}

// SetGroupState changes gid's state (muted_all, dissolved, active) on its
// worker: sends queued before the change commit under the old state, the
// ones after it under the new.
func (e *Engine) SetGroupState(ctx context.Context, gid int64, state store.GroupState) (store.Group, error) {
	var g store.Group
	err := e.onWorker(ctx, gid, func(ctx context.Context, _ int64) error {
		var err error
		g, err = e.st.SetGroupState(ctx, gid, state)
		return err
	})
	return g, err
}

// SetUserTier creates or updates a user's VIP tier (0..auth's MaxTier;
// the store keeps it as the user's level). The tier reaches connections
// through the tokens the application signs, not through the engine.
func (e *Engine) SetUserTier(ctx context.Context, uid string, tier int) error {
	return e.st.SetUserTier(ctx, uid, tier)
}
