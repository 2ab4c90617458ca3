package store

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// The argument checks every backend makes the same way, written once. They
// read l as the backend holds it: with its defaults applied (WithDefaults).

// Problems reports every negative field of l, each error starting with pkg
// (the backend's package name), for a backend's Config.Validate.
func (l Limits) Problems(pkg string) []error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{
		{"MaxBodyBytes", l.MaxBodyBytes}, {"MaxRange", l.MaxRange}, {"MaxBatch", l.MaxBatch},
		{"MaxAddMembers", l.MaxAddMembers}, {"MaxClientMsgID", l.MaxClientMsgID}, {"MaxUID", l.MaxUID},
	} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s: Limits.%s %d is negative", pkg, f.name, f.v))
		}
	}
	if l.MaxGID < 0 {
		errs = append(errs, fmt.Errorf("%s: Limits.MaxGID %d is negative", pkg, l.MaxGID))
	}
	return errs
}

// CheckBatch checks the sizes of an Append call: as many results as
// requests (else ErrBadRequest) and at most MaxBatch requests (else
// ErrTooLarge).
func (l Limits) CheckBatch(reqs, results int) error {
	if results != reqs {
		return fmt.Errorf("%w: %d results for %d requests", ErrBadRequest, results, reqs)
	}
	if reqs > l.MaxBatch {
		return fmt.Errorf("%w: batch of %d requests, max %d", ErrTooLarge, reqs, l.MaxBatch)
	}
	return nil
}

// DistinctUIDs checks the uids of an AddMembers call (at most
// MaxAddMembers, else ErrTooLarge; each a valid ID, see ValidateID) and
// returns them without repeats, in first-seen order.
func (l Limits) DistinctUIDs(uids []string) ([]string, error) {
	if len(uids) > l.MaxAddMembers {
		return nil, fmt.Errorf("%w: %d uids, max %d", ErrTooLarge, len(uids), l.MaxAddMembers)
	}
	distinct := make([]string, 0, len(uids))
	seen := make(map[string]struct{}, len(uids))
	for _, u := range uids {
		if err := ValidateID("uid", u, l.MaxUID); err != nil {
			return nil, err
		}
		if _, dup := seen[u]; !dup {
			seen[u] = struct{}{}
			distinct = append(distinct, u)
		}
	}
	return distinct, nil
}

// CheckRange checks the arguments of a Messages call (nothing negative,
// toSeq 0 or at least fromSeq; else ErrBadRequest) and returns the number
// of messages to read: limit, or MaxRange when limit is 0 or above it.
func (l Limits) CheckRange(fromSeq, toSeq int64, limit, maxBytes int) (int, error) {
	switch {
	case fromSeq < 0 || toSeq < 0 || limit < 0 || maxBytes < 0:
		return 0, fmt.Errorf("%w: negative range [%d, %d] limit %d max bytes %d", ErrBadRequest, fromSeq, toSeq, limit, maxBytes)
	case toSeq != 0 && toSeq < fromSeq:
		return 0, fmt.Errorf("%w: inverted range [%d, %d]", ErrBadRequest, fromSeq, toSeq)
	}
	if limit == 0 || limit > l.MaxRange {
		limit = l.MaxRange
	}
	return limit, nil
}

// CheckNewGroup checks a CreateGroup call's group and returns it as it is
// to be stored: gid 0 (to be assigned) or 1..MaxGID, state StateActive
// when empty, else a valid one; a name of at most MaxGroupNameBytes of
// UTF-8 text without NUL; an owner empty or a valid ID. Failures wrap
// ErrBadRequest.
func (l Limits) CheckNewGroup(g Group) (Group, error) {
	if g.GID < 0 || g.GID > l.MaxGID {
		return Group{}, fmt.Errorf("%w: gid %d outside 1..%d", ErrBadRequest, g.GID, l.MaxGID)
	}
	if g.State == "" {
		g.State = StateActive
	}
	if !g.State.Valid() {
		return Group{}, fmt.Errorf("%w: unknown group state %q", ErrBadRequest, g.State)
	}
	if len(g.Name) > MaxGroupNameBytes || !utf8.ValidString(g.Name) || strings.IndexByte(g.Name, 0) >= 0 {
		return Group{}, fmt.Errorf("%w: group name must be UTF-8 text of at most %d bytes", ErrBadRequest, MaxGroupNameBytes)
	}
	if g.Owner != "" {
		if err := ValidateID("owner", g.Owner, l.MaxUID); err != nil {
			return Group{}, err
		}
	}
	return g, nil
}

// MaxTier is the highest VIP tier a user row holds (0 = normal). It is the
// same number as gateway/auth.MaxTier and fanout/waitroom.MaxTier, which a
// test in cmd/fanfared holds equal (the bottom packages may not import
// each other).
const MaxTier = 3

// CheckTier refuses a VIP tier outside 0..MaxTier.
func CheckTier(tier int) error {
	if tier < 0 || tier > MaxTier {
		return fmt.Errorf("%w: tier %d, want 0..%d", ErrBadRequest, tier, MaxTier)
	}
	return nil
}
