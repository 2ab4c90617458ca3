// Package store defines fanfare's durable state: groups, members, users,
// messages and the tier-2 conversation index, behind the Store interface.
//
// Backends live in sub-packages (store/postgres, store/embedded) and all pass
// the one conformance suite in store/storetest, so their semantics cannot
// drift. This package owns the storage invariants of docs/architecture.md §1: dense,
// strictly increasing per-group seq allocated in the commit that stores the
// message; ack only after commit; idempotent sends by
// (gid, sender, client_msg_id); members see nothing below their join_seq.
//
// store imports none of fanfare's other packages.
package store
