package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"
)

func TestHelloArrived(t *testing.T) {
	const hdr = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
	long := append([]byte{0x81, 126, 0x01, 0x00}, bytes.Repeat([]byte("x"), 256)...)
	for _, tc := range []struct {
		in      string
		done    bool
		wantErr bool
	}{
		{"HTTP/1.1 101 Swi", false, false},
		{hdr, false, false},
		{hdr + "\x81", false, false},
		{hdr + "\x81\x05hell", false, false},
		{hdr + "\x81\x05hello", true, false},
		{hdr + "\x81\x05hello\x81\x01x", true, false},
		{hdr + string(long[:200]), false, false},
		{hdr + string(long), true, false},
		{"HTTP/1.1 401 Unauthorized\r\n\r\n", false, true},
		{hdr + "\x81\x7f", false, true},
	} {
		done, err := helloArrived([]byte(tc.in))
		if done != tc.done || (err != nil) != tc.wantErr {
			t.Errorf("helloArrived(%q): got %v, %v; want %v, error %v", tc.in, done, err, tc.done, tc.wantErr)
		}
	}
}

func TestBenchUpgradesEndToEnd(t *testing.T) {
	srv := startFanfared(t)
	adm := &adminClient{base: srv.http, token: srv.admin}
	var before json.RawMessage
	if err := adm.do(context.Background(), "GET", "/admin/v1/limits", nil, &before); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	e := &env{getenv: func(string) string { return "" }, stdout: &out, stderr: &errOut}
	args := []string{"upgrades", "-http", srv.http, "-ws", srv.ws, "-admin-token", srv.admin, "-jwt-secret", srv.secret,
		"-procs", "2", "-dialers", "2", "-users", "40", "-duration", "1s", "-warmup", "200ms",
		"-server-pid", strconv.Itoa(srv.cmd.Process.Pid), "-json"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cmdBench(ctx, e, args); err != nil {
		t.Fatalf("bench: %v\n%s", err, errOut.String())
	}
	var r upgradesReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("result %q: %v", out.String(), err)
	}
	// More than the connect rule's 1,000 per second would let through:
	// -limits off lifted it.
	if r.Upgrades < 100 || r.Failed != 0 || r.Procs != 2 || len(r.Sources) != 2 {
		t.Fatalf("got %d upgrades, %d failed (%s), %d procs, sources %v", r.Upgrades, r.Failed, r.FirstErr, r.Procs, r.Sources)
	}
	if r.Server == nil || r.Server.UsPerUpgrade <= 0 || r.Server.KernelShare < 0 || r.Server.KernelShare > 1 || r.P50 <= 0 {
		t.Fatalf("got server %+v, p50 %v", r.Server, r.P50)
	}
	var after json.RawMessage
	if err := adm.do(context.Background(), "GET", "/admin/v1/limits", nil, &after); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(after, before) {
		t.Errorf("limits not restored:\ngot  %s\nwant %s", after, before)
	}
}
