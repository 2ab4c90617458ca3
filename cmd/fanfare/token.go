package main

import (
	"context"
	"fmt"
	"time"

	"github.com/fanfare-im/fanfare/gateway/auth"
	"github.com/fanfare-im/fanfare/store/postgres"
)

func init() {
	register("token", "print a user token signed with FANFARE_JWT_SECRET", cmdToken)
	register("migrate", "apply the Postgres schema (FANFARE_POSTGRES_URL)", cmdMigrate)
}

func cmdToken(_ context.Context, e *env, args []string) error {
	fs := newFlags("token", "-uid U [-lvl N] [-ttl D] [-jwt-secret S]", `
Prints a user token (an HS256 JWT: sub = -uid, lvl = -lvl, exp = now +
-ttl) signed with the node's -jwt-secret, for the WebSocket (?token= or
the Authorization header) and the user HTTP routes. In embedded mode
fanfared prints its generated secret at start.`)
	uid := fs.String("uid", "", "user id (JWT sub), required")
	lvl := fs.Int("lvl", 0, "VIP tier (the lvl claim): 0 normal, 1-3 VIP")
	ttl := fs.Duration("ttl", 24*time.Hour, "token lifetime")
	secret := new(string)
	secretVar(fs.FlagSet, e, secret, "jwt-secret", "FANFARE_JWT_SECRET", "HS256 `secret`")
	if err := fs.parse(e, args); err != nil {
		return err
	}
	if *uid == "" {
		return fs.usageErr("-uid is required")
	}
	if *secret == "" {
		return fs.usageErr("no secret: set FANFARE_JWT_SECRET or pass -jwt-secret (fanfared prints it at start in embedded mode)")
	}
	if *lvl < 0 || *lvl > auth.MaxTier {
		return fs.usageErr("-lvl must be 0-%d, got %d", auth.MaxTier, *lvl)
	}
	if *ttl <= 0 {
		return fs.usageErr("-ttl must be positive, got %v", *ttl)
	}
	s, err := auth.NewSigner(auth.SignerConfig{Secret: []byte(*secret)})
	if err != nil {
		return fs.usageErr("-jwt-secret: %v", err) // too short
	}
	tok, err := s.Sign(*uid, *lvl, *ttl)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, tok)
	return nil
}

func cmdMigrate(ctx context.Context, e *env, args []string) error {
	fs := newFlags("migrate", "[-postgres-url URL] [-postgres-schema S]", `
Applies the migrations compiled into this binary to Postgres, in one
transaction under an advisory lock (already applied ones are skipped).
Nodes also migrate at start: running it first shows a failing migration
before any node is replaced. Prints "schema is current".`)
	url := new(string) // may hold a password
	secretVar(fs.FlagSet, e, url, "postgres-url", "FANFARE_POSTGRES_URL", "Postgres `URL`")
	schema := fs.String("postgres-schema", e.getenv("FANFARE_POSTGRES_SCHEMA"), "schema (FANFARE_POSTGRES_SCHEMA); empty = public")
	if err := fs.parse(e, args); err != nil {
		return err
	}
	if *url == "" {
		return fs.usageErr("no Postgres URL: set FANFARE_POSTGRES_URL or pass -postgres-url")
	}
	if err := postgres.Migrate(ctx, *url, *schema); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "schema is current")
	return nil
}
