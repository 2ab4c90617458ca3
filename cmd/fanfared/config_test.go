package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"github.com/fanfare-im/fanfare/gateway/socket"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/gateway"
	"github.com/fanfare-im/fanfare/limiter/redislimit"
	"github.com/fanfare-im/fanfare/store/postgres"
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

// TestConfigPresenceView: the presence view's flags at their bounds (the
// TTL must exceed two flush intervals), and the environment names.
func TestConfigPresenceView(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string // "" = valid
	}{
		{"defaults", nil, nil, ""},
		{"interval zero", []string{"-presence-flush-interval", "0s"}, nil, "presence-flush-interval must be positive"},
		{"interval negative", []string{"-presence-flush-interval", "-1s"}, nil, "presence-flush-interval must be positive"},
		{"ttl exactly 2 x interval", []string{"-presence-flush-interval", "5s", "-presence-ttl", "10s"}, nil, "must exceed 2 x presence-flush-interval"},
		{"ttl just above 2 x interval", []string{"-presence-flush-interval", "5s", "-presence-ttl", "10001ms"}, nil, ""},
		{"default ttl below a long interval", []string{"-presence-flush-interval", "8s"}, nil, "must exceed 2 x presence-flush-interval"},
		{"ttl below 10ms", []string{"-presence-flush-interval", "1ms", "-presence-ttl", "9ms"}, nil, "at least 10ms"},
		{"ttl 10ms", []string{"-presence-flush-interval", "1ms", "-presence-ttl", "10ms"}, nil, ""},
		{"ttl not whole ms", []string{"-presence-flush-interval", "1ms", "-presence-ttl", "10500us"}, nil, "whole number of milliseconds"},
		{"from the environment", nil, map[string]string{"FANFARE_PRESENCE_FLUSH_INTERVAL": "100ms", "FANFARE_PRESENCE_TTL": "1s"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
			if tc.env != nil && (c.PresenceFlushInterval != 100*time.Millisecond || c.PresenceTTL != time.Second) {
				t.Fatalf("from env: got interval %v ttl %v, want 100ms 1s", c.PresenceFlushInterval, c.PresenceTTL)
			}
		})
	}
}

