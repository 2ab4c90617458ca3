package waitroom_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
)

// BenchmarkVIPSurge runs the surge scenario (20,000 normal users queued
// over 200 s, then 3,000 VIPs at once; admit_rate 15/s, max_wait 20 min)
// on the in-process backend with a virtual clock and reports the wait
// distribution per level in seconds.
func BenchmarkVIPSurge(b *testing.B) {
	b.Run("normal=20000/vip=3000", func(b *testing.B) {
		b.ReportAllocs()
		var res *waitroom.SimResult
		for b.Loop() {
			var err error
			res, err = waitroom.VIPSurge(b.Context(), waitroom.SurgeConfig{})
			if err != nil {
				b.Fatal(err)
			}
		}
		for l, w := range res.PerTier {
			b.ReportMetric(w.P50.Seconds(), fmt.Sprintf("L%d_p50_s", l))
			b.ReportMetric(w.P99.Seconds(), fmt.Sprintf("L%d_p99_s", l))
			b.ReportMetric(w.Max.Seconds(), fmt.Sprintf("L%d_max_s", l))
		}
		b.ReportMetric(res.MaxNormalWait.Seconds(), "normal_max_wait_s")
		b.ReportMetric(float64(res.Overdue), "overdue_admissions")
		b.Logf("\n%s", res.Table(20*time.Minute))
	})
}

// BenchmarkMemoryEnterAdmit measures the in-process backend (embedded
// mode, Redis-down fallback): one enter and one admission per op on a
// queue of 100,000.
func BenchmarkMemoryEnterAdmit(b *testing.B) {
	b.Run("queued=100000", func(b *testing.B) {
		m := waitroom.NewMemory(waitroom.MemoryConfig{})
		rc := waitroom.RoomConfig{Name: "bench", MaxActive: 1 << 30, AdmitRate: 1e6, AdmitBurst: 1e6, TargetWait: 24 * time.Hour}.WithDefaults()
		for i := range 100000 {
			m.Enter(b.Context(), &rc, waitroom.EnterRequest{UID: fmt.Sprintf("p%07d", i), Tier: i % 4})
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if _, err := m.Enter(b.Context(), &rc, waitroom.EnterRequest{UID: fmt.Sprintf("q%09d", i), Tier: i % 4}); err != nil {
				b.Fatal(err)
			}
			if _, err := m.Admit(b.Context(), &rc, waitroom.AdmitRequest{Max: 1}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLocalPosition: a rank query answered from the node's local
// snapshot (Manager.Position), which keeps rank queries off Redis.
func BenchmarkLocalPosition(b *testing.B) {
	b.Run("local=20000", func(b *testing.B) {
		m, err := waitroom.New(waitroom.Config{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.Upsert(b.Context(), waitroom.RoomConfig{Name: "r", MaxActive: 1, TargetWait: 24 * time.Hour}); err != nil {
			b.Fatal(err)
		}
		uids := make([]string, 20000)
		for i := range uids {
			uids[i] = fmt.Sprintf("u%05d", i)
			if _, err := m.Join(b.Context(), "r", uids[i], i%4, func(waitroom.Update) {}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, ok := m.Position("r", uids[i%len(uids)]); !ok {
				b.Fatal("no position")
			}
			i++
		}
	})
}
