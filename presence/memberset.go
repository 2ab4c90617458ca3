package presence

// smallSet is how many memberships a user keeps in a slice before switching
// to a map: most users are in few groups, and a slice of 16-byte entries is
// far smaller than a map, while a linear scan of 16 is about as fast as hashing.
const smallSet = 16

// memberSet maps gid -> ordinal for one user with O(1) operations.
type memberSet struct {
	small []Membership
	big   map[int64]uint32
}

func (m *memberSet) get(gid int64) (uint32, bool) {
	if m.big != nil {
		o, ok := m.big[gid]
		return o, ok
	}
	for _, e := range m.small {
		if e.GID == gid {
			return e.Ordinal, true
		}
	}
	return 0, false
}

func (m *memberSet) set(gid int64, ord uint32) {
	if m.big != nil {
		m.big[gid] = ord
		return
	}
	for i := range m.small {
		if m.small[i].GID == gid {
			m.small[i].Ordinal = ord
			return
		}
	}
	if len(m.small) < smallSet {
		m.small = append(m.small, Membership{GID: gid, Ordinal: ord})
		return
	}
	m.big = make(map[int64]uint32, 2*smallSet)
	for _, e := range m.small {
		m.big[e.GID] = e.Ordinal
	}
	m.big[gid] = ord
	m.small = nil
}

func (m *memberSet) del(gid int64) {
	if m.big != nil {
		delete(m.big, gid)
		return
	}
	for i := range m.small {
		if m.small[i].GID == gid {
			last := len(m.small) - 1
			m.small[i] = m.small[last]
			m.small = m.small[:last]
			return
		}
	}
}

func (m *memberSet) each(fn func(gid int64, ord uint32)) {
	if m.big != nil {
		for g, o := range m.big {
			fn(g, o)
		}
		return
	}
	for _, e := range m.small {
		fn(e.GID, e.Ordinal)
	}
}