// TestConfigRedisNeedsPostgres: Redis is cluster mode's; an embedded node
// (its own store) given -redis-addr is refused at start, from a flag or
// the environment, rather than joining a bus of nodes with other stores.
func TestConfigRedisNeedsPostgres(t *testing.T) {
	cases := []struct {
		args    []string
		env     map[string]string
		wantErr bool
	}{
		{[]string{"-data-dir", "d"}, nil, false},
		{[]string{"-data-dir", "d", "-redis-addr", "127.0.0.1:6379"}, nil, true},
		{[]string{"-data-dir", "d"}, map[string]string{"FANFARE_REDIS_ADDR": "127.0.0.1:6379"}, true},
		{[]string{"-postgres-url", "postgres://x@127.0.0.1/db", "-redis-addr", "127.0.0.1:6379"}, nil, false},
		{[]string{"-postgres-url", "postgres://x@127.0.0.1/db"}, nil, false},
	}
	for _, tc := range cases {
		_, err := loadConfig(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		if got := err != nil && strings.Contains(err.Error(), "redis-addr needs postgres-url"); got != tc.wantErr {
			t.Errorf("%v %v: got %v, want the error: %v", tc.args, tc.env, err, tc.wantErr)
		}
		if err != nil && !tc.wantErr {
			t.Errorf("%v %v: %v", tc.args, tc.env, err)
		}
	}
}

// TestConfigRoomEnterBatch: -room-enter-batch and -room-enter-inflight at
// and past their bounds.
func TestConfigRoomEnterBatch(t *testing.T) {
	cases := []struct {
		args    []string
		wantErr string // "" = valid
	}{
		{nil, ""},
		{[]string{"-room-enter-batch", "1"}, ""},
		{[]string{"-room-enter-batch", "1024", "-room-enter-inflight", "64"}, ""},
		{[]string{"-room-enter-batch", "0"}, "room-enter-batch must be in 1..1024"},
		{[]string{"-room-enter-batch", "1025"}, "room-enter-batch must be in 1..1024"},
		{[]string{"-room-enter-inflight", "0"}, "room-enter-inflight must be in 1..64"},
		{[]string{"-room-enter-inflight", "65"}, "room-enter-inflight must be in 1..64"},
	}
	for _, tc := range cases {
		_, err := loadConfig(tc.args, func(string) string { return "" }, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Fatalf("%v: got %v, want valid", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Fatalf("%v: got %v, want an error containing %q", tc.args, err, tc.wantErr)
		}
	}
	c, err := loadConfig(nil, func(k string) string {
		return map[string]string{"FANFARE_ROOM_ENTER_BATCH": "8", "FANFARE_ROOM_ENTER_INFLIGHT": "2"}[k]
	}, io.Discard)
	if err != nil || c.RoomEnterBatch != 8 || c.RoomEnterInFlight != 2 {
		t.Fatalf("from env: %v %d %d, want 8 2", err, c.RoomEnterBatch, c.RoomEnterInFlight)
	}
}

// TestConfigRoomTokenKey: -room-token-key must name a readable Ed25519
// PKCS#8 PEM file and excludes -room-token-secret; FANFARE_ROOM_TOKEN_KEY
// sets it too.
func TestConfigRoomTokenKey(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(priv)
	good := writeFile(t, "room.pem", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})))
	bad := writeFile(t, "bad.pem", "not a key")
	none := func(string) string { return "" }
	if _, err := loadConfig([]string{"-room-token-key", good}, none, io.Discard); err != nil {
		t.Fatalf("good key: %v", err)
	}
	if c, err := loadConfig(nil, func(k string) string {
		return map[string]string{"FANFARE_ROOM_TOKEN_KEY": good}[k]
	}, io.Discard); err != nil || c.RoomKeyFile != good {
		t.Fatalf("from the environment: %v %q", err, c.RoomKeyFile)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-room-token-key", bad}, "no PEM block"},
		{[]string{"-room-token-key", good + ".missing"}, "no such file"},
		{[]string{"-room-token-key", good, "-room-token-secret", testRoomSecret}, "exclude each other"},
	} {
		if _, err := loadConfig(tc.args, none, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// TestConfigRetention: -retention and -retention-interval at their bounds,
// and from the environment.
func TestConfigRetention(t *testing.T) {
	cases := []struct {
		args    []string
		env     map[string]string
		want    time.Duration
		wantErr string // "" = valid
	}{
		{nil, nil, 0, ""},
		{[]string{"-retention", "2160h"}, nil, 2160 * time.Hour, ""},
		{[]string{"-retention", "-1s"}, nil, 0, "retention must not be negative"},
		{[]string{"-retention", "1h", "-retention-interval", "0s"}, nil, 0, "retention-interval must be at least 100ms"},
		{nil, map[string]string{"FANFARE_RETENTION": "720h"}, 720 * time.Hour, ""},
	}
	for _, tc := range cases {
		c, err := loadConfig(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Fatalf("%v %v: got %v, want valid", tc.args, tc.env, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Fatalf("%v: got %v, want an error containing %q", tc.args, err, tc.wantErr)
		case tc.wantErr == "" && c.Retention != tc.want:
			t.Fatalf("%v %v: retention %v, want %v", tc.args, tc.env, c.Retention, tc.want)
		}
	}
}

// TestConfigPageBytes: -page-bytes must hold one message of the largest
// body with its frame (a page always holds one message) and must not
// exceed -outbound-bytes, which itself must hold such a page; both edges
// are accepted; FANFARE_PAGE_BYTES sets it too.
func TestConfigPageBytes(t *testing.T) {
	minPage := strconv.Itoa(gateway.MinPageBytes)
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    int
		wantErr string // "" = valid
	}{
		{"default", nil, nil, gateway.DefaultPageBytes, ""},
		{"smallest", []string{"-page-bytes", minPage}, nil, gateway.MinPageBytes, ""},
		{"below the smallest", []string{"-page-bytes", strconv.Itoa(gateway.MinPageBytes - 1)}, nil, 0, "page-bytes must be at least"},
		{"equal to outbound-bytes", []string{"-page-bytes", "1048576"}, nil, 1 << 20, ""},
		{"above outbound-bytes", []string{"-page-bytes", "1048577"}, nil, 0, "must not exceed outbound-bytes"},
		{"default under a small outbound-bytes", []string{"-outbound-bytes", "131072"}, nil, 65536, ""},
		{"default at the smallest outbound-bytes", []string{"-outbound-bytes", minPage}, nil, gateway.MinPageBytes, ""},
		{"explicit above a small outbound-bytes", []string{"-outbound-bytes", "65536", "-page-bytes", "65537"}, nil, 0, "must not exceed outbound-bytes"},
		{"small outbound-bytes and page", []string{"-outbound-bytes", minPage, "-page-bytes", minPage}, nil, gateway.MinPageBytes, ""},
		{"outbound-bytes below one page", []string{"-outbound-bytes", "16384", "-page-bytes", minPage}, nil, 0, "outbound-bytes must be at least"},
		{"from the environment", nil, map[string]string{"FANFARE_PAGE_BYTES": "65536"}, 65536, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			case tc.wantErr == "" && c.PageBytes != tc.want:
				t.Fatalf("got page-bytes %d, want %d", c.PageBytes, tc.want)
			}
		})
	}
}

