package waitroom

import (
	"context"
	"fmt"
	"maps"
	"math"
	"reflect"
)

// JournalDiff loads a fresh backend from m's journal, exactly as written
// (without the restart rules of OpenMemory), and describes how its state
// differs from m's; "" when it does not. cfgs are the rooms' last
// configurations: a token bucket is compared by its level at m's clock,
// which is all that a write skipped for an idle bucket leaves unsaved.
func JournalDiff(ctx context.Context, m *Memory, cfgs map[string]RoomConfig) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := NewMemory(MemoryConfig{Clock: m.clock})
	f.j = m.j
	if err := f.load(ctx); err != nil {
		return "", err
	}
	if !reflect.DeepEqual(m.configs, f.configs) {
		return fmt.Sprintf("configs: live %v, journal %v", m.configs, f.configs), nil
	}
	_, nowUS := m.now()
	names := map[string]bool{}
	for n := range m.rooms {
		names[n] = true
	}
	for n := range f.rooms {
		names[n] = true
	}
	for name := range names {
		a, b := m.rooms[name], f.rooms[name]
		if a == nil {
			a = newMemRoom()
		}
		if b == nil {
			b = newMemRoom()
		}
		if d := roomDiff(a, b, cfgs[name], nowUS); d != "" {
			return "room " + name + ": " + d, nil
		}
	}
	return "", nil
}

func roomDiff(a, b *memRoom, cfg RoomConfig, nowUS int64) string {
	if len(a.entries) != len(b.entries) {
		return fmt.Sprintf("%d entries live, %d in the journal", len(a.entries), len(b.entries))
	}
	for uid, ea := range a.entries {
		eb := b.entries[uid]
		if eb == nil || *ea != *eb {
			return fmt.Sprintf("entry %s: live %+v, journal %+v", uid, ea, eb)
		}
		if sa, sb := a.smooth.Has(float64(ea.join), uid), b.smooth.Has(float64(eb.join), uid); sa != sb {
			return fmt.Sprintf("entry %s: smoothing live %v, journal %v", uid, sa, sb)
		}
	}
	for _, p := range []struct {
		name string
		a, b *ostree
	}{{"queue", a.q, b.q}, {"join", a.j, b.j}, {"away", a.away, b.away}, {"active", a.active, b.active},
		{"smooth", a.smooth, b.smooth}, {"vip queue", a.qv, b.qv}, {"normal queue", a.qn, b.qn}, {"vip promises", a.jv, b.jv}} {
		if p.a.Len() != p.b.Len() {
			return fmt.Sprintf("%s index: %d live, %d in the journal", p.name, p.a.Len(), p.b.Len())
		}
	}
	if a.byTier != b.byTier {
		return fmt.Sprintf("waiting by tier: live %v, journal %v", a.byTier, b.byTier)
	}
	owned := func(r *memRoom) map[string]map[string]struct{} {
		out := map[string]map[string]struct{}{}
		for n, set := range r.owned {
			if len(set) > 0 {
				out[n] = set
			}
		}
		return out
	}
	if !reflect.DeepEqual(owned(a), owned(b)) {
		return fmt.Sprintf("owned: live %v, journal %v", owned(a), owned(b))
	}
	if a.shareV != b.shareV || a.shareN != b.shareN || a.rate != b.rate || a.lmax != b.lmax ||
		a.lmaxSet != b.lmaxSet || a.placeSeq != b.placeSeq || a.oseq != b.oseq {
		return fmt.Sprintf("counters: live %v/%v rate %v lmax %v/%v seq %d/%d, journal %v/%v rate %v lmax %v/%v seq %d/%d",
			a.shareV, a.shareN, a.rate, a.lmax, a.lmaxSet, a.placeSeq, a.oseq, b.shareV, b.shareN, b.rate, b.lmax, b.lmaxSet, b.placeSeq, b.oseq)
	}
	if !maps.Equal(a.adm, b.adm) || !maps.Equal(a.nodes, b.nodes) {
		return fmt.Sprintf("window or nodes: live %v %v, journal %v %v", a.adm, a.nodes, b.adm, b.nodes)
	}
	level := func(r *memRoom) float64 {
		if r.tokenTS == 0 {
			return cfg.AdmitBurst
		}
		return math.Min(cfg.AdmitBurst, r.tokens+cfg.AdmitRate*float64(max(nowUS-r.tokenTS, 0))/1e6)
	}
	if la, lb := level(a), level(b); math.Abs(la-lb) > 1e-6 {
		return fmt.Sprintf("token bucket: live %v, journal %v", la, lb)
	}
	return ""
}
