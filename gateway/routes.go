package gateway

import (
	"context"
	"net/http"
	"time"

	"github.com/fanfare-im/fanfare/fanout"
	"github.com/fanfare-im/fanfare/fanout/waitroom"
	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/store"
)

// RoutesConfig is what the chat routes need besides the engine.
type RoutesConfig struct {
	// Limiter decides the per-user send and pull limits; nil = none.
	Limiter limiter.Limiter
	// ApplyLimits puts limits changed through the admin API in force
	// everywhere they apply (the node's own limiters, and in cluster mode
	// the other nodes); nil = Limiter.SetLimits only.
	ApplyLimits func(context.Context, limiter.Limits) error
	// Rooms, when set, adds the waiting rooms' degradation (scope "rooms")
	// to GET/PUT /admin/v1/degrade.
	Rooms *waitroom.Manager
	// PageBytes bounds the body of one GET /v1/groups/{gid}/messages
	// answer as ChatConfig.PageBytes bounds a pull's; 0 = DefaultPageBytes.
	PageBytes int
	// SyncPage bounds the groups of one GET /v1/sync answer (the rest
	// follow through its next_after cursor); 0 = DefaultSyncPage, at most
	// MaxSyncPage.
	SyncPage int
}

// Groups per GET /v1/sync answer (RoutesConfig.SyncPage).
const (
	// DefaultSyncPage is the default page: about 60 KB of JSON for
	// typical gids and seqs.
	DefaultSyncPage = 1000
	// MaxSyncPage is the largest page: one group encodes in at most 124
	// bytes (four 19-digit numbers, their keys and a comma), so a page of
	// it stays under 1 MiB.
	MaxSyncPage = 8192
)

// Routes registers the chat endpoints of docs/protocol.md §8, §9 on a: messages, sync,
// send, group and member management, users, degradation levels and limits.
func Routes(a *API, eng *fanout.Engine, cfg RoutesConfig) {
	if cfg.PageBytes <= 0 {
		cfg.PageBytes = DefaultPageBytes
	}
	if cfg.SyncPage <= 0 {
		cfg.SyncPage = DefaultSyncPage
	}
	cfg.SyncPage = min(cfg.SyncPage, MaxSyncPage)
	h := &routes{eng: eng, lim: cfg.Limiter, apply: cfg.ApplyLimits, rooms: cfg.Rooms, pageBytes: cfg.PageBytes, syncPage: cfg.SyncPage}
	a.HandleUser("GET /v1/groups/{gid}/messages", h.messages)
	a.HandleUser("GET /v1/sync", h.sync)
	a.HandleUserOrAdmin("POST /v1/groups/{gid}/messages", h.send)
	a.HandleAdmin("POST /v1/groups", h.createGroup)
	a.HandleAdmin("POST /v1/groups/{gid}/members", h.addMembers)
	a.HandleAdmin("DELETE /v1/groups/{gid}/members/{uid}", h.removeMember)
	a.HandleAdmin("PATCH /v1/groups/{gid}", h.patchGroup)
	a.HandleAdmin("PUT /v1/users/{uid}", h.setUser)
	a.HandleAdmin("GET /admin/v1/degrade", h.getDegrade)
	a.HandleAdmin("PUT /admin/v1/degrade", h.putDegrade)
	a.HandleAdmin("GET /admin/v1/limits", h.getLimits)
	a.HandleAdmin("PUT /admin/v1/limits", h.putLimits)
	a.HandleAdmin("GET /admin/v1/hot-groups", h.hotGroups)
	a.HandleAdmin("GET /admin/v1/groups/{gid}/tier2", h.getTier2)
	a.HandleAdmin("PUT /admin/v1/groups/{gid}/tier2", h.putTier2)
}

type routes struct {
	// eng is the one way into the groups: the routes hold no store, so
	// every change goes through the engine (TestRoutesHoldNoStore).
	eng   *fanout.Engine
	lim   limiter.Limiter
	apply func(context.Context, limiter.Limits) error
	rooms *waitroom.Manager
	// pageBytes bounds a messages page (RoutesConfig.PageBytes).
	pageBytes int
	// syncPage bounds a sync page (RoutesConfig.SyncPage).
	syncPage int
}

