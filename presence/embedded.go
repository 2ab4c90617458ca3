package presence

import "context"

// DefaultNodeID is the node id an Embedded view reports when none is given.
const DefaultNodeID = "local"

// Embedded is the Cluster view of a single-node deployment (embedded mode):
// the cluster is this node, so every answer comes straight from the local
// Source and is never stale.
type Embedded struct {
	src  Source
	node string
}

var _ Cluster = (*Embedded)(nil)

// NewEmbedded returns the cluster view of a single node whose presence is
// src. nodeID "" means DefaultNodeID.
func NewEmbedded(src Source, nodeID string) *Embedded {
	if nodeID == "" {
		nodeID = DefaultNodeID
	}
	return &Embedded{src: src, node: nodeID}
}

// OnlineCount returns the number of members of gid online on this node.
func (e *Embedded) OnlineCount(ctx context.Context, gid int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return int64(e.src.OnlineCount(gid)), nil
}

// Nodes returns this node's id when a member of gid is online, else nothing.
func (e *Embedded) Nodes(ctx context.Context, gid int64) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if e.src.OnlineCount(gid) == 0 {
		return nil, nil
	}
	return []string{e.node}, nil
}

// OnlineAnywhere appends, for each ordinal, whether it is online on this node.
func (e *Embedded) OnlineAnywhere(ctx context.Context, gid int64, ordinals []uint32, dst []bool) ([]bool, error) {
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	for _, o := range ordinals {
		dst = append(dst, e.src.ContainsOrdinal(gid, o))
	}
	return dst, nil
}

// Flush does nothing: the view is the local state.
func (e *Embedded) Flush(ctx context.Context) error { return ctx.Err() }

// Stale always reports false.
func (e *Embedded) Stale() bool { return false }
