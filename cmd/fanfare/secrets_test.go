package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestAdversarialSecretsHelp is class 8 of the adversarial suite
// (cmd/fanfared/adversarial_test.go): with the secrets in the environment,
// no command's help or usage output shows them (flag defaults included).
func TestAdversarialSecretsHelp(t *testing.T) {
	env := map[string]string{
		"FANFARE_JWT_SECRET":   "env-jwt-secret-0123456789abcdef-0123456789",
		"FANFARE_ADMIN_TOKEN":  "env-admin-token-abcdef",
		"FANFARE_POSTGRES_URL": "postgres://u:env-pg-password@127.0.0.1:1/x",
		"FANFARE_HTTP":         "http://127.0.0.1:1",
	}
	secrets := map[string]string{"FANFARE_JWT_SECRET": env["FANFARE_JWT_SECRET"],
		"FANFARE_ADMIN_TOKEN": env["FANFARE_ADMIN_TOKEN"], "FANFARE_POSTGRES_URL password": "env-pg-password"}
	runs := [][]string{{"-h"}, {"rooms"}, {"bench"}, {"bench", "broadcast", "-h"}, {"bench", "room", "-h"}}
	for name := range commands {
		runs = append(runs, []string{name, "-h"})
	}
	for _, args := range runs {
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = run(ctx, args, func(k string) string { return env[k] }, &out, &out)
		cancel()
		for what, s := range secrets {
			if strings.Contains(out.String(), s) {
				t.Errorf("fanfare %s prints %s", strings.Join(args, " "), what)
			}
		}
	}
}
