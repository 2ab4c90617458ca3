package hooks_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/fanout/hooks/pebblejournal"
)

var secret = []byte("0123456789abcdef-secret")

func TestSignVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"type":"before_send"}`)
	h := http.Header{}
	h.Set(hooks.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(hooks.HeaderSignature, hooks.Sign(secret, now.Unix(), body))
	cases := []struct {
		name string
		mod  func(h http.Header) (http.Header, []byte, time.Time, []byte)
		ok   bool
	}{
		{"valid", func(h http.Header) (http.Header, []byte, time.Time, []byte) { return h, body, now, secret }, true},
		{"edge of the window", func(h http.Header) (http.Header, []byte, time.Time, []byte) {
			return h, body, now.Add(5 * time.Minute), secret
		}, true},
		{"replayed past the window", func(h http.Header) (http.Header, []byte, time.Time, []byte) {
			return h, body, now.Add(5*time.Minute + time.Second), secret
		}, false},
		{"from the future", func(h http.Header) (http.Header, []byte, time.Time, []byte) {
			return h, body, now.Add(-6 * time.Minute), secret
		}, false},
		{"body changed", func(h http.Header) (http.Header, []byte, time.Time, []byte) {
			return h, []byte(`{"type":"before_send "}`), now, secret
		}, false},
		{"other secret", func(h http.Header) (http.Header, []byte, time.Time, []byte) {
			return h, body, now, []byte("another-secret-0123456")
		}, false},
		{"timestamp changed", func(h http.Header) (http.Header, []byte, time.Time, []byte) {
			h = h.Clone()
			h.Set(hooks.HeaderTimestamp, strconv.FormatInt(now.Unix()+1, 10))
			return h, body, now, secret
		}, false},
		{"no timestamp", func(h http.Header) (http.Header, []byte, time.Time, []byte) {
			h = h.Clone()
			h.Del(hooks.HeaderTimestamp)
			return h, body, now, secret
		}, false},
	}
	for _, c := range cases {
		hh, b, at, key := c.mod(h)
		err := hooks.Verify(key, hh, b, at, 5*time.Minute)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, hooks.ErrBadSignature)) {
			t.Errorf("%s: got %v, want ok=%v", c.name, err, c.ok)
		}
	}
}

func TestParseGIDSet(t *testing.T) {
	cases := []struct {
		in                string
		ok                bool
		in7, in150, in300 bool
	}{
		{"all", true, true, true, true},
		{"", true, true, true, true},
		{"7,100-199", true, true, true, false},
		{"300", true, false, false, true},
		{"0", false, false, false, false},
		{"-5", false, false, false, false},
		{"9-3", false, false, false, false},
		{"x", false, false, false, false},
		{strings.Repeat("1,", hooks.MaxGIDRanges) + "1", false, false, false, false},
	}
	for _, c := range cases {
		s, err := hooks.ParseGIDSet(c.in)
		if (err == nil) != c.ok {
			t.Errorf("%q: err %v, want ok=%v", c.in, err, c.ok)
			continue
		}
		if err == nil && (s.Contains(7) != c.in7 || s.Contains(150) != c.in150 || s.Contains(300) != c.in300) {
			t.Errorf("%q: contains 7/150/300 = %v/%v/%v", c.in, s.Contains(7), s.Contains(150), s.Contains(300))
		}
	}
}

// TestBeforeSendAnswers: every malformed answer fails the call whole, and
// the policy decides every item.
func TestBeforeSendAnswers(t *testing.T) {
	var mu sync.Mutex
	answer := ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if err := hooks.Verify(secret, r.Header, b, time.Now(), time.Minute); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		a := answer
		mu.Unlock()
		_, _ = io.WriteString(w, a)
	}))
	defer srv.Close()
	items := []hooks.Item{{UID: "a", ClientMsgID: "1", Body: []byte(`{"x":1}`)}, {UID: "b", ClientMsgID: "2", Body: []byte(`2`)}}
	cases := []struct {
		name   string
		answer string
		want   []hooks.Action
		code   string
	}{
		{"allow and reject", `{"results":[{"action":"allow"},{"action":"reject","code":"spam"}]}`, []hooks.Action{hooks.Allow, hooks.Reject}, "spam"},
		{"reject without code", `{"results":[{"action":"reject"},{}]}`, []hooks.Action{hooks.Reject, hooks.Allow}, "rejected"},
		{"rewrite", `{"results":[{"action":"rewrite","body":{"y":2}},{"action":"allow"}]}`, []hooks.Action{hooks.Rewrite, hooks.Allow}, ""},
		{"too few results", `{"results":[{"action":"allow"}]}`, []hooks.Action{hooks.Unavailable, hooks.Unavailable}, ""},
		{"unknown action", `{"results":[{"action":"maybe"},{}]}`, []hooks.Action{hooks.Unavailable, hooks.Unavailable}, ""},
		{"bad code", `{"results":[{"action":"reject","code":"Has Space"},{}]}`, []hooks.Action{hooks.Unavailable, hooks.Unavailable}, ""},
		{"rewrite too large", `{"results":[{"action":"rewrite","body":"` + strings.Repeat("x", 100) + `"},{}]}`, []hooks.Action{hooks.Unavailable, hooks.Unavailable}, ""},
		{"not JSON", `allow`, []hooks.Action{hooks.Unavailable, hooks.Unavailable}, ""},
	}
	for _, failOpen := range []bool{false, true} {
		b := hooks.NewBeforeSend(hooks.BeforeSendConfig{URL: srv.URL, Secret: secret, Timeout: 5 * time.Second, MaxBody: 64, FailOpen: failOpen})
		for _, c := range cases {
			mu.Lock()
			answer = c.answer
			mu.Unlock()
			out := make([]hooks.Verdict, len(items))
			b.Check(context.Background(), 7, items, out)
			for i, v := range out {
				want := c.want[i]
				if want == hooks.Unavailable && failOpen {
					want = hooks.Allow
				}
				if v.Action != want {
					t.Errorf("%s (fail open %v): item %d got action %d, want %d", c.name, failOpen, i, v.Action, want)
				}
				if v.Action == hooks.Reject && v.Code != c.code {
					t.Errorf("%s: code %q, want %q", c.name, v.Code, c.code)
				}
				if v.Action == hooks.Rewrite && string(v.Body) != `{"y":2}` {
					t.Errorf("%s: body %s", c.name, v.Body)
				}
			}
		}
	}
}

// TestPebbleJournal: ids increase, the capacity holds, the cursor and the
// records survive a reopen, and Ack frees space.
func TestPebbleJournal(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	j, err := pebblejournal.Open(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Append(ctx, [][]byte{[]byte(`1`), []byte(`2`)}); err != nil {
		t.Fatal(err)
	}
	if err := j.Append(ctx, [][]byte{[]byte(`3`), []byte(`4`)}); !errors.Is(err, hooks.ErrFull) {
		t.Fatalf("past capacity: got %v, want ErrFull", err)
	}
	if err := j.Append(ctx, [][]byte{[]byte(`3`)}); err != nil {
		t.Fatal(err)
	}
	recs, _ := j.Read(ctx, 2)
	if len(recs) != 2 || string(recs[0].Data) != "1" || string(recs[1].Data) != "2" {
		t.Fatalf("read: %+v", recs)
	}
	if err := j.Ack(ctx, recs[1].ID); err != nil {
		t.Fatal(err)
	}
	j.Close()
	j, err = pebblejournal.Open(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if n, _ := j.Pending(ctx); n != 1 {
		t.Fatalf("pending after reopen: %d, want 1", n)
	}
	recs, _ = j.Read(ctx, 10)
	if len(recs) != 1 || string(recs[0].Data) != "3" {
		t.Fatalf("read after reopen: %+v", recs)
	}
	if err := j.Append(ctx, [][]byte{[]byte(`4`), []byte(`5`)}); err != nil {
		t.Fatalf("room after ack: %v", err)
	}
	recs, _ = j.Read(ctx, 10)
	if len(recs) != 3 || recs[2].ID <= recs[0].ID && len(recs[2].ID) <= len(recs[0].ID) {
		t.Fatalf("ids after reopen: %+v", recs)
	}
}

// TestStreamHoldsWhenFull: with the receiver down, Emit waits for room
// once the journal is full, and goes on when the receiver recovers;
// nothing is lost, order is kept.
func TestStreamHoldsWhenFull(t *testing.T) {
	var mu sync.Mutex
	var got []int64
	down := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if down {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		var batch struct{ Events []hooks.Event }
		_ = json.Unmarshal(b, &batch)
		for _, ev := range batch.Events {
			got = append(got, ev.Seq)
		}
	}))
	defer srv.Close()
	j, err := pebblejournal.Open(t.TempDir(), 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	s := hooks.NewStream(hooks.StreamConfig{URL: srv.URL, Secret: secret, Journal: j, Batch: 50,
		Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Poll: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	for i := range 1024 {
		if err := s.Emit(ctx, []hooks.Event{{Type: hooks.EventMessage, GID: 1, Seq: int64(i + 1), UID: "u", TS: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	short, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = s.Emit(short, []hooks.Event{{Type: hooks.EventMessage, GID: 1, Seq: 1025, UID: "u", TS: 1}})
	scancel()
	if !errors.Is(err, hooks.ErrFull) {
		t.Fatalf("emit into a full journal: got %v, want ErrFull after the context", err)
	}
	emitted := make(chan error, 1)
	go func() {
		emitted <- s.Emit(ctx, []hooks.Event{{Type: hooks.EventMessage, GID: 1, Seq: 1025, UID: "u", TS: 1}})
	}()
	mu.Lock()
	down = false
	mu.Unlock()
	if err := <-emitted; err != nil {
		t.Fatalf("held emit: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 1025 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	sctx, scancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel2()
	if err := s.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1025 {
		t.Fatalf("delivered %d events, want 1025", len(got))
	}
	for i, seq := range got {
		if seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, seq)
		}
	}
}
