package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// WriteJSON writes v as the JSON response body with status. A value that
// cannot be encoded is a programming error: it is answered 500.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		WriteError(w, fmt.Errorf("gateway: encode response: %w", err), ScopeAdmin)
		return
	}
	writeRaw(w, status, append(body, '\n'))
}

// WriteRawJSON writes body, already valid JSON (e.g. from
// wire.AppendMessagesPage), with status.
func WriteRawJSON(w http.ResponseWriter, status int, body []byte) {
	writeRaw(w, status, body)
}

// ReadBody reads the whole request body (bounded by
// APIConfig.MaxBodyBytes on registered routes: *http.MaxBytesError maps
// to 413).
func ReadBody(r *http.Request) ([]byte, error) {
	if r.Body == nil {
		return nil, BadRequest("request body required")
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, err
		}
		return nil, BadRequest("reading request body: %v", err)
	}
	return b, nil
}

// DecodeJSON decodes the request body into v strictly: exactly one JSON
// value, no unknown fields (admin bodies are configuration: a misspelt
// field must not be silently ignored). Failures are BadRequest errors with
// a client-facing message, or *http.MaxBytesError (413).
func DecodeJSON(r *http.Request, v any) error {
	b, err := ReadBody(r)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return BadRequest("request body required")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return BadRequest("malformed JSON at offset %d", se.Offset)
		case errors.As(err, &te):
			return BadRequest("field %s: want %s, got JSON %s", te.Field, te.Type, te.Value)
		case errors.Is(err, io.ErrUnexpectedEOF):
			return BadRequest("malformed JSON: unexpected end")
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return BadRequest("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
		}
		return BadRequest("invalid body: %v", err)
	}
	if dec.More() {
		return BadRequest("data after the JSON value")
	}
	return nil
}

// PathInt64 parses the path value name (a {gid} wildcard) as a positive
// integer.
func PathInt64(r *http.Request, name string) (int64, error) {
	s := r.PathValue(name)
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 {
		return 0, BadRequest("%s: must be a positive integer", name)
	}
	return v, nil
}

// QueryInt64 parses the query parameter name as a non-negative integer;
// def when absent or empty.
func QueryInt64(r *http.Request, name string, def int64) (int64, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, BadRequest("%s: must be a non-negative integer", name)
	}
	return v, nil
}
