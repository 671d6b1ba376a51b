package harness

import (
	"errors"
	"fmt"
	"time"
)

// quotaRecount is how old a conversation count admitNew may use far from
// the caps; quotaMargin is how far from a cap counts as near.
const (
	quotaRecount = time.Second
	quotaMargin  = 100
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
	// Listing the volume stats every conversation's state: with many
	// conversations that made each create slower than the last. Far from
	// the caps a count at most quotaRecount old does (plus the creates of
	// this process since); near a cap, and for the per-user count, the
	// volume is listed.
	est := h.quotaCount + h.quotaCreated
	near := (maxAll >= 0 && est+quotaMargin >= maxAll) || (maxUser >= 0 && est+quotaMargin >= maxUser)
	if !near && time.Since(h.quotaAt) < quotaRecount {
		h.quotaCreated++ // a create that fails still counts until the next recount: on the safe side
		return done, nil
	}
	ids, err := h.store.List()
	if err != nil {
		done()
		return nil, err
	}
	h.quotaCount, h.quotaCreated, h.quotaAt = len(ids), 1, time.Now() // 1: this create, if admitted
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