func (h *routes) messages(w http.ResponseWriter, r *http.Request) error {
	gid, err := PathInt64(r, "gid")
	if err != nil {
		return err
	}
	from, err := QueryInt64(r, "from_seq", 0)
	if err != nil {
		return err
	}
	to, err := QueryInt64(r, "to_seq", 0)
	if err != nil {
		return err
	}
	if err := wire.CheckPullRange(from, to); err != nil {
		return err // worded as the pull frame's refusal of the same range
	}
	caller, _ := CallerFrom(r.Context())
	if err := allow(r.Context(), h.lim, limiter.Check{Rule: limiter.Pull, User: caller.Claims.UID, Tier: caller.Claims.Tier}); err != nil {
		return err
	}
	msgs, last, next, err := pagedMessages(r.Context(), h.eng, gid, caller.Claims.UID, from, to, h.pageBytes)
	if err != nil {
		return err
	}
	page := wire.MessagesPage{GID: gid, Messages: wireMsgs(make([]wire.Msg, 0, len(msgs)), msgs), LastSeq: last, NextSeq: next}
	body, _ := wire.AppendMessagesPageWithin(nil, &page, h.pageBytes)
	WriteRawJSON(w, http.StatusOK, body)
	return nil
}

// sync answers one page of the caller's groups from ?after_gid= (default
// 0, the first page): a client that ignores the cursor gets the first
// page, as the whole answer was before pages. One group more than the page
// is read to tell whether next_after is due.
func (h *routes) sync(w http.ResponseWriter, r *http.Request) error {
	after, err := QueryInt64(r, "after_gid", 0)
	if err != nil {
		return err
	}
	caller, _ := CallerFrom(r.Context())
	entries, err := h.eng.Sync(r.Context(), caller.Claims.UID, after, h.syncPage+1)
	if err != nil {
		return err
	}
	resp := wire.SyncResponse{}
	if len(entries) > h.syncPage {
		entries = entries[:h.syncPage]
		resp.NextAfter = entries[len(entries)-1].GID
	}
	resp.Groups = make([]wire.SyncGroup, 0, len(entries))
	for _, e := range entries {
		resp.Groups = append(resp.Groups, wire.SyncGroup{GID: e.GID, LastSeq: e.LastSeq, LastReadSeq: e.LastReadSeq, Unread: e.Unread})
	}
	WriteJSON(w, http.StatusOK, resp)
	return nil
}

// send stores a message like the send frame. A user sends as itself; the
// admin sends as the uid in ?as= (an addition, docs/protocol.md §8.3), by default
// the group's owner, who must be a member.
func (h *routes) send(w http.ResponseWriter, r *http.Request) error {
	gid, err := PathInt64(r, "gid")
	if err != nil {
		return err
	}
	body, err := ReadBody(r)
	if err != nil {
		return err
	}
	req, err := wire.DecodeSendRequest(body)
	if err != nil {
		return err
	}
	caller, _ := CallerFrom(r.Context())
	uid := caller.Claims.UID
	if !caller.Admin {
		checks := sendChecks(make([]limiter.Check, 0, 2), uid, caller.Claims.Tier, gid)
		if err := allow(r.Context(), h.lim, checks...); err != nil {
			return err
		}
	} else {
		uid = r.URL.Query().Get("as")
		if uid == "" {
			g, err := h.eng.Group(r.Context(), gid)
			if err != nil {
				return err
			}
			uid = g.Owner
		}
	}
	res := h.eng.SendWait(r.Context(), fanout.SendRequest{GID: gid, UID: uid, ClientMsgID: req.ID, Kind: req.Kind, Body: req.Body})
	if res.Err != nil {
		return res.Err
	}
	WriteJSON(w, http.StatusOK, wire.SendResponse{GID: gid, Seq: res.Seq, TS: res.CreatedAt.UnixMilli()})
	return nil
}

func groupBody(g store.Group) wire.Group {
	return wire.Group{GID: g.GID, Name: g.Name, Owner: g.Owner, State: string(g.State), LastSeq: g.LastSeq, MemberCount: g.MemberCount}
}

func (h *routes) createGroup(w http.ResponseWriter, r *http.Request) error {
	var req wire.CreateGroupRequest
	if err := DecodeJSON(r, &req); err != nil {
		return err
	}
	if req.GID < 0 {
		return BadRequest("gid: must be positive")
	}
	if req.Owner == "" {
		return BadRequest("owner: required")
	}
	g, err := h.eng.CreateGroup(r.Context(), store.Group{GID: req.GID, Name: req.Name, Owner: req.Owner})
	if err != nil {
		return err
	}
	WriteJSON(w, http.StatusCreated, groupBody(g))
	return nil
}

