package gateway

import (
	"errors"
	"net/http"
	"strings"

	"github.com/fanfare-im/fanfare/fanout"
)

// TuningRoutes registers GET and PUT /admin/v1/tuning (an addition,
// docs/protocol.md §9.11): the engine's reloadable settings (fanout.Tuning) of this
// node.
//
// GET answers the document in force, every field present, defaults filled
// in, durations as Go duration strings ("200ms"). PUT takes a whole
// document (the operator flow is GET, edit, PUT): a missing or unknown
// field, a wrong type or an invalid value is 400 with a message naming
// the fields, and nothing changes; a zero means the field's default, as in
// the configuration. It answers the document now in force. The change is
// this node's only and lasts until the next restart or SIGHUP reload of a
// -config file (which puts the file's settings back in force).
func TuningRoutes(a *API, eng *fanout.Engine) {
	h := &tuningRoutes{eng: eng}
	a.HandleAdmin("GET /admin/v1/tuning", h.get)
	a.HandleAdmin("PUT /admin/v1/tuning", h.put)
}

type tuningRoutes struct {
	eng *fanout.Engine
}

func (h *tuningRoutes) get(w http.ResponseWriter, r *http.Request) error {
	WriteJSON(w, http.StatusOK, h.eng.Tuning())
	return nil
}

func (h *tuningRoutes) put(w http.ResponseWriter, r *http.Request) error {
	var t fanout.Tuning
	if err := DecodeJSON(r, &t); err != nil {
		return err
	}
	if err := h.eng.SetTuning(t); err != nil {
		if errors.Is(err, fanout.ErrInvalidTuning) {
			return BadRequest("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
		}
		return err
	}
	WriteJSON(w, http.StatusOK, h.eng.Tuning())
	return nil
}
