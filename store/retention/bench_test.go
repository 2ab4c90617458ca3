package retention_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/embedded"
	"github.com/fanfare-im/fanfare/store/postgres"
	"github.com/fanfare-im/fanfare/store/postgres/pgtest"
	"github.com/fanfare-im/fanfare/store/retention"
	"github.com/fanfare-im/fanfare/store/storetest"
)

// BenchmarkRound measures a retention round on both backends:
// expired=none walks groups with nothing to delete (the steady state: one
// probe per group), expired=all deletes every message of the groups
// (ns/op is per round; see the per-group and per-message metrics) and
// times the next round (nothing left to delete, over what was deleted).
// Run:
//
//	go test -run '^$' -bench Round -benchtime 3x ./store/retention/
func BenchmarkRound(b *testing.B) {
	backends := []string{"embedded"}
	if os.Getenv("FANFARE_TEST_POSTGRES_URL") != "" {
		backends = append(backends, "postgres")
	}
	for _, backend := range backends {
		for _, tc := range []struct {
			name             string
			groups, messages int
			expired          bool
		}{
			{"groups=1000/messages=10/expired=none", 1000, 10, false},
			{"groups=100/messages=1000/expired=all", 100, 1000, true},
			{"groups=1/messages=100000/expired=all", 1, 100000, true},
		} {
			b.Run("backend="+backend+"/"+tc.name, func(b *testing.B) {
				ctx := context.Background()
				var groups, deleted int
				var after time.Duration // the next round's, once all expired
				for b.Loop() {
					b.StopTimer()
					st := openBench(b, backend)
					gids := fill(b, st, tc.groups, tc.messages)
					keep := time.Hour
					now := time.Now
					if tc.expired {
						now = func() time.Time { return time.Now().Add(2 * time.Hour) }
					}
					sw, err := retention.New(retention.Config{Store: st, Keep: keep, Now: now})
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					g, d, err := sw.Round(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if g < len(gids) || (tc.expired && d != len(gids)*tc.messages) {
						b.Fatalf("round: %d groups, %d deleted", g, d)
					}
					groups, deleted = groups+g, deleted+d
					if tc.expired {
						b.StopTimer()
						start := time.Now()
						if _, _, err := sw.Round(ctx); err != nil {
							b.Fatal(err)
						}
						after += time.Since(start)
						b.StartTimer()
					}
				}
				secs := b.Elapsed().Seconds()
				b.ReportMetric(secs*1e6/float64(groups), "µs/group")
				if deleted > 0 {
					b.ReportMetric(float64(deleted)/secs, "deleted/s")
					b.ReportMetric(float64(after.Microseconds())/float64(groups), "µs/group-next-round")
				}
			})
		}
	}
}

func openBench(b *testing.B, backend string) store.Store {
	b.Helper()
	var st store.Store
	var err error
	switch backend {
	case "embedded":
		st, err = embedded.Open(embedded.Config{Dir: b.TempDir()})
	case "postgres":
		url := pgtest.URL(b)
		st, err = postgres.Open(context.Background(), postgres.Config{URL: url, Schema: pgtest.Schema(b, url)})
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// fill creates groups with messages each (appended 1,000 at a time).
func fill(b *testing.B, st store.Store, groups, messages int) []int64 {
	b.Helper()
	ctx := context.Background()
	gids := make([]int64, groups)
	for i := range gids {
		g, err := st.CreateGroup(ctx, store.Group{Name: "g", Owner: "a"})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := st.AddMembers(ctx, g.GID, []string{"a"}); err != nil {
			b.Fatal(err)
		}
		gids[i] = g.GID
	}
	var reqs []store.AppendRequest
	flush := func() {
		res := make([]store.AppendResult, len(reqs))
		if err := st.Append(ctx, reqs, res); err != nil {
			b.Fatal(err)
		}
		reqs = reqs[:0]
	}
	for _, gid := range gids {
		for range messages {
			reqs = append(reqs, store.AppendRequest{GID: gid, Sender: "a", ClientMsgID: storetest.NextClientMsgID(), Body: []byte(storetest.BenchBody)})
			if len(reqs) == 1000 {
				flush()
			}
		}
	}
	if len(reqs) > 0 {
		flush()
	}
	return gids
}
