// This file holds the resume cursor of an event stream (docs/protocol.md
// §14.4): the per-group seqs a stream delivered, written as the id of its
// events and read back from Last-Event-ID or ?cursor= when a client
// reconnects.

package gateway

import (
	"slices"
	"strconv"
	"strings"
)

// cursorEntry is one group's position in a cursor: the highest seq the
// stream delivered (or told the client to pull up to) for gid.
type cursorEntry struct {
	gid, seq int64
}

// cursor is a stream's per-group positions, sorted by gid, at most max
// entries. partial says groups of the user are missing from it (the user
// has more groups than max, or a group could not be added): a client
// resuming from a partial cursor syncs (GET /v1/sync) as after any
// reconnect.
type cursor struct {
	e       []cursorEntry
	max     int
	partial bool
}

// set records seq for gid: it raises an existing entry (never lowers it)
// and inserts a new one while there is room; past max the cursor becomes
// partial. It allocates only when a group is added past the slice's
// capacity (the capacity is max from the start).
func (c *cursor) set(gid, seq int64) {
	i, found := c.find(gid)
	if found {
		if seq > c.e[i].seq {
			c.e[i].seq = seq
		}
		return
	}
	if len(c.e) >= c.max {
		c.partial = true
		return
	}
	c.e = slices.Insert(c.e, i, cursorEntry{gid, seq})
}

// find returns gid's index in c, or where it would be inserted.
func (c *cursor) find(gid int64) (int, bool) {
	return slices.BinarySearchFunc(c.e, gid, func(e cursorEntry, g int64) int {
		switch {
		case e.gid < g:
			return -1
		case e.gid > g:
			return 1
		}
		return 0
	})
}

// appendCursor appends c's text form: "c" (complete) or "p" (partial),
// then the entries separated by "-", each "<gid delta>.<seq>" in base 36,
// the first gid absolute and every later one the difference to the one
// before it. The characters ([0-9a-z.-]) need no escaping in a header or
// a query parameter.
func appendCursor(dst []byte, c *cursor) []byte {
	if c.partial {
		dst = append(dst, 'p')
	} else {
		dst = append(dst, 'c')
	}
	var prev int64
	for i, e := range c.e {
		if i > 0 {
			dst = append(dst, '-')
		}
		dst = strconv.AppendInt(dst, e.gid-prev, 36)
		dst = append(dst, '.')
		dst = strconv.AppendInt(dst, e.seq, 36)
		prev = e.gid
	}
	return dst
}

// maxCursorEntryLen is the longest text of one entry: two 13-digit base-36
// numbers (int64), the dot and the separator.
const maxCursorEntryLen = 13 + 1 + 13 + 1

// parseCursor reads the text form of appendCursor, of at most max
// entries, into a cursor of capacity max. It refuses, with a client-facing
// reason, anything else: another length, an unknown prefix, gids not
// strictly increasing or not positive, negative seqs.
func parseCursor(s string, max int) (cursor, error) {
	c := cursor{max: max}
	if len(s) > 1+max*maxCursorEntryLen {
		return c, BadRequest("cursor is %d bytes, longer than %d groups allow", len(s), max)
	}
	if s == "" {
		return c, BadRequest("cursor is empty")
	}
	switch s[0] {
	case 'c':
	case 'p':
		c.partial = true
	default:
		return c, BadRequest("cursor must start with c or p")
	}
	c.e = make([]cursorEntry, 0, max)
	rest := s[1:]
	var prev int64
	for rest != "" {
		if len(c.e) == max {
			return c, BadRequest("cursor has more than %d groups", max)
		}
		item := rest
		if i := strings.IndexByte(rest, '-'); i >= 0 {
			item, rest = rest[:i], rest[i+1:]
			if rest == "" {
				return c, BadRequest("cursor ends with a separator")
			}
		} else {
			rest = ""
		}
		dot := strings.IndexByte(item, '.')
		if dot < 0 {
			return c, BadRequest("cursor entry %q has no dot", item)
		}
		d, err1 := strconv.ParseInt(item[:dot], 36, 64)
		seq, err2 := strconv.ParseInt(item[dot+1:], 36, 64)
		if err1 != nil || err2 != nil || d <= 0 || seq < 0 || prev > (1<<63-1)-d {
			return c, BadRequest("cursor entry %q is not a gid delta above 0 and a seq of 0 or more", item)
		}
		prev += d
		c.e = append(c.e, cursorEntry{prev, seq})
	}
	return c, nil
}
