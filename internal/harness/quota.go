package harness

import (
	"errors"
	"fmt"
)

// ErrQuota: a new conversation would pass a cap (MaxConversations,
// MaxConversationsPerUser, or the host's agent uids); the message says
// which. Existing conversations are unaffected.
var ErrQuota = errors.New("conversation quota reached")

// admitNew checks that a new conversation of userID fits the caps and
// returns a func to call once it is stored (or refused): creations of one
// worker are checked one at a time, so concurrent ones cannot pass a cap
// together. Replicas of a tenant-env count the same volume but do not
// serialize with each other; the control plane's quota is the exact one,
// this is its backstop.
func (h *Harness) admitNew(userID string) (done func(), err error) {
	h.createMu.Lock()
	done = h.createMu.Unlock
	maxAll, maxUser := h.cfg.MaxConversations, h.cfg.MaxConversationsPerUser
	if maxAll < 0 && maxUser < 0 {
		return done, nil
	}
	ids, err := h.store.List()
	if err != nil {
		done()
		return nil, err
	}
	if maxAll >= 0 && len(ids) >= maxAll {
		done()
		return nil, fmt.Errorf("%w: this tenant-env has %d conversations, the most allowed (TALKIDE_MAX_CONVERSATIONS_PER_TENANT_ENV); delete one first", ErrQuota, len(ids))
	}
	if maxUser < 0 || len(ids) < maxUser {
		return done, nil // fewer conversations in all than one user may have
	}
	n := 0
	for _, id := range ids {
		m, err := h.store.LoadMeta(id)
		if err == nil && m.UserID == userID {
			n++
		}
	}
	if n >= maxUser {
		done()
		return nil, fmt.Errorf("%w: you have %d conversations in this tenant-env, the most allowed (TALKIDE_MAX_CONVERSATIONS_PER_USER); delete one first", ErrQuota, n)
	}
	return done, nil
}