func (h *routes) addMembers(w http.ResponseWriter, r *http.Request) error {
	gid, err := PathInt64(r, "gid")
	if err != nil {
		return err
	}
	var req wire.AddMembersRequest
	if err := DecodeJSON(r, &req); err != nil {
		return err
	}
	if len(req.UIDs) == 0 {
		return BadRequest("uids: at least one uid required")
	}
	ms, err := h.eng.AddMembers(r.Context(), gid, req.UIDs)
	if err != nil {
		return err
	}
	resp := wire.MembersResponse{GID: gid, Members: make([]wire.Member, 0, len(ms))}
	for _, m := range ms {
		resp.Members = append(resp.Members, wire.Member{UID: m.UID, JoinSeq: m.JoinSeq, Muted: m.Muted})
	}
	WriteJSON(w, http.StatusOK, resp)
	return nil
}

func (h *routes) removeMember(w http.ResponseWriter, r *http.Request) error {
	gid, err := PathInt64(r, "gid")
	if err != nil {
		return err
	}
	uid := r.PathValue("uid")
	if uid == "" {
		return BadRequest("uid: required")
	}
	if err := h.eng.RemoveMember(r.Context(), gid, uid); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *routes) patchGroup(w http.ResponseWriter, r *http.Request) error {
	gid, err := PathInt64(r, "gid")
	if err != nil {
		return err
	}
	var req wire.PatchGroupRequest
	if err := DecodeJSON(r, &req); err != nil {
		return err
	}
	st := store.GroupState(req.State)
	if !st.Valid() {
		return BadRequest("state: must be active, muted_all or dissolved")
	}
	g, err := h.eng.SetGroupState(r.Context(), gid, st)
	if err != nil {
		return err
	}
	WriteJSON(w, http.StatusOK, groupBody(g))
	return nil
}

func (h *routes) setUser(w http.ResponseWriter, r *http.Request) error {
	uid := r.PathValue("uid")
	var req wire.SetUserRequest
	if err := DecodeJSON(r, &req); err != nil {
		return err
	}
	// The wire's "level" of a user is its VIP tier (the token's lvl).
	if req.Level == nil || *req.Level < 0 || *req.Level > auth.MaxTier {
		return BadRequest("level: required, 0-%d", auth.MaxTier)
	}
	if err := h.eng.SetUserTier(r.Context(), uid, *req.Level); err != nil {
		return err
	}
	WriteJSON(w, http.StatusOK, wire.User{UID: uid, Level: *req.Level})
	return nil
}

// degradeScope is one scope of GET /admin/v1/degrade: the docs/protocol.md
// §9.6 fields plus (additions) the cause of the automatic level and whether the
// group is hot.
type degradeScope struct {
	wire.DegradeState
	Cause string `json:"cause,omitempty"`
	Hot   bool   `json:"hot,omitempty"`
}

type degradeStatus struct {
	Node   degradeScope   `json:"node"`
	Groups []degradeScope `json:"groups"`
	// Rooms (an addition) is the waiting rooms' level: 1 Redis memory
	// high, 2 Redis overloaded, 3 on the nodes' local queues.
	Rooms *wire.DegradeState `json:"rooms,omitempty"`
}

func roomsDegradeState(m *waitroom.Manager) *wire.DegradeState {
	st := m.DegradationState()
	d := &wire.DegradeState{Level: int(st.Level), Auto: int(st.Auto)}
	if st.Forced != nil {
		f := int(*st.Forced)
		d.Forced = &f
		if !st.ForcedUntil.IsZero() {
			d.ExpiresAt = st.ForcedUntil.UnixMilli()
		}
	}
	return d
}

func (h *routes) degradeState(s fanout.ScopeLevel) degradeScope {
	d := wire.DegradeState{GID: s.GID, Level: wireLevel(s.Level), Auto: wireLevel(s.Auto)}
	if s.Forced != nil {
		f := wireLevel(*s.Forced)
		d.Forced = &f
		if !s.ExpiresAt.IsZero() {
			d.ExpiresAt = s.ExpiresAt.UnixMilli()
		}
	}
	return degradeScope{DegradeState: d, Cause: s.Cause, Hot: s.GID != 0 && h.eng.IsHot(s.GID)}
}

func (h *routes) getDegrade(w http.ResponseWriter, r *http.Request) error {
	node, groups := h.eng.Levels().Snapshot()
	resp := degradeStatus{Node: h.degradeState(node), Groups: make([]degradeScope, 0, len(groups))}
	for _, g := range groups {
		resp.Groups = append(resp.Groups, h.degradeState(g))
	}
	if h.rooms != nil {
		resp.Rooms = roomsDegradeState(h.rooms)
	}
	WriteJSON(w, http.StatusOK, resp)
	return nil
}

