package waitroom

import "strings"

// An entry's holders are the nodes holding a ticket of the user: a node
// that enters the user joins them (as the first, the one Entry.Node
// names), a node whose last ticket of the user closes leaves them
// (Backend.Disconnect), and so does a dead node (Maintain's sweep). The
// user is disconnected only when the last one leaves: a polling visitor
// whose polls moved to another node is not made away by the old node's
// timeout. Both backends store them as one string, the node names joined
// by commas (ValidNode allows no comma), the latest first; Memory in its
// entry's node field, Redis in the entry's last field (the Lua copies are
// in redisroom's prelude).

// withHolder puts node first in list, once.
func withHolder(list, node string) string {
	if list == "" || list == node {
		return node
	}
	rest, _ := withoutHolder(list, node)
	if rest == "" {
		return node
	}
	return node + "," + rest
}

// withoutHolder takes node out of list; false when it was not in it.
func withoutHolder(list, node string) (string, bool) {
	if list == node {
		return "", node != ""
	}
	if node == "" || !strings.Contains(list, node) {
		return list, false
	}
	var b strings.Builder
	found := false
	for n := range strings.SplitSeq(list, ",") {
		if n == node {
			found = true
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(n)
	}
	return b.String(), found
}

// firstHolder is the node that entered the user last ("" = none).
func firstHolder(list string) string {
	if i := strings.IndexByte(list, ','); i >= 0 {
		return list[:i]
	}
	return list
}

// eachHolder calls fn for every node of list.
func eachHolder(list string, fn func(node string)) {
	if list == "" {
		return
	}
	for n := range strings.SplitSeq(list, ",") {
		fn(n)
	}
}
