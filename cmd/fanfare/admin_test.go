package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestAdminCommandsSendProtocolBodies(t *testing.T) {
	type call struct {
		Method, Path, Auth string
		Body               map[string]any
	}
	var got []call
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := call{Method: r.Method, Path: r.URL.Path, Auth: r.Header.Get("Authorization")}
		b, _ := io.ReadAll(r.Body)
		if len(b) > 0 {
			if err := json.Unmarshal(b, &c.Body); err != nil {
				t.Errorf("body %q: %v", b, err)
			}
		}
		got = append(got, c)
		w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	env := map[string]string{"FANFARE_HTTP": srv.URL, "FANFARE_ADMIN_TOKEN": "adm"}
	getenv := func(k string) string { return env[k] }
	cases := []struct {
		args []string
		want call
	}{
		{[]string{"degrade"}, call{"GET", "/admin/v1/degrade", "Bearer adm", nil}},
		{[]string{"degrade", "-level", "3", "-ttl", "10m"}, call{"PUT", "/admin/v1/degrade", "Bearer adm",
			map[string]any{"scope": "node", "level": 3.0, "ttl_s": 600.0}}},
		{[]string{"degrade", "-gid", "7", "-level", "clear"}, call{"PUT", "/admin/v1/degrade", "Bearer adm",
			map[string]any{"scope": "group", "gid": 7.0, "level": nil}}},
		{[]string{"degrade", "-rooms", "-level", "2", "-ttl", "15m"}, call{"PUT", "/admin/v1/degrade", "Bearer adm",
			map[string]any{"scope": "rooms", "level": 2.0, "ttl_s": 900.0}}},
		{[]string{"rooms", "-room", "sale", "-vip-admit-share", "-1"}, call{"POST", "/admin/v1/rooms", "Bearer adm",
			map[string]any{"room": "sale", "vip_admit_share": -1.0}}},
		{[]string{"rooms", "-room", "sale", "-max-active", "100", "-admit-rate", "5", "-vip-bias", "1=60,3=600", "-state", "open"},
			call{"POST", "/admin/v1/rooms", "Bearer adm", map[string]any{"room": "sale", "max_active": 100.0, "admit_rate": 5.0,
				"vip_bias_s": map[string]any{"1": 60.0, "3": 600.0}, "state": "open"}}},
		{[]string{"rooms", "-room", "sale", "-show"}, call{"GET", "/admin/v1/rooms/sale", "Bearer adm", nil}},
	}
	for _, tc := range cases {
		got = nil
		var out bytes.Buffer
		if err := run(context.Background(), tc.args, getenv, &out, io.Discard); err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if len(got) != 1 || !reflect.DeepEqual(got[0], tc.want) {
			t.Errorf("%v: got %+v, want %+v", tc.args, got, tc.want)
		}
	}
	for _, bad := range [][]string{{"degrade", "-level", "9"}, {"rooms"}, {"rooms", "-room", "x", "-vip-bias", "7=1"}, {"nope"}} {
		if err := run(context.Background(), bad, getenv, io.Discard, io.Discard); err == nil {
			t.Errorf("%v: got nil error", bad)
		}
	}
}

// TestHelpNeverPrintsSecrets runs every command's help (and the usage
// that a missing flag prints) with secrets in the environment: flag would
// print them as defaults.
func TestHelpNeverPrintsSecrets(t *testing.T) {
	const (
		jwt   = "jwt-secret-0123456789abcdef0123456789abcdef"
		admin = "admin-token-0123456789abcdef"
		pgPW  = "pg-password-0123456789"
	)
	env := map[string]string{"FANFARE_JWT_SECRET": jwt, "FANFARE_ADMIN_TOKEN": admin,
		"FANFARE_POSTGRES_URL": "postgres://fanfare:" + pgPW + "@127.0.0.1:1/db", "FANFARE_HTTP": "http://127.0.0.1:1"}
	getenv := func(k string) string { return env[k] }
	for _, tc := range []struct {
		args []string
		// names is a variable the output must name instead of its value.
		names string
	}{
		{[]string{"token", "-h"}, "$FANFARE_JWT_SECRET"}, {[]string{"token"}, ""},
		{[]string{"degrade", "-h"}, "$FANFARE_ADMIN_TOKEN"}, {[]string{"rooms", "-h"}, "$FANFARE_ADMIN_TOKEN"},
		{[]string{"rooms"}, "-room is required"}, {[]string{"bench", "broadcast", "-h"}, "$FANFARE_JWT_SECRET"},
		{[]string{"bench", "room", "-h"}, ""}, {[]string{"bench", "-h"}, ""},
		{[]string{"migrate", "-h"}, "$FANFARE_POSTGRES_URL"}, {[]string{"help"}, ""},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), tc.args, getenv, &out, &errOut)
		all := out.String() + errOut.String()
		if err != nil {
			all += err.Error()
		}
		for _, s := range []string{jwt, admin, pgPW} {
			if strings.Contains(all, s) {
				t.Errorf("%v printed a secret (%.10s...):\n%s", tc.args, s, all)
			}
		}
		if !strings.Contains(all, tc.names) {
			t.Errorf("%v: output does not name %s:\n%s", tc.args, tc.names, all)
		}
	}
}

// TestDegradeUnknownGroup: against a real fanfared, degrade forces a
// level on a group that exists and refuses (exit status 1, not_found) one
// that does not, which then appears nowhere in the levels.
func TestDegradeUnknownGroup(t *testing.T) {
	srv := startFanfared(t)
	adm := &adminClient{base: srv.http, token: srv.admin}
	g, err := adm.createGroup(context.Background(), "degrade-test", "alice")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"FANFARE_HTTP": srv.http, "FANFARE_ADMIN_TOKEN": srv.admin}
	gid := strconv.FormatInt(g.GID, 10)
	if code, out, errOut := cli(t, env, "degrade", "-gid", gid, "-level", "2", "-ttl", "1m"); code != 0 || !strings.Contains(out, `"gid": `+gid) {
		t.Fatalf("degrade -gid %s (exists): got exit %d, %s%s; want 0 and the group in the levels", gid, code, out, errOut)
	}
	const unknown = "987654321"
	code, out, errOut := cli(t, env, "degrade", "-gid", unknown, "-level", "2", "-ttl", "1m")
	if code != 1 || out != "" || !strings.Contains(errOut, "404") || !strings.Contains(errOut, "not_found: group not found") {
		t.Fatalf("degrade -gid %s (unknown): got exit %d, stdout %q, stderr %q; want 1 and not_found", unknown, code, out, errOut)
	}
	if code, out, _ := cli(t, env, "degrade"); code != 0 || strings.Contains(out, unknown) {
		t.Errorf("levels after the refusal: exit %d, %s; want no gid %s", code, out, unknown)
	}
}
