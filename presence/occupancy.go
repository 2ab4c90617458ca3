package presence

// OccupancyQuery asks a cluster view for one group's occupancy, the input
// of the member presence feed (docs/architecture.md §7.1). A group is
// either counted (its online count, whatever its size) or rostered (its
// online uids, for groups small enough to list; the count is then the
// roster's size). With Publish, the query first replaces this node's
// roster of the group with UIDs (empty = withdraw it).
type OccupancyQuery struct {
	GID     int64
	Roster  bool
	Publish bool
	UIDs    []string // this node's online members of GID, when Publish
}

// Occupancy is the cluster-wide answer to an OccupancyQuery.
type Occupancy struct {
	// Count is the distinct members of the group online on any live node
	// (for a roster query, len(UIDs)).
	Count int64
	// UIDs (roster queries only) are the distinct online members, sorted.
	UIDs []string
}
