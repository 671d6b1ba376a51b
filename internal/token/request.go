package token

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrReplayed is returned by ReplayCache.Check for a token id already used.
var ErrReplayed = errors.New("token replayed")

// ErrRequestMismatch is returned by CheckRequest when a request token was
// signed for another method, path or body.
var ErrRequestMismatch = errors.New("token bound to another request")

// BodyHash returns the hex SHA-256 of body, as carried in Claims.BodySHA256.
func BodyHash(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// RequestClaims returns the claims binding a request token to one request of
// the worker of (tenant, env). path is the request URI (escaped path and query).
func RequestClaims(tenant, env, method, path string, body []byte) Claims {
	return Claims{Tenant: tenant, Env: env, Method: method, Path: path, BodySHA256: BodyHash(body)}
}

// CheckRequest reports whether c was signed for this method, path and body.
// The comparison is exact; it returns an error wrapping ErrRequestMismatch.
func CheckRequest(c *Claims, method, path string, body []byte) error {
	switch {
	case c.Method != method:
		return fmt.Errorf("%w: method %q", ErrRequestMismatch, c.Method)
	case c.Path != path:
		return fmt.Errorf("%w: path %q", ErrRequestMismatch, c.Path)
	case c.BodySHA256 != BodyHash(body):
		return fmt.Errorf("%w: body hash", ErrRequestMismatch)
	}
	return nil
}

// ReplayCache remembers token ids until their expiry so that a captured
// request token cannot be sent twice. Memory is bounded by the number of
// tokens issued within one TTL; expired ids are swept on insert.
type ReplayCache struct {
	now func() time.Time

	mu sync.Mutex
	// seen maps a token id to its expiry; guarded by mu.
	seen map[string]time.Time
	// nextSweep is when expired entries are next removed; guarded by mu.
	nextSweep time.Time
}

// NewReplayCache returns an empty cache.
func NewReplayCache() *ReplayCache {
	return &ReplayCache{now: time.Now, seen: make(map[string]time.Time)}
}

// Check records c's id and returns an error wrapping ErrReplayed if it was
// already recorded and has not expired.
func (r *ReplayCache) Check(c *Claims) error {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.After(r.nextSweep) {
		for id, exp := range r.seen {
			if now.After(exp) {
				delete(r.seen, id)
			}
		}
		r.nextSweep = now.Add(10 * time.Second)
	}
	if _, ok := r.seen[c.ID]; ok {
		return fmt.Errorf("%w: id %s", ErrReplayed, c.ID)
	}
	r.seen[c.ID] = c.ExpiresAt.Add(DefaultClockSkew)
	return nil
}
