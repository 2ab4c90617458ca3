package gateway

import (
	"net/http"
	"slices"

	"github.com/fanfare-im/fanfare/gateway/wire"
	"github.com/fanfare-im/fanfare/limiter"
	"github.com/fanfare-im/fanfare/store"
)

// Bounds of GET /v1/groups/{gid}/online (docs/protocol.md §8.6).
const (
	DefaultOnlinePage = 100
	MaxOnlinePage     = 500
	// maxOnlineCursor bounds ?cursor= (a uid; uids are at most 128 bytes,
	// gateway/auth).
	maxOnlineCursor = 256
)

// PresenceRoutes registers GET /v1/groups/{gid}/online on a: for members
// of the group, its online count and, for groups of at most the feed's
// ListMax members, a page of its online members in uid order after
// ?cursor= (at most ?limit=, 1..MaxOnlinePage). Each call is one
// online_list check of lim (nil = none).
func PresenceRoutes(a *API, f *PresenceFeed, st store.Store, lim limiter.Limiter) {
	a.HandleUser("GET /v1/groups/{gid}/online", func(w http.ResponseWriter, r *http.Request) error {
		gid, err := PathInt64(r, "gid")
		if err != nil {
			return err
		}
		limit, err := QueryInt64(r, "limit", DefaultOnlinePage)
		if err != nil {
			return err
		}
		if limit < 1 || limit > MaxOnlinePage {
			return BadRequest("limit: must be in 1..%d", MaxOnlinePage)
		}
		cursor := r.URL.Query().Get("cursor")
		if len(cursor) > maxOnlineCursor {
			return BadRequest("cursor: at most %d bytes", maxOnlineCursor)
		}
		caller, _ := CallerFrom(r.Context())
		uid := caller.Claims.UID
		if err := allow(r.Context(), lim, limiter.Check{Rule: limiter.OnlineList, Key: uid, Tier: caller.Claims.Tier}); err != nil {
			return err
		}
		if _, err := st.Member(r.Context(), gid, uid); err != nil {
			return err // not a member, or no such group: the same refusal
		}
		g, err := st.Group(r.Context(), gid)
		if err != nil {
			return err
		}
		n, uids, listed, err := f.Occupancy(r.Context(), gid, g.MemberCount)
		if err != nil {
			return err
		}
		out := wire.OnlineMembers{GID: gid, Online: n, TS: f.cfg.Now().UnixMilli(), Listed: listed, Members: []string{}}
		if listed {
			i, found := slices.BinarySearch(uids, cursor)
			if found {
				i++
			}
			rest := uids[i:]
			out.Members = rest[:min(len(rest), int(limit))]
			if len(rest) > int(limit) {
				out.NextCursor = out.Members[len(out.Members)-1]
			}
		}
		WriteJSON(w, http.StatusOK, out)
		return nil
	})
}
