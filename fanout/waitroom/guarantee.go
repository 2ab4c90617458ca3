package waitroom

import (
	"crypto/rand"
	"encoding/binary"
	"math"
	"time"
)

// The max-wait guarantee by construction (the proof is in doc.go,
// "Max-wait guarantee"). Both backends compute the same numbers from
// these functions: the Redis scripts get Capacity and VIPReserve as
// arguments, so no floating-point formula is written twice.

// GuaranteeTick is the longest interval between two admission steps the
// guarantee assumes (the Manager's default Tick; the simulation's Step).
const GuaranteeTick = 100 * time.Millisecond

// GuaranteeRate is the admission rate the guarantee counts on: AdmitRate,
// or, when the token bucket is too small to carry a step's refill over the
// next whole token (AdmitBurst < 1 + AdmitRate*GuaranteeTick, e.g. the
// default burst of rooms below ~1.1/s, or a burst below a tick's worth), the
// rate of the worst cycle: the bucket fills (AdmitBurst/AdmitRate), waits up
// to a tick at its cap, and the step admits floor(AdmitBurst):
// floor(B) / (B/AdmitRate + tick); 1/(1/AdmitRate + tick) for B = 1.
func GuaranteeRate(cfg *RoomConfig) float64 {
	r, b, tick := cfg.AdmitRate, cfg.AdmitBurst, GuaranteeTick.Seconds()
	if b < float64(1+float64(r*tick)) {
		r = math.Floor(b) / float64(b/r+tick)
	}
	return r
}

// Capacity is C, the admissions the room can promise to anyone within
// MaxWait: floor(GuaranteeRate * (MaxWait - 1 s)). The second taken off
// covers the whole-second join clock (a user who arrives at 10.9 s has join
// 10 s, so 0.9 s of its MaxWait has already gone).
func Capacity(cfg *RoomConfig) int64 {
	w := float64(maxWaitS(cfg) - 1)
	return int64(math.Floor(float64(GuaranteeRate(cfg) * w)))
}

// VIPReserve is the part of Capacity a normal entrant must leave free for
// VIPs who may still arrive and pass it: floor(min(VIPShareCap, 1/2) *
// Capacity) (the share of the queue VIPs may hold, but never more than half
// of the capacity, so a room with vip_share_cap 1 still takes normal users).
// A normal user is admitted to the queue only while at least that many
// passes are still possible for everyone behind the owed admissions; a VIP
// needs no reserve for itself (see doc.go).
func VIPReserve(cfg *RoomConfig) int64 {
	return int64(math.Floor(float64(min(cfg.VIPShareCap, 0.5) * float64(Capacity(cfg)))))
}

// FullRetry is the honest retry hint of a room_full refusal by the
// guarantee: short admissions (the owed users who must be admitted before
// a place opens) at the guarantee rate, rounded up to whole seconds, at
// least 1 s and at most MaxWait.
func FullRetry(cfg *RoomConfig, short int64) time.Duration {
	s := math.Ceil(float64(short) / GuaranteeRate(cfg))
	d := time.Duration(s) * time.Second
	return min(max(d, time.Second), cfg.MaxWait)
}

// ViolationSlackS is how late (in whole seconds of the backend clock) an
// admission may come after max(join, return) + MaxWait before it counts as a
// max-wait violation: one admission interval (at most GuaranteeTick) plus the
// rounding of the whole-second clock, i.e. 1 s.
const ViolationSlackS = 1

// late reports whether an admission at now of a user with effective join
// join, back from away at back (0 = never), broke the max-wait promise.
func late(cfg *RoomConfig, join, back, now int64) bool {
	return now-max(join, back) > maxWaitS(cfg)+ViolationSlackS
}

// ShuffleKey is a uniformly random key in [0, 1) with 53 random bits
// (crypto/rand): the pre-queue of a scheduled room is admitted in the order
// of these keys, i.e. in a uniformly random order (two keys collide with
// probability about n^2/2^54, and a collision is broken by uid).
func ShuffleKey() float64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("waitroom: crypto/rand: " + err.Error()) // crypto/rand.Read never fails on supported platforms
	}
	return float64(binary.BigEndian.Uint64(b[:])>>11) / (1 << 53)
}
