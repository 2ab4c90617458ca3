package wire

// This file holds the presence frame (docs/protocol.md §4.16) and the
// answer of the member online route (docs/protocol.md §8.6).

// TypePresence is the presence frame: a group's online count, and for
// small groups the members who came online or went offline.
const TypePresence = "presence"

// MaxPresenceEvents is the most uids a presence frame's joined or left
// list may carry on the wire (a server's own bound is at most this);
// DecodeServer refuses longer lists.
const MaxPresenceEvents = 1024

// Presence reports the members of a group online, coalesced per interval
// (docs/protocol.md §4.16). Online is the count at TS (Unix ms); Joined and
// Left (absent when empty) name the members who came online and went
// offline since the previous presence frame of the group, for groups under
// the server's event threshold only. More says the lists were cut at the
// server's bound: the client re-reads the list (GET
// /v1/groups/{gid}/online) if it keeps one.
type Presence struct {
	GID    int64    `json:"gid"`
	Online int64    `json:"online"`
	TS     int64    `json:"ts"`
	Joined []string `json:"joined,omitempty"`
	Left   []string `json:"left,omitempty"`
	More   bool     `json:"more,omitempty"`
}

// FrameType returns "presence".
func (*Presence) FrameType() string { return TypePresence }

// AppendPresence appends the presence frame of p; joined, left and more
// are omitted when empty.
func AppendPresence(dst []byte, p *Presence) []byte {
	dst = append(dst, `{"type":"presence"`...)
	dst = appendIntField(dst, "gid", p.GID)
	dst = appendIntField(dst, "online", p.Online)
	dst = appendIntField(dst, "ts", p.TS)
	dst = appendStringList(dst, "joined", p.Joined)
	dst = appendStringList(dst, "left", p.Left)
	if p.More {
		dst = append(dst, `,"more":true`...)
	}
	return append(dst, '}')
}

func appendStringList(dst []byte, name string, l []string) []byte {
	if len(l) == 0 {
		return dst
	}
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':', '[')
	for i, s := range l {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, s)
	}
	return append(dst, ']')
}

func (p *Presence) decodeField(s *scanner, key []byte) (bool, error) {
	switch string(key) {
	case "gid":
		return s.intField("gid", &p.GID)
	case "online":
		return s.intField("online", &p.Online)
	case "ts":
		return s.intField("ts", &p.TS)
	case "joined":
		return s.stringList("joined", &p.Joined)
	case "left":
		return s.stringList("left", &p.Left)
	case "more":
		return s.boolField("more", &p.More)
	}
	return false, nil
}

func (p *Presence) check() (string, string) {
	switch {
	case p.GID <= 0:
		return "gid", "must be a positive integer"
	case p.Online < 0:
		return "online", "must not be negative"
	}
	return "", ""
}

// stringList decodes an array of at most MaxPresenceEvents strings (null
// = none).
func (s *scanner) stringList(name string, dst *[]string) (bool, error) {
	out := (*dst)[:0]
	null, err := s.array(true, func(n int) error {
		if n >= MaxPresenceEvents {
			return &fieldErr{name, "too many elements"}
		}
		raw, err := s.value()
		if err != nil {
			return err
		}
		if raw[0] != '"' {
			return &fieldErr{name, "must be an array of strings"}
		}
		out = append(out, unquote(raw))
		return nil
	})
	if null || err != nil {
		return true, err
	}
	*dst = out
	return true, nil
}

// OnlineMembers answers GET /v1/groups/{gid}/online (docs/protocol.md
// §8.6): the group's online count and, for groups under the server's list
// threshold, one page of the online members in uid order. Listed is false
// for a group above the threshold (Members is then empty). NextCursor,
// present only when more members follow, is the cursor of the next page.
type OnlineMembers struct {
	GID        int64    `json:"gid"`
	Online     int64    `json:"online"`
	TS         int64    `json:"ts"`
	Listed     bool     `json:"listed"`
	Members    []string `json:"members"`
	NextCursor string   `json:"next_cursor,omitempty"`
}
