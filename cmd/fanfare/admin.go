package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

func init() {
	register("degrade", "show or force degradation levels (node-wide or per group)", cmdDegrade)
	register("rooms", "create, update or show waiting rooms", cmdRooms)
}

// adminFlags are the flags of every command that talks to the admin API.
type adminFlags struct {
	http  string
	token string
}

func (a *adminFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&a.http, "http", envOr(e, "FANFARE_HTTP", "http://127.0.0.1:8080"), "fanfared HTTP API base `URL` (FANFARE_HTTP)")
	secretVar(fs, e, &a.token, "admin-token", "FANFARE_ADMIN_TOKEN", "admin `token`")
}

// check reports a missing admin token as a usage error of c.
func (a *adminFlags) check(c *cmdFlags) error {
	if a.token == "" {
		return c.usageErr("no admin token: pass -admin-token or set FANFARE_ADMIN_TOKEN")
	}
	return nil
}

func envOr(e *env, name, def string) string {
	if v := e.getenv(name); v != "" {
		return v
	}
	return def
}

// call sends one admin request and prints the JSON answer indented.
func (a *adminFlags) call(ctx context.Context, e *env, method, path string, body any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(a.http, "/")+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, b, "", "  ") == nil {
		b = pretty.Bytes()
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, apiError(b))
	}
	fmt.Fprintf(e.stdout, "%s\n", bytes.TrimSpace(b))
	return nil
}

// apiError returns the code and message of an error answer
// ({"error":{"code":...,"message":...}}), or the body as it is.
func apiError(b []byte) string {
	var r struct{ Error wire.ErrorBody }
	if json.Unmarshal(b, &r) == nil && r.Error.Code != "" {
		return r.Error.Code + ": " + r.Error.Message
	}
	return string(bytes.TrimSpace(b))
}

func cmdDegrade(ctx context.Context, e *env, args []string) error {
	fs := newFlags("degrade", "[-gid G | -rooms] [-level 0-"+strconv.Itoa(wire.MaxLevel)+"|clear] [-ttl D] [-http URL] [-admin-token T]", `
Without -level, shows the node's level, every group's that is above 0 or
forced, and the waiting rooms' (GET /admin/v1/degrade). With -level, forces
the level of the node, of group -gid or of the waiting rooms for -ttl, or
clears it (PUT /admin/v1/degrade); the server refuses a group that does not
exist (not_found, exit status 1). Levels are per node: run it against each
node. docs/operations.md section 3 describes the levels.`)
	var a adminFlags
	a.register(fs.FlagSet, e)
	gid := fs.Int64("gid", 0, "group id (default: node-wide)")
	rooms := fs.Bool("rooms", false, "the waiting rooms' level (0-2) instead of the chat's")
	level := fs.String("level", "", "force level 0-"+strconv.Itoa(wire.MaxLevel)+" (rooms: 0-2), or 'clear' to drop a forced level; empty = show levels")
	ttl := fs.Duration("ttl", 0, "expiry of a forced level (0 = until cleared)")
	if err := fs.parse(e, args); err != nil {
		return err
	}
	if err := a.check(fs); err != nil {
		return err
	}
	if *level == "" {
		if *gid != 0 || *rooms || *ttl != 0 {
			return fs.usageErr("-gid, -rooms and -ttl go with -level")
		}
		return a.call(ctx, e, http.MethodGet, "/admin/v1/degrade", nil)
	}
	body := map[string]any{"scope": "node"}
	top := wire.MaxLevel
	switch {
	case *rooms && *gid != 0:
		return fs.usageErr("-rooms and -gid exclude each other")
	case *rooms:
		body["scope"], top = "rooms", 2
	case *gid < 0:
		return fs.usageErr("-gid must be positive, got %d", *gid)
	case *gid != 0:
		body["scope"] = "group"
		body["gid"] = *gid
	}
	if *level == "clear" {
		body["level"] = nil
	} else {
		n, err := strconv.Atoi(*level)
		if err != nil || n < 0 || n > top {
			return fs.usageErr("-level must be 0-%d or clear, got %q", top, *level)
		}
		body["level"] = n
	}
	if *ttl < 0 {
		return fs.usageErr("-ttl must not be negative, got %v", *ttl)
	}
	if *ttl > 0 {
		body["ttl_s"] = int64(ttl.Seconds())
	}
	return a.call(ctx, e, http.MethodPut, "/admin/v1/degrade", body)
}

func cmdRooms(ctx context.Context, e *env, args []string) error {
	fs := newFlags("rooms", "-room NAME [-show] [-max-active N] [-admit-rate R] [...] [-http URL] [-admin-token T]", `
Creates or updates the waiting room -room with the settings given (POST
/admin/v1/rooms; a setting left out keeps its value), or with -show prints
its configuration and state (GET /admin/v1/rooms/NAME). docs/operations.md
section 10 describes the rooms.`)
	var a adminFlags
	a.register(fs.FlagSet, e)
	room := fs.String("room", "", "room name (required)")
	show := fs.Bool("show", false, "show the room's state instead of creating/updating it")
	maxActive := fs.Int("max-active", 0, "users admitted at once")
	admitRate := fs.Float64("admit-rate", 0, "admissions per second")
	maxWait := fs.Duration("max-wait", 0, "max-wait guarantee (0 = server default, 20m)")
	grace := fs.Duration("grace", 0, "reconnect grace (0 = server default, 2m)")
	targetWait := fs.Duration("target-wait", 0, "target wait for Little's Law capacity")
	vipShare := fs.Float64("vip-share-cap", 0, "VIP share of the queue before biases shrink (0 = default 0.3)")
	vipBias := fs.String("vip-bias", "", "VIP bias seconds per level, e.g. 1=600,2=1800,3=3600")
	admitShare := fs.Float64("vip-admit-share", 0, "most of the admissions VIPs get while normal users wait (0 = node limits' room_admit, 2/3 by default; negative = off)")
	state := fs.String("state", "", "open or closed")
	if err := fs.parse(e, args); err != nil {
		return err
	}
	if *room == "" {
		return fs.usageErr("-room is required")
	}
	if err := a.check(fs); err != nil {
		return err
	}
	if *show {
		return a.call(ctx, e, http.MethodGet, "/admin/v1/rooms/"+*room, nil)
	}
	body := map[string]any{"room": *room}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["max-active"] {
		body["max_active"] = *maxActive
	}
	if set["admit-rate"] {
		body["admit_rate"] = *admitRate
	}
	if set["max-wait"] {
		body["max_wait_s"] = int64(maxWait.Seconds())
	}
	if set["grace"] {
		body["grace_s"] = int64(grace.Seconds())
	}
	if set["target-wait"] {
		body["target_wait_s"] = int64(targetWait.Seconds())
	}
	if set["vip-share-cap"] {
		body["vip_share_cap"] = *vipShare
	}
	if set["vip-admit-share"] {
		body["vip_admit_share"] = *admitShare
	}
	if *vipBias != "" {
		bias := map[string]int64{}
		for _, kv := range strings.Split(*vipBias, ",") {
			k, v, ok := strings.Cut(kv, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if !ok || err != nil || (k != "1" && k != "2" && k != "3") {
				return fs.usageErr("-vip-bias: bad entry %q (want level=seconds, level 1-3)", kv)
			}
			bias[k] = n
		}
		body["vip_bias_s"] = bias
	}
	if *state != "" {
		if *state != "open" && *state != "closed" {
			return fs.usageErr("-state must be open or closed, got %q", *state)
		}
		body["state"] = *state
	}
	return a.call(ctx, e, http.MethodPost, "/admin/v1/rooms", body)
}