// TestRedisLogsAreJSON: go-redis's own log lines (here: a dial failure,
// as during a Redis outage) arrive in the JSON log, not as plain text on
// stderr.
func TestRedisLogsAreJSON(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	var buf syncBuffer
	c := newRedisClient(addr, newLogger(&buf, "warn"))
	defer c.Close()
	if err := c.Ping(t.Context()).Err(); err == nil {
		t.Fatal("ping of a closed port succeeded")
	}
	out := buf.String()
	if !strings.Contains(out, "failed to dial") {
		t.Fatalf("go-redis's dial failure is not in the log:\n%s", out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("log line is not JSON: %q", line)
			continue
		}
		if rec["level"] != "WARN" || rec["component"] != "go-redis" {
			t.Errorf("got level %v component %v, want WARN go-redis: %s", rec["level"], rec["component"], line)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestConfigSyncPage: -sync-page takes 1..gateway.MaxSyncPage groups (a
// page of the largest stays under 1 MiB), both edges accepted;
// FANFARE_SYNC_PAGE sets it too.
func TestConfigSyncPage(t *testing.T) {
	maxPage := strconv.Itoa(gateway.MaxSyncPage)
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    int
		wantErr string // "" = valid
	}{
		{"default", nil, nil, gateway.DefaultSyncPage, ""},
		{"smallest", []string{"-sync-page", "1"}, nil, 1, ""},
		{"zero", []string{"-sync-page", "0"}, nil, 0, "sync-page must be in 1.." + maxPage},
		{"negative", []string{"-sync-page", "-1"}, nil, 0, "sync-page must be in"},
		{"largest", []string{"-sync-page", maxPage}, nil, gateway.MaxSyncPage, ""},
		{"above the largest", []string{"-sync-page", strconv.Itoa(gateway.MaxSyncPage + 1)}, nil, 0, "sync-page must be in"},
		{"from the environment", nil, map[string]string{"FANFARE_SYNC_PAGE": "50"}, 50, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			case tc.wantErr == "" && c.SyncPage != tc.want:
				t.Fatalf("got sync-page %d, want %d", c.SyncPage, tc.want)
			}
		})
	}
}

// TestConfigLimitsBatch: -limits-batch takes 0 (one call per decision)
// ..4096 and -limits-batch-inflight 1..64, both edges accepted.
func TestConfigLimitsBatch(t *testing.T) {
	cases := []struct {
		args        []string
		env         map[string]string
		batch, infl int
		wantErr     string
	}{
		{nil, nil, 256, 2, ""},
		{[]string{"-limits-batch", "0"}, nil, 0, 2, ""},
		{[]string{"-limits-batch", "4096", "-limits-batch-inflight", "64"}, nil, 4096, 64, ""},
		{[]string{"-limits-batch", "-1"}, nil, 0, 0, "limits-batch must be in 0..4096"},
		{[]string{"-limits-batch", "4097"}, nil, 0, 0, "limits-batch must be in 0..4096"},
		{[]string{"-limits-batch-inflight", "0"}, nil, 0, 0, "limits-batch-inflight must be in 1..64"},
		{[]string{"-limits-batch-inflight", "65"}, nil, 0, 0, "limits-batch-inflight must be in 1..64"},
		{nil, map[string]string{"FANFARE_LIMITS_BATCH": "1", "FANFARE_LIMITS_BATCH_INFLIGHT": "1"}, 1, 1, ""},
	}
	for _, tc := range cases {
		c, err := loadConfig(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%v %v: got %v, want valid", tc.args, tc.env, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: got %v, want an error containing %q", tc.args, err, tc.wantErr)
		case tc.wantErr == "" && (c.LimitsBatch != tc.batch || c.LimitsBatchInflight != tc.infl):
			t.Errorf("%v %v: got %d/%d, want %d/%d", tc.args, tc.env, c.LimitsBatch, c.LimitsBatchInflight, tc.batch, tc.infl)
		}
	}
}

