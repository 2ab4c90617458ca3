package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanfare-im/fanfare/store"
	"github.com/fanfare-im/fanfare/store/postgres/pgtest"
)

// TestAppendWhenPostgresStops stops a throwaway Postgres (immediate
// shutdown, i.e. a crash) while an Append is in the middle of its INSERT.
// The Append must fail with ErrUnavailable, Appends while it is down too,
// and after restart none of the batch is visible, last_seq did not move,
// and the same Store (pool) recovers and continues the seqs without a gap.
func TestAppendWhenPostgresStops(t *testing.T) {
	p := pgtest.StartThrowaway(t, 25432, 25439)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Open(ctx, Config{URL: p.URL(), MaxConns: 2})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	var gids []int64
	for range 3 {
		g, err := s.CreateGroup(ctx, store.Group{Name: "g"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddMembers(ctx, g.GID, []string{"u"}); err != nil {
			t.Fatal(err)
		}
		gids = append(gids, g.GID)
	}
	mk := func(i int, cid string) store.AppendRequest {
		return store.AppendRequest{GID: gids[i%len(gids)], Sender: "u", ClientMsgID: cid, Body: []byte(`{"n":1}`)}
	}
	var first []store.AppendRequest
	for i := range 3 {
		first = append(first, mk(i, fmt.Sprint("ok", i)))
	}
	if err := s.Append(ctx, first, make([]store.AppendResult, 3)); err != nil {
		t.Fatalf("Append before the stop: %v", err)
	}

	// A row trigger that stalls on one marked row, so the server can be
	// stopped while the INSERT has already written the rows before it.
	admin, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `
		CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.client_msg_id = 'stall' THEN PERFORM pg_sleep(120); END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER stall BEFORE INSERT ON messages FOR EACH ROW EXECUTE FUNCTION stall();`); err != nil {
		t.Fatal(err)
	}
	var batch []store.AppendRequest
	for i := range 30 {
		batch = append(batch, mk(i, fmt.Sprint("batch", i)))
	}
	batch = append(batch, mk(0, "stall"))
	errc := make(chan error, 1)
	go func() { errc <- s.Append(ctx, batch, make([]store.AppendResult, len(batch))) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Append never reached the stalled row")
		}
		time.Sleep(10 * time.Millisecond)
	}
	admin.Close(ctx)
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Append interrupted by the stop: got %v, want ErrUnavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Append did not return after the server stopped")
	}
	// While it is down: typed, retryable errors, quickly.
	down := []store.AppendRequest{mk(1, "while-down")}
	if err := s.Append(ctx, down, make([]store.AppendResult, 1)); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Append while down: got %v, want ErrUnavailable", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Ping while down: got %v, want ErrUnavailable", err)
	}
	if _, _, err := s.Messages(ctx, gids[0], "u", 0, 0, 0, 0); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Messages while down: got %v, want ErrUnavailable", err)
	}

	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	check, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(ctx)
	var n int
	if err := check.QueryRow(ctx, `SELECT count(*) FROM messages WHERE client_msg_id LIKE 'batch%' OR client_msg_id = 'stall'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("after restart: %d rows of the interrupted batch are visible, want 0", n)
	}
	rows, err := check.Query(ctx, `SELECT last_seq FROM groups ORDER BY gid`)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seqs, []int64{1, 1, 1}) {
		t.Errorf("after restart: got last_seqs %v, want [1 1 1]", seqs)
	}
	if _, err := check.Exec(ctx, `DROP TRIGGER stall ON messages`); err != nil {
		t.Fatal(err)
	}
	// The pool drops its dead connections and the seqs continue densely.
	res := make([]store.AppendResult, 2)
	if err := s.Append(ctx, []store.AppendRequest{mk(0, "after"), mk(0, "batch0")}, res); err != nil {
		t.Fatalf("Append after restart: %v", err)
	}
	if res[0].Seq != 2 || res[1].Seq != 3 || res[1].Duplicate {
		t.Errorf("after restart: got %+v, want seqs 2 and 3 (the lost batch took no seqs and is no duplicate)", res)
	}
}
