package waitroom_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/waitroom"
)

func TestWebhookRetriesAndTimeout(t *testing.T) {
	var calls atomic.Int32
	var mu sync.Mutex
	var got []waitroom.WebhookEvent
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		switch n {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable) // retried
			return
		case 2:
			time.Sleep(300 * time.Millisecond) // beyond the timeout: retried
		}
		var ev waitroom.WebhookEvent
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil || r.Header.Get("X-Test") != "yes" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, ev)
		mu.Unlock()
	}))
	defer srv.Close()
	w := waitroom.NewWebhook(waitroom.WebhookConfig{URL: srv.URL, Timeout: 100 * time.Millisecond, Retries: 3,
		Backoff: 10 * time.Millisecond, Header: http.Header{"X-Test": {"yes"}}}, "node-a", nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		w.Run(ctx)
		close(done)
	}()
	now := time.Unix(1_750_000_000, 0)
	w.SessionEnded(waitroom.SessionEnd{Room: "r", UID: "u1", Tier: 2, Reason: waitroom.EndExpired,
		First: now.Add(-time.Minute), Admitted: now.Add(-10 * time.Second), Ended: now})
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || calls.Load() < 3 {
		t.Fatalf("deliveries: got %d after %d calls, want 1 after >= 3 (503, timeout, ok)", len(got), calls.Load())
	}
	want := waitroom.WebhookEvent{Event: "session_end", Room: "r", UID: "u1", Tier: 2, Reason: "expired",
		FirstJoin: now.Unix() - 60, AdmittedAt: now.Unix() - 10, EndedAt: now.Unix(), Node: "node-a"}
	if got[0] != want {
		t.Fatalf("event: got %+v, want %+v", got[0], want)
	}
}

func TestWebhookGivesUpAndQueueIsBounded(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer srv.Close()
	w := waitroom.NewWebhook(waitroom.WebhookConfig{URL: srv.URL, Retries: 2, Backoff: time.Millisecond, Queue: 1}, "", nil)
	// Not running yet: the second event does not fit and is dropped, never blocking.
	w.SessionEnded(waitroom.SessionEnd{UID: "a"})
	w.SessionEnded(waitroom.SessionEnd{UID: "b"})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		w.Run(ctx)
		close(done)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for calls.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	cancel()
	<-done
	if n := calls.Load(); n != 3 {
		t.Fatalf("calls: got %d, want 3 (one event, 1 try + 2 retries; the other dropped)", n)
	}
}
