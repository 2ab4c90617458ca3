package wire

// EventTicket answers POST /v1/events/ticket (docs/protocol.md §14.2): a
// ticket that opens one event stream, accepted until ExpiresAt (Unix ms).
type EventTicket struct {
	Ticket    string `json:"ticket"`
	ExpiresAt int64  `json:"expires_at"`
}

// ReadRequest is the body of POST /v1/groups/{gid}/read: the read frame
// (docs/protocol.md §4.3) over HTTP.
type ReadRequest struct {
	Seq int64 `json:"seq"`
}
