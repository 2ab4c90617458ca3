package main

import (
	"context"
	"flag"
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
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	uid := fs.String("uid", "", "user id (JWT sub), required")
	lvl := fs.Int("lvl", 0, "user level: 0 normal, 1-3 VIP")
	ttl := fs.Duration("ttl", 24*time.Hour, "token lifetime")
	secret := new(string)
	secretVar(fs, e, secret, "jwt-secret", "FANFARE_JWT_SECRET", "HS256 `secret`")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if *uid == "" {
		fmt.Fprintln(e.stderr, "usage: fanfare token -uid U [-lvl N] [-ttl D]")
		return errUsage
	}
	if *secret == "" {
		return fmt.Errorf("no secret: set FANFARE_JWT_SECRET or pass -jwt-secret (fanfared prints it at start in embedded mode)")
	}
	if *lvl < 0 || *lvl > auth.MaxLevel {
		return fmt.Errorf("-lvl must be 0-%d, got %d", auth.MaxLevel, *lvl)
	}
	s, err := auth.NewSigner(auth.SignerConfig{Secret: []byte(*secret)})
	if err != nil {
		return err
	}
	tok, err := s.Sign(*uid, *lvl, *ttl)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, tok)
	return nil
}

func cmdMigrate(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	url := new(string) // may hold a password
	secretVar(fs, e, url, "postgres-url", "FANFARE_POSTGRES_URL", "Postgres `URL`")
	schema := fs.String("postgres-schema", e.getenv("FANFARE_POSTGRES_SCHEMA"), "schema; empty = public")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if *url == "" {
		return fmt.Errorf("no Postgres URL: set FANFARE_POSTGRES_URL or pass -postgres-url")
	}
	if err := postgres.Migrate(ctx, *url, *schema); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "schema is current")
	return nil
}
