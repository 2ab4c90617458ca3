package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
)

// BenchmarkRoomPollStatus is the server side of one status poll
// (GET /v1/rooms/{room}/status: ticket check, poller lookup, answer from
// memory) on a node holding users=N polling visitors of one room, without
// the network: the handler is called directly. fanfare bench polls
// measures the whole path over sockets (docs/benchmarks.md).
func BenchmarkRoomPollStatus(b *testing.B) {
	for _, n := range []int{1000, 100_000} {
		b.Run(fmt.Sprintf("users=%d", n), func(b *testing.B) {
			m, err := waitroom.New(waitroom.Config{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if _, err := m.Upsert(ctx, waitroom.RoomConfig{Name: "bench", MaxActive: 1, AdmitRate: 1, MaxWait: 24 * time.Hour,
				TargetWait: 24 * time.Hour, Site: &waitroom.Site{Anonymous: true}}); err != nil {
				b.Fatal(err)
			}
			rs, err := NewRooms(RoomsConfig{Manager: m, MaxPollers: n + 1})
			if err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			tickets := make([]string, n)
			for i := range tickets {
				id := RoomTicket{Room: "bench", UID: fmt.Sprintf("anon:%032x", i), Anonymous: true}
				if _, err := rs.pollerFor(ctx, id); err != nil {
					b.Fatal(err)
				}
				tickets[i] = rs.tickets.Sign(id, now)
			}
			req := httptest.NewRequest(http.MethodGet, "/v1/rooms/bench/status", nil)
			req.SetPathValue("room", "bench")
			w := &discardWriter{h: http.Header{}}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				req.Header.Set(ticketHeader, tickets[i%n])
				i++
				clear(w.h)
				if err := rs.pollStatus(w, req); err != nil || w.status != http.StatusOK {
					b.Fatalf("poll: %v %d", err, w.status)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "polls/s")
		})
	}
}

type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(s int)           { w.status = s }
