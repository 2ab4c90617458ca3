// This file holds the merge windows (L1, L2): a group's pending push,
// flushed when its window ends (the worker's tick, shard.go), when it is
// full, or before a change runs on the worker. It is the end of a send's
// walk; the triggers that set levels are in triggers.go.

package fanout

import "github.com/fanfare-im/fanfare/store"

// window is one group's pending messages in a merge window.
type window struct {
	msgs    []store.Message // L1: all (bounded by MaxMerge); L2: the first only
	count   int
	lastSeq int64
	kind    PushKind
}

// flushWindows ends the merge window of every group.
func (s *shard) flushWindows() {
	for i, gs := range s.open {
		if gs.win.count > 0 {
			s.flushWindow(gs)
		}
		gs.open = false
		s.open[i] = nil
	}
	s.open = s.open[:0]
}

func (s *shard) flushWindow(gs *gstate) {
	w := &gs.win
	if s.e.pres != nil && s.e.push != nil && w.count > 0 {
		if s.pushLevel(gs) < L3WriteOnly { // else dropped: the level rose during the window
			s.pushNow(gs.gid, w.kind, w.msgs, w.count, w.lastSeq)
		}
	}
	resetWindow(w)
}

func resetWindow(w *window) {
	clear(w.msgs) // drop body references
	w.msgs = w.msgs[:0]
	w.count, w.lastSeq = 0, 0
}
