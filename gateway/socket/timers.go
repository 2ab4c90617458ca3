package socket

// Deadlines are kept without timers or goroutines. Every timeout of one
// kind has the same duration, so appending a connection with deadline
// now+timeout keeps a list sorted by deadline: a per-loop sweep pops expired
// connections from the front, and refreshing a deadline is an O(1) move to
// the back. Token expiries differ per connection and live in a heap.

// tnode links a connection into one tlist.
type tnode struct {
	prev, next *Conn
	list       *tlist
	deadline   int64 // server clock, nanoseconds
}

// tlist is an intrusive FIFO of connections ordered by deadline. sel picks
// which of the connection's nodes the list uses.
type tlist struct {
	head, tail *Conn
	sel        uint8 // 0: Conn.ph (phase), 1: Conn.mt (message timer)
	n          int
}

func (l *tlist) node(c *Conn) *tnode {
	if l.sel == 0 {
		return &c.ph
	}
	return &c.mt
}

func (l *tlist) pushBack(c *Conn, deadline int64) {
	n := l.node(c)
	if n.list != nil {
		n.list.remove(c)
	}
	n.list, n.deadline, n.prev, n.next = l, deadline, l.tail, nil
	if l.tail != nil {
		l.node(l.tail).next = c
	} else {
		l.head = c
	}
	l.tail = c
	l.n++
}

func (l *tlist) remove(c *Conn) {
	n := l.node(c)
	if n.list != l {
		return
	}
	if n.prev != nil {
		l.node(n.prev).next = n.next
	} else {
		l.head = n.next
	}
	if n.next != nil {
		l.node(n.next).prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next, n.list = nil, nil, nil
	l.n--
}

// expired returns the front connection if its deadline is at or before now.
func (l *tlist) expired(now int64) *Conn {
	if c := l.head; c != nil && l.node(c).deadline <= now {
		return c
	}
	return nil
}

// expHeap is a min-heap of connections by token expiry.
type expHeap []*Conn

func (h *expHeap) push(c *Conn) {
	*h = append(*h, c)
	c.heapIdx = int32(len(*h) - 1)
	h.up(len(*h) - 1)
}

func (h *expHeap) remove(c *Conn) {
	i := int(c.heapIdx)
	if i < 0 || i >= len(*h) || (*h)[i] != c {
		return
	}
	last := len(*h) - 1
	h.swap(i, last)
	(*h)[last] = nil
	*h = (*h)[:last]
	c.heapIdx = -1
	if i < last {
		h.down(i)
		h.up(i)
	}
}

func (h expHeap) top() *Conn {
	if len(h) == 0 {
		return nil
	}
	return h[0]
}

func (h expHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = int32(i), int32(j)
}

func (h expHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h[p].expires <= h[i].expires {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h expHeap) down(i int) {
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h[l].expires < h[m].expires {
			m = l
		}
		if r < len(h) && h[r].expires < h[m].expires {
			m = r
		}
		if m == i {
			return
		}
		h.swap(i, m)
		i = m
	}
}