// TestConfigLimitsLease: -limits-lease-ttl takes 0 (no leases) or
// 1ms..10s, -limits-lease-max 1..10000, -limits-lease-min-hits 1..1000000,
// both edges accepted, and they reach redislimit with their defaults.
func TestConfigLimitsLease(t *testing.T) {
	cases := []struct {
		args      []string
		env       map[string]string
		ttl       time.Duration
		max, hits int64
		wantErr   string
	}{
		{nil, nil, 0, redislimit.DefaultLeaseMax, redislimit.DefaultLeaseMinHits, ""},
		{[]string{"-limits-lease-ttl", "0"}, nil, 0, 1024, 16, ""},
		{[]string{"-limits-lease-ttl", "1ms", "-limits-lease-max", "1", "-limits-lease-min-hits", "1"}, nil, time.Millisecond, 1, 1, ""},
		{[]string{"-limits-lease-ttl", "10s", "-limits-lease-max", "10000", "-limits-lease-min-hits", "1000000"}, nil, 10 * time.Second, 10000, 1000000, ""},
		{[]string{"-limits-lease-ttl", "999us"}, nil, 0, 0, 0, "limits-lease-ttl must be 0 or in 1ms..10s"},
		{[]string{"-limits-lease-ttl", "10001ms"}, nil, 0, 0, 0, "limits-lease-ttl must be 0 or in 1ms..10s"},
		{[]string{"-limits-lease-ttl", "-1ms"}, nil, 0, 0, 0, "limits-lease-ttl must be 0 or in 1ms..10s"},
		{[]string{"-limits-lease-max", "0"}, nil, 0, 0, 0, "limits-lease-max must be in 1..10000"},
		{[]string{"-limits-lease-max", "10001"}, nil, 0, 0, 0, "limits-lease-max must be in 1..10000"},
		{[]string{"-limits-lease-min-hits", "0"}, nil, 0, 0, 0, "limits-lease-min-hits must be in 1..1000000"},
		{[]string{"-limits-lease-min-hits", "1000001"}, nil, 0, 0, 0, "limits-lease-min-hits must be in 1..1000000"},
		{nil, map[string]string{"FANFARE_LIMITS_LEASE_TTL": "250ms", "FANFARE_LIMITS_LEASE_MAX": "64", "FANFARE_LIMITS_LEASE_MIN_HITS": "4"}, 250 * time.Millisecond, 64, 4, ""},
	}
	for _, tc := range cases {
		c, err := loadConfig(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%v %v: got %v, want valid", tc.args, tc.env, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: got %v, want an error containing %q", tc.args, err, tc.wantErr)
		case tc.wantErr == "" && (c.LimitsLeaseTTL != tc.ttl || c.LimitsLeaseMax != tc.max || c.LimitsLeaseMinHits != tc.hits):
			t.Errorf("%v %v: got %v/%d/%d, want %v/%d/%d", tc.args, tc.env, c.LimitsLeaseTTL, c.LimitsLeaseMax, c.LimitsLeaseMinHits, tc.ttl, tc.max, tc.hits)
		}
	}
}

// The gateway's pools are flags with the gateway's defaults, at least 1
// each, and reach the gateway's configuration.
func TestConfigPools(t *testing.T) {
	c, err := loadConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.FrameWorkers != gateway.DefaultWorkers || c.FrameQueue != gateway.DefaultWorkQueue || c.ConnectWorkers != gateway.DefaultConnectWorkers ||
		c.ConnectQueue != gateway.DefaultConnectQueue || c.RequestTimeout != gateway.DefaultRequestTimeout {
		t.Fatalf("defaults: %d %d %d %d %s", c.FrameWorkers, c.FrameQueue, c.ConnectWorkers, c.ConnectQueue, c.RequestTimeout)
	}
	c, err = loadConfig([]string{"-frame-workers", "1", "-frame-queue", "1", "-connect-workers", "1", "-connect-queue", "1", "-request-timeout", "1ms"},
		func(string) string { return "" }, io.Discard)
	if err != nil || c.FrameWorkers != 1 || c.FrameQueue != 1 || c.ConnectWorkers != 1 || c.ConnectQueue != 1 || c.RequestTimeout != time.Millisecond {
		t.Fatalf("smallest: %+v, %v", c, err)
	}
	for _, flag := range []string{"frame-workers", "frame-queue", "connect-workers", "connect-queue"} {
		if _, err := loadConfig([]string{"-" + flag, "0"}, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), flag+" must be at least 1") {
			t.Errorf("-%s 0: got %v, want refused", flag, err)
		}
	}
	if _, err := loadConfig([]string{"-request-timeout", "0s"}, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "request-timeout must be positive") {
		t.Errorf("-request-timeout 0s: got %v, want refused", err)
	}
}

