package hooks_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/fanout/hooks/pebblejournal"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// allowAll answers every before-send request with allow for each message
// (it counts the messages by their "uid" keys, as a lean receiver would).
func allowAll() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n := strings.Count(string(b), `"uid":`)
		var sb strings.Builder
		sb.WriteString(`{"results":[`)
		for i := range n {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(`{"action":"allow"}`)
		}
		sb.WriteString(`]}`)
		_, _ = io.WriteString(w, sb.String())
	}))
}

// BenchmarkBeforeSend measures one before-send call against a receiver on
// loopback, for one send per call and for a commit batch of 32 sends of a
// group: per send, the latency the call adds (p50, p99 of the call) and
// the CPU (this process: the node's side and the receiver's).
func BenchmarkBeforeSend(b *testing.B) {
	srv := allowAll()
	defer srv.Close()
	bs := hooks.NewBeforeSend(hooks.BeforeSendConfig{URL: srv.URL, Secret: secret, Timeout: 5 * time.Second})
	for _, n := range []int{1, 32} {
		b.Run("batch="+strconv.Itoa(n), func(b *testing.B) {
			items := make([]hooks.Item, n)
			for i := range items {
				items[i] = hooks.Item{UID: "user-" + strconv.Itoa(i), ClientMsgID: "c-" + strconv.Itoa(i), Body: []byte(`{"text":"hello, this is a chat message of typical size"}`)}
			}
			out := make([]hooks.Verdict, n)
			var lat []time.Duration
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				t0 := time.Now()
				bs.Check(context.Background(), 42, items, out)
				lat = append(lat, time.Since(t0))
				if out[0].Action != hooks.Allow {
					b.Fatal("not allowed")
				}
			}
			cpu := cpuTime() - cpu0
			slices.Sort(lat)
			sends := float64(len(lat) * n)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us/call")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us/call")
			b.ReportMetric(float64(cpu.Microseconds())/sends, "cpu-us/send")
			b.ReportMetric(float64(time.Duration(b.Elapsed()).Microseconds())/sends, "wall-us/send")
		})
	}
}

// BenchmarkEventRecovery journals events at a fixed rate while the
// receiver answers 500 for a second, then lets it recover, and reports
// the peak lag and the time from the recovery until the journal is empty.
func BenchmarkEventRecovery(b *testing.B) {
	const rate, down = 2000, time.Second
	for b.Loop() {
		var failing atomic.Bool
		var delivered atomic.Int64
		failing.Store(true)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			if failing.Load() {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			delivered.Add(int64(strings.Count(string(b), `"type":`)))
		}))
		j, err := pebblejournal.Open(b.TempDir(), 1<<20)
		if err != nil {
			b.Fatal(err)
		}
		met := hooks.NewMetrics(nil)
		s := hooks.NewStream(hooks.StreamConfig{URL: srv.URL, Secret: secret, Journal: j, Backoff: 10 * time.Millisecond,
			MaxBackoff: 200 * time.Millisecond, Poll: 5 * time.Millisecond, Metrics: met})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = s.Run(ctx); close(done) }()
		var seq int64
		tick := time.NewTicker(time.Second / 100)
		start := time.Now()
		for time.Since(start) < down {
			<-tick.C
			evs := make([]hooks.Event, rate/100)
			for i := range evs {
				seq++
				evs[i] = hooks.Event{Type: hooks.EventMessage, GID: 1, Seq: seq, UID: "u", TS: time.Now().UnixMilli()}
			}
			if err := s.Emit(ctx, evs); err != nil {
				b.Fatal(err)
			}
		}
		tick.Stop()
		recovered := time.Now()
		failing.Store(false)
		for delivered.Load() < seq {
			time.Sleep(time.Millisecond)
		}
		drain := time.Since(recovered)
		b.ReportMetric(float64(seq), "events")
		b.ReportMetric(float64(drain.Milliseconds()), "recovery-ms")
		b.ReportMetric(float64(time.Since(start).Milliseconds()-drain.Milliseconds()), "outage-ms")
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.Shutdown(sctx)
		scancel()
		cancel()
		<-done
		j.Close()
		srv.Close()
	}
}

// BenchmarkEmit measures what the event stream adds to a commit in
// embedded mode: one Emit (encode, pebble append with fsync) per commit
// batch, for 1 and 32 messages.
func BenchmarkEmit(b *testing.B) {
	for _, n := range []int{1, 32} {
		b.Run("batch="+strconv.Itoa(n), func(b *testing.B) {
			j, err := pebblejournal.Open(b.TempDir(), 100_000_000)
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			s := hooks.NewStream(hooks.StreamConfig{URL: "http://127.0.0.1:1", Secret: secret, Journal: j})
			evs := make([]hooks.Event, n)
			body := []byte(`{"text":"hello, this is a chat message of typical size"}`)
			b.ReportAllocs()
			var seq int64
			for b.Loop() {
				for i := range evs {
					seq++
					evs[i] = hooks.Event{Type: hooks.EventMessage, GID: 1, Seq: seq, UID: "alice", ClientMsgID: "c", Kind: "text", Body: body, TS: 1}
				}
				if err := s.Emit(context.Background(), evs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(seq), "us/event")
		})
	}
}
