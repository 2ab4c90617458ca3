package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "fanfare.json")
	if err := os.WriteFile(file, []byte(`{"http-addr":"127.0.0.1:9000","shards":3,"heartbeat":"20s","log-level":"warn","outbound-bytes":2097152,"tier2-off":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"FANFARE_CONFIG":    file,
		"FANFARE_SHARDS":    "6",
		"FANFARE_WS_ADDR":   "127.0.0.1:9001",
		"FANFARE_LOG_LEVEL": "debug",
	}
	getenv := func(k string) string { return env[k] }
	c, err := loadConfig([]string{"-log-level", "error"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"default (nothing set)", c.DataDir, "./data"},
		{"file only", c.HTTPAddr, "127.0.0.1:9000"},
		{"file only duration", c.Heartbeat, 20 * time.Second},
		{"file only large integer", c.OutboundBytes, 2097152},
		{"file only bool", c.Tier2Off, true},
		{"env beats file", c.Shards, 6},
		{"env only", c.WSAddr, "127.0.0.1:9001"},
		{"flag beats env and file", c.LogLevel, "error"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestConfigValidateReportsEverything(t *testing.T) {
	getenv := func(string) string { return "" }
	_, err := loadConfig([]string{"-shards", "0", "-heartbeat", "1m", "-idle-timeout", "30s", "-log-level", "loud", "-jwt-secret", "short"}, getenv, io.Discard)
	if err == nil {
		t.Fatal("got nil error, want validation errors")
	}
	for _, want := range []string{"shards", "idle-timeout", "log-level", "jwt-secret"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestConfigFileErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(file, []byte(`{"no-such-setting":1,"shards":"many"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := loadConfig([]string{"-config", file}, func(string) string { return "" }, io.Discard)
	if err == nil {
		t.Fatal("got nil error, want file errors")
	}
	for _, want := range []string{"no-such-setting", "shards"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestEnvName(t *testing.T) {
	if got, want := envName("max-conns-per-ip"), "FANFARE_MAX_CONNS_PER_IP"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
