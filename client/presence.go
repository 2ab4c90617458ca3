package client

// This file holds the member presence API (docs/protocol.md §4.16, §8.6):
// the latest online count of a group, its joins and leaves as they are
// pushed, and the paginated list of its online members.

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/fanfare-im/fanfare/gateway/wire"
)

// Presence is one presence frame: the online count of GID at TS and, for
// groups under the server's event threshold, the uids that came online
// (Joined) and went offline (Left) since the group's previous frame. More
// says the lists were cut (or events were shed under load): re-read the
// list with OnlineMembers if the app shows one.
type Presence struct {
	GID    int64
	Online int64
	TS     time.Time
	Joined []string
	Left   []string
	More   bool
}

// presence records and hands on one presence frame (socket reader).
func (c *Conn) presence(f *wire.Presence) {
	p := Presence{GID: f.GID, Online: f.Online, TS: time.UnixMilli(f.TS), Joined: f.Joined, Left: f.Left, More: f.More}
	c.online.Store(f.GID, p)
	if c.cfg.OnPresence != nil {
		c.cfg.OnPresence(p)
	}
}

// Online returns the latest presence frame of gid received on this Conn,
// and false when none came yet (the server pushes one per interval only
// when the count changed: call OnlineMembers for the current count).
func (c *Conn) Online(gid int64) (Presence, bool) {
	v, ok := c.online.Load(gid)
	if !ok {
		return Presence{}, false
	}
	return v.(Presence), true
}

// OnlinePage is one page of GET /v1/groups/{gid}/online: the group's
// online count now and, when Listed (the group is under the server's list
// threshold), up to the asked number of online members in uid order.
// NextCursor, "" on the last page, continues the list.
type OnlinePage struct {
	GID        int64
	Online     int64
	TS         time.Time
	Listed     bool
	Members    []string
	NextCursor string
}

// OnlineMembers reads one page of gid's online members after cursor (""
// = the first page), at most limit (0 = the server's default of 100; the
// server refuses more than 500). It needs Config.HTTPURL. A non-member
// gets *Error with code forbidden.
func (c *Conn) OnlineMembers(ctx context.Context, gid int64, cursor string, limit int) (OnlinePage, error) {
	if c.cfg.HTTPURL == "" {
		return OnlinePage{}, fmt.Errorf("client: OnlineMembers needs Config.HTTPURL")
	}
	q := url.Values{}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/v1/groups/" + strconv.FormatInt(gid, 10) + "/online"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var resp wire.OnlineMembers
	if err := c.httpGet(ctx, path, &resp); err != nil {
		return OnlinePage{}, err
	}
	if resp.NextCursor != "" && resp.NextCursor <= cursor {
		return OnlinePage{}, fmt.Errorf("%w: GET %s: next_cursor does not move past cursor", ErrProtocol, path)
	}
	return OnlinePage{GID: resp.GID, Online: resp.Online, TS: time.UnixMilli(resp.TS), Listed: resp.Listed,
		Members: resp.Members, NextCursor: resp.NextCursor}, nil
}

// AllOnlineMembers reads every page of gid's online members (the server
// lists groups under its threshold only, so the list is bounded by it)
// and returns them in uid order with the count of the last page.
func (c *Conn) AllOnlineMembers(ctx context.Context, gid int64) (members []string, online int64, listed bool, err error) {
	cursor := ""
	for {
		p, err := c.OnlineMembers(ctx, gid, cursor, 500)
		if err != nil {
			return nil, 0, false, err
		}
		members = append(members, p.Members...)
		if p.NextCursor == "" {
			return members, p.Online, p.Listed, nil
		}
		cursor = p.NextCursor
	}
}
