package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestShouldFallBack(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&HandshakeError{Status: 401}, false},
		{&HandshakeError{Status: 429}, false},
		{&HandshakeError{Status: 503}, false},
		{&HandshakeError{Status: 403}, true}, // a proxy
		{&HandshakeError{Status: 400}, true},
		{&HandshakeError{Status: 502}, true},
		{fmt.Errorf("client: dial ws://x: %w", errors.New("connection refused")), true},
		{context.Canceled, false},
	} {
		if got := shouldFallBack(tc.err); got != tc.want {
			t.Errorf("shouldFallBack(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestConfigTransport(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string // "" = valid
	}{
		{Config{URL: "ws://h/ws", Token: "t"}, ""},
		{Config{URL: "ws://h/ws", Token: "t", Transport: TransportWebSocket}, ""},
		{Config{Token: "t", Transport: TransportSSE, HTTPURL: "http://h"}, ""},
		{Config{Token: "t", Transport: TransportSSE}, "needs HTTPURL"},
		{Config{Token: "t", Transport: TransportWebSocket}, "URL is required"},
		{Config{URL: "ws://h/ws", Token: "t", Transport: "pigeon"}, "Transport"},
	} {
		err := tc.cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want it to say %q", tc.cfg, err, tc.want)
		}
	}
}
