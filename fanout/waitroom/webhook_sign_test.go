package waitroom_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/fanout/hooks"
	"github.com/fanfare-im/fanfare/fanout/waitroom"
)

// TestWebhookSigned: with a Secret the session-end POST is signed like
// the application hooks' (hooks.Verify accepts it, Fanfare-Hook names it).
func TestWebhookSigned(t *testing.T) {
	secret := []byte("room-webhook-secret-0123")
	var ok, bad atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if hooks.Verify(secret, r.Header, b, time.Now(), time.Minute) != nil || r.Header.Get(hooks.HeaderKind) != "session_end" {
			bad.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		ok.Add(1)
	}))
	defer srv.Close()
	w := waitroom.NewWebhook(waitroom.WebhookConfig{URL: srv.URL, Secret: secret, Retries: -1}, "n", nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	now := time.Now()
	w.SessionEnded(waitroom.SessionEnd{Room: "r", UID: "u", Reason: waitroom.EndExpired, First: now, Admitted: now, Ended: now})
	deadline := time.Now().Add(10 * time.Second)
	for ok.Load()+bad.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if ok.Load() != 1 || bad.Load() != 0 {
		t.Fatalf("signed deliveries %d, refused %d", ok.Load(), bad.Load())
	}
}