func (h *routes) hotGroups(w http.ResponseWriter, r *http.Request) error {
	hot := h.eng.HotGroups()
	resp := wire.HotGroupsResponse{Groups: make([]wire.HotGroup, 0, len(hot))}
	for _, g := range hot {
		nodes := make([]wire.HotGroupNode, 0, len(g.Marks))
		for _, m := range g.Marks {
			nodes = append(nodes, wire.HotGroupNode{Node: m.Node, Rate: m.Rate, Since: m.Since.UnixMilli()})
		}
		resp.Groups = append(resp.Groups, wire.HotGroup{GID: g.GID, Rate: g.Rate, Baseline: g.Baseline, Since: g.Since.UnixMilli(),
			Source: string(g.Source), Nodes: nodes})
	}
	WriteJSON(w, http.StatusOK, resp)
	return nil
}

// tier2State answers GET/PUT /admin/v1/groups/{gid}/tier2 (an addition,
// docs/protocol.md §9.9): whether tier 2 writes for the group, the operator's
// override (null = automatic) and why.
type tier2State struct {
	GID      int64  `json:"gid"`
	Enabled  bool   `json:"enabled"`
	Override *bool  `json:"override"`
	Reason   string `json:"reason"`
	Active   int    `json:"active_members"`
	Members  int64  `json:"member_count"`
}

func (h *routes) writeTier2(w http.ResponseWriter, gid int64) {
	s := h.eng.Tier2(gid)
	WriteJSON(w, http.StatusOK, tier2State{GID: gid, Enabled: s.Enabled, Override: s.Override, Reason: s.Reason, Active: s.Active, Members: s.Members})
}

func (h *routes) getTier2(w http.ResponseWriter, r *http.Request) error {
	gid, err := PathInt64(r, "gid")
	if err != nil {
		return err
	}
	h.writeTier2(w, gid)
	return nil
}

// putTier2 takes {"enabled": true|false|null}: null returns the group to
// the automatic switch.
func (h *routes) putTier2(w http.ResponseWriter, r *http.Request) error {
	gid, err := PathInt64(r, "gid")
	if err != nil {
		return err
	}
	var req struct {
		Enabled *bool `json:"enabled"`
	}
	if err := DecodeJSON(r, &req); err != nil {
		return err
	}
	if _, err := h.eng.Group(r.Context(), gid); err != nil {
		return err
	}
	h.eng.SetTier2(gid, req.Enabled)
	h.writeTier2(w, gid)
	return nil
}

func (h *routes) putDegrade(w http.ResponseWriter, r *http.Request) error {
	var req wire.DegradeRequest
	if err := DecodeJSON(r, &req); err != nil {
		return err
	}
	var gid int64
	switch req.Scope {
	case wire.ScopeNode:
		if req.GID != 0 {
			return BadRequest("gid: not allowed with scope node")
		}
	case wire.ScopeGroup:
		if req.GID <= 0 {
			return BadRequest("gid: required with scope group")
		}
		gid = req.GID
	case wire.ScopeRooms:
		if h.rooms == nil {
			return BadRequest("scope: this node runs no waiting rooms")
		}
		if req.GID != 0 {
			return BadRequest("gid: not allowed with scope rooms")
		}
	default:
		return BadRequest("scope: must be node, group or rooms")
	}
	if req.TTLS < 0 {
		return BadRequest("ttl_s: must not be negative")
	}
	if req.Scope == wire.ScopeRooms {
		if req.Level == nil {
			h.rooms.ClearDegradation()
		} else if err := h.rooms.ForceDegradation(waitroom.Degradation(*req.Level), time.Duration(req.TTLS)*time.Second); err != nil {
			return BadRequest("level: rooms take 0-2 or null (level 3, the local queues, follows Redis reachability)")
		}
		return h.getDegrade(w, r)
	}
	var lv *fanout.Level
	if req.Level != nil {
		l, ok := engineLevel(*req.Level)
		if !ok {
			return BadRequest("level: must be %d-%d or null", wire.LevelNormal, wire.MaxLevel)
		}
		lv = &l
	}
	if gid != 0 {
		// A level forced for a gid that does not exist would sit in the
		// status unseen by any client, and a typo would look like success:
		// refuse it as every admin route refuses an unknown group.
		if _, err := h.eng.Group(r.Context(), gid); err != nil {
			return err
		}
	}
	h.eng.Levels().Force(gid, lv, time.Duration(req.TTLS)*time.Second)
	return h.getDegrade(w, r)
}