// -http-request-timeout bounds HTTP API handlers: positive, at most the
// HTTP write timeout (past it no answer could be written), 10 s by default.
func TestConfigHTTPRequestTimeout(t *testing.T) {
	env := func(string) string { return "" }
	c, err := loadConfig(nil, env, io.Discard)
	if err != nil || c.HTTPRequestTimeout != gateway.DefaultHandlerTimeout {
		t.Fatalf("default: %v, %v", c.HTTPRequestTimeout, err)
	}
	for _, v := range []string{"1ms", "30s"} {
		if c, err := loadConfig([]string{"-http-request-timeout", v}, env, io.Discard); err != nil || c.HTTPRequestTimeout.String() != v {
			t.Errorf("-http-request-timeout %s: got %v, %v", v, c.HTTPRequestTimeout, err)
		}
	}
	for _, v := range []string{"0s", "-1s", "30.001s"} {
		if _, err := loadConfig([]string{"-http-request-timeout", v}, env, io.Discard); err == nil || !strings.Contains(err.Error(), "http-request-timeout must be in") {
			t.Errorf("-http-request-timeout %s: got %v, want refused", v, err)
		}
	}
}

// TestConfigPostgresAppendStatements: -postgres-append-statements takes
// 0 (no merging) ..64, both edges accepted, 2 by default;
// FANFARE_POSTGRES_APPEND_STATEMENTS sets it too.
func TestConfigPostgresAppendStatements(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    int
		wantErr string // "" = valid
	}{
		{"default", nil, nil, postgres.DefaultAppendStatements, ""},
		{"no merging", []string{"-postgres-append-statements", "0"}, nil, 0, ""},
		{"negative", []string{"-postgres-append-statements", "-1"}, nil, 0, "postgres-append-statements must be in 0..64"},
		{"largest", []string{"-postgres-append-statements", "64"}, nil, 64, ""},
		{"above the largest", []string{"-postgres-append-statements", "65"}, nil, 0, "postgres-append-statements must be in 0..64"},
		{"from the environment", nil, map[string]string{"FANFARE_POSTGRES_APPEND_STATEMENTS": "1"}, 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			case tc.wantErr == "" && c.PostgresAppendStatements != tc.want:
				t.Fatalf("got postgres-append-statements %d, want %d", c.PostgresAppendStatements, tc.want)
			}
		})
	}
}

