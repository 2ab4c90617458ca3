// Package auth verifies and signs the user tokens of docs/protocol.md
// §2.1: JWTs with claims sub (uid), lvl (0 normal, 1..3 VIP;
// missing = 0) and exp, signed HS256 with the shared secret or RS256/EdDSA
// with configured keys.
//
// Invariants: a Verifier accepts only the algorithms its keys imply
// (HS256 for Config.Secret, RS256 for RSA keys, EdDSA for Ed25519 keys), so
// "alg":"none" and algorithm confusion (an HS256 token "signed" with a
// public key) are refused; exp is required; sub must be a usable uid; lvl
// must be an integer 0..3. Unknown claims are ignored, so tokens minted for
// other purposes (waiting-room access tokens with a room claim) verify too,
// as long as they carry sub and exp.
//
// HS256 tokens of the plain kind (compact JSON without escapes, integer
// times, aud a string) are verified by a fast path (hs256.go) that
// decides only what it decides exactly like golang-jwt and hands every
// other token to it, so acceptance and errors are golang-jwt's.
//
// Verifier and Signer are immutable after construction and safe for
// concurrent use; the package starts no goroutines.
//
// Access tokens of the waiting room are signed by fanout/waitroom with its
// own key: that package may not import gateway, so no room-specific code
// lives here.
package auth
