package waitroom

// ostree is an order-statistic treap keyed by (score, uid), ordered exactly
// like a Redis sorted set: by score, then by the member's bytes. It answers
// "how many members are below this key" in O(log n), which is what rank and
// admission need. Not safe for concurrent use; the Memory backend guards it.
type ostree struct {
	root *osnode
	seed uint64 // xorshift state for priorities; deterministic per tree
}

type osnode struct {
	score       float64
	uid         string
	prio        uint64
	size        int
	left, right *osnode
}

func newOSTree() *ostree { return &ostree{seed: 0x9E3779B97F4A7C15} }

func (t *ostree) nextPrio() uint64 {
	t.seed ^= t.seed << 13
	t.seed ^= t.seed >> 7
	t.seed ^= t.seed << 17
	return t.seed
}

func sizeOf(n *osnode) int {
	if n == nil {
		return 0
	}
	return n.size
}

func (n *osnode) fix() { n.size = 1 + sizeOf(n.left) + sizeOf(n.right) }

// less orders keys like a Redis ZSET: score first, then member bytes.
func less(s1 float64, u1 string, s2 float64, u2 string) bool {
	if s1 != s2 {
		return s1 < s2
	}
	return u1 < u2
}

// split divides n into keys < (s,u) and keys >= (s,u).
func split(n *osnode, s float64, u string) (l, r *osnode) {
	if n == nil {
		return nil, nil
	}
	if less(n.score, n.uid, s, u) {
		a, b := split(n.right, s, u)
		n.right = a
		n.fix()
		return n, b
	}
	a, b := split(n.left, s, u)
	n.left = b
	n.fix()
	return a, n
}

func merge(l, r *osnode) *osnode {
	if l == nil {
		return r
	}
	if r == nil {
		return l
	}
	if l.prio > r.prio {
		l.right = merge(l.right, r)
		l.fix()
		return l
	}
	r.left = merge(l, r.left)
	r.fix()
	return r
}

// Len is the number of members.
func (t *ostree) Len() int { return sizeOf(t.root) }

// Insert adds (s,u). The caller guarantees u is not present with any score.
func (t *ostree) Insert(s float64, u string) {
	n := &osnode{score: s, uid: u, prio: t.nextPrio(), size: 1}
	l, r := split(t.root, s, u)
	t.root = merge(merge(l, n), r)
}

// Delete removes (s,u) if present and reports whether it was.
func (t *ostree) Delete(s float64, u string) bool {
	var removed bool
	t.root = deleteNode(t.root, s, u, &removed)
	return removed
}

func deleteNode(n *osnode, s float64, u string, removed *bool) *osnode {
	if n == nil {
		return nil
	}
	switch {
	case n.score == s && n.uid == u:
		*removed = true
		return merge(n.left, n.right)
	case less(s, u, n.score, n.uid):
		n.left = deleteNode(n.left, s, u, removed)
	default:
		n.right = deleteNode(n.right, s, u, removed)
	}
	n.fix()
	return n
}

// Has reports whether (s,u) is in the tree.
func (t *ostree) Has(s float64, u string) bool {
	for n := t.root; n != nil; {
		switch {
		case n.score == s && n.uid == u:
			return true
		case less(s, u, n.score, n.uid):
			n = n.left
		default:
			n = n.right
		}
	}
	return false
}

// CountBelow is the number of members whose key is < (s,u).
func (t *ostree) CountBelow(s float64, u string) int {
	c := 0
	for n := t.root; n != nil; {
		if less(n.score, n.uid, s, u) {
			c += sizeOf(n.left) + 1
			n = n.right
		} else {
			n = n.left
		}
	}
	return c
}

// CountScoreBelow is the number of members with score < s (ZCOUNT -inf (s).
func (t *ostree) CountScoreBelow(s float64) int {
	c := 0
	for n := t.root; n != nil; {
		if n.score < s {
			c += sizeOf(n.left) + 1
			n = n.right
		} else {
			n = n.left
		}
	}
	return c
}

// CountScoreAtMost is the number of members with score <= s (ZCOUNT -inf s).
func (t *ostree) CountScoreAtMost(s float64) int {
	c := 0
	for n := t.root; n != nil; {
		if n.score <= s {
			c += sizeOf(n.left) + 1
			n = n.right
		} else {
			n = n.left
		}
	}
	return c
}

// Min returns the smallest key.
func (t *ostree) Min() (float64, string, bool) {
	n := t.root
	if n == nil {
		return 0, "", false
	}
	for n.left != nil {
		n = n.left
	}
	return n.score, n.uid, true
}

// Ascend calls fn for members in order until fn returns false.
func (t *ostree) Ascend(fn func(s float64, u string) bool) {
	ascend(t.root, fn)
}

func ascend(n *osnode, fn func(float64, string) bool) bool {
	if n == nil {
		return true
	}
	if !ascend(n.left, fn) {
		return false
	}
	if !fn(n.score, n.uid) {
		return false
	}
	return ascend(n.right, fn)
}