// TestConfigUpgradeHold: -ws-upgrade-hold takes 0..10s, both edges
// included; FANFARE_WS_UPGRADE_HOLD sets it too.
func TestConfigUpgradeHold(t *testing.T) {
	cases := []struct {
		args    []string
		env     map[string]string
		want    time.Duration
		wantErr string // "" = valid
	}{
		{nil, nil, 100 * time.Millisecond, ""},
		{[]string{"-ws-upgrade-hold", "0s"}, nil, 0, ""},
		{[]string{"-ws-upgrade-hold", "10s"}, nil, 10 * time.Second, ""},
		{[]string{"-ws-upgrade-hold", "10.001s"}, nil, 0, "ws-upgrade-hold must be in 0..10s"},
		{[]string{"-ws-upgrade-hold", "-1ms"}, nil, 0, "ws-upgrade-hold must be in 0..10s"},
		{nil, map[string]string{"FANFARE_WS_UPGRADE_HOLD": "20ms"}, 20 * time.Millisecond, ""},
	}
	for _, tc := range cases {
		c, err := loadConfig(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Fatalf("%v %v: got %v, want valid", tc.args, tc.env, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Fatalf("%v: got %v, want an error containing %q", tc.args, err, tc.wantErr)
		case tc.wantErr == "" && c.WSUpgradeHold != tc.want:
			t.Fatalf("%v %v: hold %v, want %v", tc.args, tc.env, c.WSUpgradeHold, tc.want)
		}
	}
}

// TestConfigPassYield: -ws-pass-yield defaults to socket.DefaultPassYield,
// takes 1ns..1s and a negative value (never), and rejects 0 and more than
// 1s naming the flag.
func TestConfigPassYield(t *testing.T) {
	for _, tc := range []struct {
		arg     string
		want    time.Duration
		wantErr bool
	}{
		{"", socket.DefaultPassYield, false},
		{"1ns", time.Nanosecond, false},
		{"1s", time.Second, false},
		{"-1ns", -time.Nanosecond, false},
		{"0s", 0, true},
		{"1.000000001s", 0, true},
	} {
		var args []string
		if tc.arg != "" {
			args = []string{"-ws-pass-yield", tc.arg}
		}
		c, err := loadConfig(args, func(string) string { return "" }, io.Discard)
		switch {
		case tc.wantErr && (err == nil || !strings.Contains(err.Error(), "ws-pass-yield must be")):
			t.Fatalf("%q: got %v, want the ws-pass-yield error", tc.arg, err)
		case !tc.wantErr && err != nil:
			t.Fatalf("%q: got %v, want valid", tc.arg, err)
		case !tc.wantErr && c.WSPassYield != tc.want:
			t.Fatalf("%q: yield %v, want %v", tc.arg, c.WSPassYield, tc.want)
		}
	}
}

// TestConfigMemberFeedBounds: -member-feed-grace, -member-feed-kick-gap
// and -member-feed-pending-max accept 0 (the default) and reject a
// negative value naming the flag; the environment sets them too.
func TestConfigMemberFeedBounds(t *testing.T) {
	cases := []struct {
		args    []string
		env     map[string]string
		wantErr string // "" = valid
	}{
		{[]string{"-member-feed-grace", "0s", "-member-feed-kick-gap", "0s", "-member-feed-pending-max", "0"}, nil, ""},
		{[]string{"-member-feed-grace", "-1ns"}, nil, "member-feed-grace must not be negative"},
		{[]string{"-member-feed-kick-gap", "-1ns"}, nil, "member-feed-kick-gap must not be negative"},
		{[]string{"-member-feed-pending-max", "-1"}, nil, "member-feed-pending-max must not be negative"},
		{nil, map[string]string{"FANFARE_MEMBER_FEED_GRACE": "5s", "FANFARE_MEMBER_FEED_KICK_GAP": "1s", "FANFARE_MEMBER_FEED_PENDING_MAX": "7"}, ""},
	}
	for _, tc := range cases {
		c, err := loadConfig(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Fatalf("%v %v: got %v, want valid", tc.args, tc.env, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Fatalf("%v: got %v, want an error containing %q", tc.args, err, tc.wantErr)
		case tc.env != nil && (c.MemberFeedGrace != 5*time.Second || c.MemberFeedKickGap != time.Second || c.MemberFeedPendingMax != 7):
			t.Fatalf("from the environment: %v %v %v", c.MemberFeedGrace, c.MemberFeedKickGap, c.MemberFeedPendingMax)
		}
	}
}

// TestConfigTouch: -touch-interval accepts 0 (the default, 1s) up to 1m
// and rejects a negative value or one past 1m; -touch-pending-max accepts
// 0 and rejects a negative value; the environment sets both.
func TestConfigTouch(t *testing.T) {
	cases := []struct {
		args    []string
		env     map[string]string
		wantErr string // "" = valid
	}{
		{[]string{"-touch-interval", "0s", "-touch-pending-max", "0"}, nil, ""},
		{[]string{"-touch-interval", "1m"}, nil, ""},
		{[]string{"-touch-interval", "1ns", "-touch-pending-max", "1"}, nil, ""},
		{[]string{"-touch-interval", "60000000001ns"}, nil, "touch-interval must be 0 to 1m0s, got 1m0.000000001s"},
		{[]string{"-touch-interval", "-1ns"}, nil, "touch-interval must be 0 to 1m0s, got -1ns"},
		{[]string{"-touch-pending-max", "-1"}, nil, "touch-pending-max must not be negative"},
		{nil, map[string]string{"FANFARE_TOUCH_INTERVAL": "5s", "FANFARE_TOUCH_PENDING_MAX": "7"}, ""},
	}
	for _, tc := range cases {
		c, err := loadConfig(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Fatalf("%v %v: got %v, want valid", tc.args, tc.env, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Fatalf("%v: got %v, want an error containing %q", tc.args, err, tc.wantErr)
		case tc.env != nil && (c.TouchInterval != 5*time.Second || c.TouchPendingMax != 7):
			t.Fatalf("from the environment: %v %v", c.TouchInterval, c.TouchPendingMax)
		}
	}
}
