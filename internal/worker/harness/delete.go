package harness

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/sandbox"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// This file ends conversations for good (Delete) and keeps agent uids
// claimed only while their conversation exists.

// Delete ends conv and removes it from the session volume. Retention: the
// conversation keeps nothing on the worker. Its CLI process is stopped
// (a running turn ends, queued messages are dropped), every process of its
// agent uid is killed, its working directory, CLAUDE_CONFIG_DIR
// (transcripts), HOME and tmp dir are removed, its state and event log are
// removed, and its agent uid is released: only after its processes are gone
// and the files it owned in world-writable directories are removed (see
// sandbox.UIDRange.Release). Event streams of the conversation end. The
// control plane keeps its own records (activity, tool calls, usage, the
// budget ledger).
//
// Errors: ErrInvalid, ErrNotFound (no such conversation, or deleted
// before), *NotOwnerError (another replica owns it: forward), ErrUnavailable.
// An error after the state was removed (a uid that could not be released
// yet) leaves the uid claimed, which is safe; ReclaimOrphanUIDs retries.
func (h *Harness) Delete(conv string) (contract.SessionDeleted, error) {
	out := contract.SessionDeleted{ConversationID: conv}
	var s *session
	for range 3 {
		var err error
		s, err = h.session(conv, "", "", false)
		if errors.Is(err, ErrNotFound) {
			// Deleted before, perhaps cut short by a crash: finish that.
			if err := h.releaseUIDsOf(conv, nil); err != nil {
				h.log.Error("release agent uid of a deleted conversation", "conversation", conv, "err", err)
			}
			return out, ErrNotFound
		}
		if err != nil {
			return out, err
		}
		s.mu.Lock()
		if !s.gone {
			break
		}
		s.mu.Unlock()
		s.unpin()
		s = nil
	}
	if s == nil {
		return out, fmt.Errorf("%w: session reloaded repeatedly", ErrUnavailable)
	}
	// s.mu is held. No turn starts from now: nothing is queued, and the
	// follower count keeps the session loaded (maybeUnload leaves it).
	s.followers++
	s.unpin() // the follower count keeps it loaded from here
	s.meta.Pending = nil
	s.meta.Stopped = true
	_ = s.saveLocked()
	for s.proc != nil {
		s.mu.Unlock()
		s.stopProcess("stopped")
		s.mu.Lock()
	}
	s.followers--
	meta := *s.meta
	// The state goes first, while the session is still registered: a
	// request waiting for it then finds it gone and the conversation
	// missing, and nothing loads it again from the store. From here the
	// conversation does not exist, and a crash leaves at most an orphan uid
	// claim that ReclaimOrphanUIDs releases.
	if err := h.store.RemoveState(conv); err != nil {
		s.mu.Unlock()
		return out, err
	}
	s.unloadLocked()
	s.mu.Unlock()
	defer func() {
		if s.held == nil {
			return
		}
		// The conversation is gone for good: its lease goes too, so
		// deleted conversations leave no lease files or objects behind.
		if err := h.cfg.Leases.Forget(context.Background(), conv); err != nil {
			h.log.Warn("remove the deleted conversation's lease", "conversation", conv, "err", err)
			if err := s.held.Release(context.Background()); err != nil {
				h.log.Warn("release conversation lease", "conversation", conv, "err", err)
			}
		}
	}()

	if err := h.store.Delete(conv); err != nil {
		return out, err
	}
	if h.cfg.AgentUIDs == nil {
		var errs []error
		for _, d := range h.convDirs(conv) {
			// Agent-made trees, of any depth: RemoveTree.
			errs = append(errs, sandbox.RemoveTree(d))
		}
		if err := errors.Join(errs...); err != nil {
			return out, fmt.Errorf("remove the conversation's files: %w", err)
		}
		h.log.Info("conversation deleted", "conversation", conv)
		return out, nil
	}
	if err := h.releaseUIDsOf(conv, &meta); err != nil {
		return out, err
	}
	out.AgentUIDReleased = meta.AgentUID != 0
	h.log.Info("conversation deleted", "conversation", conv, "agent_uid", meta.AgentUID)
	return out, nil
}

// convDirs are the directories of conv the agent can write to, all under
// this worker's roots. Never the working directory a state file names: after
// the session volume moved, or in a restored copy beside the original, that
// path is not this conversation's to remove (workdir.go).
func (h *Harness) convDirs(conv string) []string {
	return []string{filepath.Join(h.cfg.WorkspaceRoot, conv), filepath.Join(h.cfg.ConfigDir, conv), filepath.Join(h.cfg.HomeDir, conv), filepath.Join(h.cfg.TmpRoot, conv)}
}

// releaseUIDsOf releases every agent uid claimed for conv (its stored one
// from meta, when given, and any other claim a crash left), removing its
// directories with them. Without AgentUIDs it removes the directories of
// a conversation whose state is gone.
func (h *Harness) releaseUIDsOf(conv string, meta *sessionstore.Meta) error {
	dirs := h.convDirs(conv)
	r := h.cfg.AgentUIDs
	if r == nil {
		return nil
	}
	claims, err := r.Claims()
	if err != nil {
		return err
	}
	uids := map[uint32]bool{}
	if meta != nil && meta.AgentUID != 0 {
		uids[meta.AgentUID] = true
	}
	for uid, owner := range claims {
		if owner == conv {
			uids[uid] = true
		}
	}
	var errs []error
	for uid := range uids {
		errs = append(errs, r.Release(conv, uid, dirs...))
	}
	return errors.Join(errs...)
}

// ReclaimOrphanUIDs releases the agent uids claimed on the session volume
// for conversations that no longer exist (a delete cut short by a crash, or
// a claim made just before a crash), with their files. It returns how many
// it released. A worker runs it at start.
func (h *Harness) ReclaimOrphanUIDs() (int, error) {
	r := h.cfg.AgentUIDs
	if r == nil {
		return 0, nil
	}
	claims, err := r.Claims()
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for uid, owner := range claims {
		if contract.ValidConversationID(owner) != nil {
			continue
		}
		if _, err := h.store.LoadMeta(owner); !errors.Is(err, sessionstore.ErrNotFound) {
			continue
		}
		if err := r.Release(owner, uid, h.convDirs(owner)...); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// agentUIDLocked gives s's conversation its agent uid: a new claim for a
// conversation without one, or the stored one held again (on this host
// too). A stored uid held by another conversation is refused: the agent
// never runs as another conversation's uid.
func (s *session) agentUIDLocked(r *sandbox.UIDRange) error {
	if s.meta.AgentUID != 0 {
		if err := r.Hold(s.conv, s.meta.AgentUID); err != nil {
			return fmt.Errorf("%w: the conversation's agent user: %v", ErrUnavailable, err)
		}
		return nil
	}
	uid, err := r.Claim(s.conv)
	if err != nil {
		if errors.Is(err, sandbox.ErrNoUID) {
			return fmt.Errorf("%w: no agent user id is free on this host (delete conversations)", ErrQuota)
		}
		return fmt.Errorf("give the conversation an agent user: %w", err)
	}
	s.meta.AgentUID = uid
	return s.h.store.SaveMeta(s.meta)
}
