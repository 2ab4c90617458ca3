package store

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestLimitsChecks(t *testing.T) {
	l := Limits{}.WithDefaults()
	if errs := l.Problems("x"); len(errs) != 0 {
		t.Fatalf("defaults: got %v, want no problem", errs)
	}
	bad := Limits{MaxRange: -1, MaxGID: -2}
	errs := bad.Problems("embedded")
	if len(errs) != 2 || errs[0].Error() != "embedded: Limits.MaxRange -1 is negative" || errs[1].Error() != "embedded: Limits.MaxGID -2 is negative" {
		t.Fatalf("got %v, want MaxRange and MaxGID named", errs)
	}

	if err := l.CheckBatch(3, 2); !errors.Is(err, ErrBadRequest) {
		t.Errorf("3 requests, 2 results: got %v, want ErrBadRequest", err)
	}
	if err := l.CheckBatch(l.MaxBatch+1, l.MaxBatch+1); !errors.Is(err, ErrTooLarge) {
		t.Errorf("MaxBatch+1: got %v, want ErrTooLarge", err)
	}
	if err := l.CheckBatch(l.MaxBatch, l.MaxBatch); err != nil {
		t.Errorf("MaxBatch: got %v, want nil", err)
	}

	got, err := l.DistinctUIDs([]string{"b", "a", "b", "c", "a"})
	if err != nil || !slices.Equal(got, []string{"b", "a", "c"}) {
		t.Errorf("got %v, %v; want [b a c] in first-seen order", got, err)
	}
	if _, err := l.DistinctUIDs([]string{"a", ""}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("empty uid: got %v, want ErrBadRequest", err)
	}
	if _, err := l.DistinctUIDs(make([]string, l.MaxAddMembers+1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("MaxAddMembers+1: got %v, want ErrTooLarge", err)
	}
	if _, err := l.DistinctUIDs([]string{strings.Repeat("u", l.MaxUID+1)}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("uid above MaxUID: got %v, want ErrBadRequest", err)
	}

	if g, err := l.CheckNewGroup(Group{Name: "g"}); err != nil || g.State != StateActive {
		t.Errorf("CheckNewGroup(no state) = %+v, %v; want state %q", g, err, StateActive)
	}
	for _, g := range []Group{
		{GID: -1}, {GID: l.MaxGID + 1}, {State: "nope"}, {Name: strings.Repeat("n", MaxGroupNameBytes+1)},
		{Name: "a\x00b"}, {Name: "\xff"}, {Owner: strings.Repeat("o", l.MaxUID+1)},
	} {
		if _, err := l.CheckNewGroup(g); !errors.Is(err, ErrBadRequest) {
			t.Errorf("CheckNewGroup(%+v): got %v, want ErrBadRequest", g, err)
		}
	}

	for _, tt := range []struct {
		from, to   int64
		limit, max int
		want       int
		wantErr    error
	}{
		{1, 10, 0, 0, l.MaxRange, nil},
		{1, 10, 5, 0, 5, nil},
		{1, 0, l.MaxRange + 1, 0, l.MaxRange, nil},
		{-1, 10, 0, 0, 0, ErrBadRequest},
		{1, 10, -1, 0, 0, ErrBadRequest},
		{1, 10, 0, -1, 0, ErrBadRequest},
		{10, 9, 0, 0, 0, ErrBadRequest},
	} {
		got, err := l.CheckRange(tt.from, tt.to, tt.limit, tt.max)
		if got != tt.want || !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
			t.Errorf("CheckRange(%d, %d, %d, %d) = %d, %v; want %d, %v", tt.from, tt.to, tt.limit, tt.max, got, err, tt.want, tt.wantErr)
		}
	}
}
