package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestConfigPprofAddr(t *testing.T) {
	getenv := func(string) string { return "" }
	if _, err := loadConfig([]string{"-pprof-addr", "no-port"}, getenv, io.Discard); err == nil || !strings.Contains(err.Error(), "pprof-addr") {
		t.Fatalf("-pprof-addr no-port: got %v, want an error naming pprof-addr", err)
	}
	cfg, err := loadConfig([]string{"-pprof-addr", "127.0.0.1:0"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PprofAddr != "127.0.0.1:0" {
		t.Fatalf("PprofAddr %q", cfg.PprofAddr)
	}
	if cfg, err = loadConfig(nil, getenv, io.Discard); err != nil || cfg.PprofAddr != "" {
		t.Fatalf("default: PprofAddr %q, err %v: want off", cfg.PprofAddr, err)
	}
}

func TestConfigWSLoops(t *testing.T) {
	getenv := func(string) string { return "" }
	for _, bad := range []string{"-1", "1025"} {
		if _, err := loadConfig([]string{"-ws-loops", bad}, getenv, io.Discard); err == nil || !strings.Contains(err.Error(), "ws-loops") {
			t.Errorf("-ws-loops %s: got %v, want an error naming ws-loops", bad, err)
		}
	}
	for _, good := range []string{"0", "1", "1024"} {
		if _, err := loadConfig([]string{"-ws-loops", good}, getenv, io.Discard); err != nil {
			t.Errorf("-ws-loops %s: %v", good, err)
		}
	}
}

// TestServePprof: the endpoints answer on their own listener and stop
// with the context.
func TestServePprof(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- servePprof(ctx, addr, slog.New(slog.DiscardHandler)) }()
	var resp *http.Response
	for deadline := time.Now().Add(5 * time.Second); ; {
		resp, err = http.Get("http://" + addr + "/debug/pprof/heap?debug=1")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "heap profile") {
		t.Fatalf("GET /debug/pprof/heap: %s %.80q", resp.Status, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("servePprof: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("servePprof did not return after cancel")
	}
	if err := servePprof(context.Background(), "256.0.0.1:1", slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("servePprof on a bad address: got nil, want the listen error")
	}
}
