package harness

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/talkide/talkide/internal/agentfs"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/sandbox"
	"github.com/talkide/talkide/internal/sessionstore"
)

// This file keeps single ownership (leases), recovery after crashes and
// hand-overs, the process cap, and shutdown.

// ownedLocked reports whether this process may still write the
// conversation's state: no lease is needed, or its lease is still trusted.
func (s *session) ownedLocked() bool {
	if s.gone {
		return false
	}
	return s.held == nil || s.held.Valid()
}

// renewLoop renews this process's replica lease every third of the lease
// duration: one write per period whatever the number of conversations it
// drives. When the trust lapses (no renewal in time) or the replica lease
// is lost, the Replica calls loseAll.
func (h *Harness) renewLoop(ctx context.Context) {
	every := h.replica.RenewEvery()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, every)
		err := h.replica.Heartbeat(rctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			h.log.Warn("renew the replica lease", "err", err)
		}
	}
}

// loseAll drops every loaded session that holds a lease: this process can
// no longer trust any of them (reason says why).
func (h *Harness) loseAll(reason error) {
	lost := 0
	for _, s := range h.loaded() {
		if s.held != nil {
			s.lose()
			lost++
		}
	}
	h.log.Error("replica lease not trusted; dropped every conversation this process drove", "count", lost, "err", reason)
}

// lose drops a session whose lease is gone: its process is killed without
// grace (another replica may already drive the conversation) and nothing
// more is written.
func (s *session) lose() {
	s.mu.Lock()
	p := s.proc
	s.unloadLocked()
	s.mu.Unlock()
	if p != nil {
		p.beginStop("lease_lost")
		p.kill()
	}
}

// unloadLocked removes the session from the harness and closes its log.
func (s *session) unloadLocked() {
	if s.gone {
		return
	}
	s.gone = true
	s.h.mu.Lock()
	if s.h.sessions[s.conv] == s {
		delete(s.h.sessions, s.conv)
	}
	s.h.mu.Unlock()
	s.log.Close()
	if s.queued {
		s.h.slots.dequeue(s)
		s.queued = false
	}
}

// maybeUnload releases the lease and unloads the session when nothing keeps
// it: no process, no turn, nothing queued, no follower, no request pinning
// it. The next request
// loads it again (on this or another replica). Until the lease is released,
// the conversation counts as loading, so a load of it in this process waits
// and never races the release (case W1).
func (s *session) maybeUnload() {
	s.mu.Lock()
	idle := !s.gone && s.proc == nil && s.meta.Turn == nil && len(s.meta.Pending) == 0 && s.followers == 0
	if !idle {
		s.mu.Unlock()
		return
	}
	h := s.h
	done := make(chan struct{})
	h.mu.Lock()
	if s.pins > 0 {
		// A request is about to use it; it unloads it when done.
		h.mu.Unlock()
		s.mu.Unlock()
		return
	}
	// Out of the map and marked loading in one step: a request finds it
	// loading (and waits) or pinned it before (and it stays).
	if h.sessions[s.conv] == s {
		delete(h.sessions, s.conv)
	}
	h.loading[s.conv] = done
	h.mu.Unlock()
	s.unloadLocked()
	s.mu.Unlock()
	if s.held != nil {
		if err := s.held.Release(context.Background()); err != nil {
			h.log.Warn("release conversation lease", "conversation", s.conv, "err", err)
		}
	}
	h.mu.Lock()
	if h.loading[s.conv] == done {
		delete(h.loading, s.conv)
	}
	h.mu.Unlock()
	close(done)
}

// recoverLocked runs when a session is loaded: it cleans up after a
// previous owner that died (this process's earlier incarnation, or another
// replica): a turn left running is failed (never re-run: the CLI may have
// acted on it), leftover CLI and tool processes of this host are killed, and
// stale CLI files are removed.
func (s *session) recoverLocked() {
	changed := false
	if pi := s.meta.Process; pi != nil {
		tmp := s.leftoverTmpDir(pi)
		if n := killByMarker(tmp); n > 0 {
			s.h.log.Warn("killed leftover processes of a crashed session", "conversation", s.conv, "pid", pi.PID, "count", n)
		}
		// The CLI's live-process registry entry of the dead process, in the
		// agent's config dir: removed without following a symlink the
		// agent may have put in place of sessions/.
		if d, err := agentfs.OpenRoot(s.h.cfg.ConfigDir); err == nil {
			_ = d.Remove(s.conv + "/sessions/" + strconv.Itoa(pi.PID) + ".json")
			d.Close()
		}
		s.meta.Process = nil
		changed = true
	}
	// The tmp dir's parent is the worker's; RemoveTree removes beneath it
	// by descriptors (unlinkat, openat O_NOFOLLOW), following no symlink
	// the agent left inside, however deep the agent made it.
	if err := sandbox.RemoveTree(s.tmpDir()); err != nil {
		s.h.log.Warn("remove the agent's tmp dir", "conversation", s.conv, "err", err)
	}
	if t := s.meta.Turn; t != nil && s.continueAfterCrashLocked(t) {
		s.h.log.Warn("turn cut by a worker crash while waiting for permission; continuing it", "conversation", s.conv, "message", t.ClientMessageID)
		changed = true
	} else if t != nil {
		s.h.log.Warn("turn cut by a worker crash", "conversation", s.conv, "message", t.ClientMessageID)
		s.emitLocked(contract.EventTurnFailed, contract.TurnFailed{ClientMessageID: t.ClientMessageID, Reason: contract.FailWorkerRestarted,
			Message: "the worker stopped during this turn; the conversation goes on from what was recorded, send the message again to retry"})
		s.meta.Turn = nil
		changed = true
	}
	if changed {
		_ = s.saveLocked()
	}
}

func (s *session) tmpDir() string { return filepath.Join(s.h.cfg.TmpRoot, s.conv) }

// killByMarker SIGKILLs every process on this host whose environment names
// tmpDir as CLAUDE_CODE_TMPDIR: the CLI of one conversation and everything
// it started, which inherits its environment. Process groups are not enough:
// the CLI starts each tool in a process group of its own. It returns how
// many processes it killed.
func killByMarker(tmpDir string) int {
	marker := []byte("CLAUDE_CODE_TMPDIR=" + tmpDir + "\x00")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pid == os.Getpid() {
			continue
		}
		env, err := readEnviron(e.Name())
		if err != nil || !bytes.Contains(env, marker) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// maxEnviron bounds how much of a process's environment killByMarker reads:
// an agent's process can make its environment as large as its stack limit
// allows, and the worker must not read that much for it. The CLI's own
// environment, where the marker is, is small.
const maxEnviron = 1 << 20

// readEnviron reads at most maxEnviron bytes of /proc/<pid>/environ.
func readEnviron(pid string) ([]byte, error) {
	f, err := os.Open(filepath.Join("/proc", pid, "environ"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxEnviron))
}

// Recover loads every conversation of the session volume that has work
// waiting or was cut by a crash (a queued message, a turn left running, a
// CLI process recorded) and that no live replica owns, cleans it up and
// starts its queued turns. It returns how many it loaded. Every
// RecoverInterval the harness does the same for the conversations the
// store's waiting index names (recoverWaiting), which is how conversations
// handed over by a replica that shut down or died get picked up.
func (h *Harness) Recover() (int, error) {
	ids, err := h.store.List()
	if err != nil {
		return 0, err
	}
	return h.recover(ids)
}

// recoverWaiting is Recover of the conversations the store's waiting index
// names (sessionstore.ListWaiting): every one whose state has work, without
// reading the state of every idle conversation. Conversations stored before
// the index existed were seen by the full Recover at start.
func (h *Harness) recoverWaiting() (int, error) {
	ids, err := h.store.ListWaiting()
	if err != nil {
		return 0, err
	}
	return h.recover(ids)
}

func (h *Harness) recover(ids []string) (int, error) {
	n, refused := 0, 0
	defer func() {
		if refused > 0 {
			h.log.Warn("conversations with waiting work not taken over yet: the worker is at a limit; retrying", "count", refused)
		}
	}()
	for _, id := range ids {
		h.mu.Lock()
		_, loaded := h.sessions[id]
		h.mu.Unlock()
		if loaded || h.isClosing() {
			continue
		}
		meta, err := h.store.LoadMeta(id)
		if errors.Is(err, sessionstore.ErrNotFound) {
			continue // deleted since it was listed
		}
		if err != nil {
			h.log.Error("load conversation state", "conversation", id, "err", err)
			continue
		}
		if len(meta.Pending) == 0 && meta.Turn == nil && meta.Process == nil {
			continue
		}
		s, err := h.session(id, "", "", false)
		if errors.Is(err, ErrNotOwner) {
			continue // a live replica has it
		}
		if errors.Is(err, ErrUnavailable) {
			refused++ // at a limit now: the next pass tries again
			continue
		}
		if err != nil {
			h.log.Error("recover conversation", "conversation", id, "err", err)
			continue
		}
		n++
		s.unpin()
		h.procs.Go(s.maybeUnload) // nothing queued after the cleanup: let it go again
	}
	return n, nil
}

func (h *Harness) recoverLoop(ctx context.Context) {
	t := time.NewTicker(h.cfg.RecoverInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := h.recoverWaiting(); err != nil {
			h.log.Error("recover conversations", "err", err)
		} else if n > 0 {
			h.log.Info("took over conversations with waiting work", "count", n)
		}
	}
}

// shutdown stops taking new turns, lets running turns finish within
// ShutdownGrace, interrupts the rest, stops every process and releases every
// lease. Queued messages stay stored for the next owner.
func (h *Harness) shutdown() {
	h.closing.Store(true)
	// Loads in progress end (with the session registered) before the
	// sessions are gathered below.
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		h.mu.Lock()
		n := len(h.loading)
		h.mu.Unlock()
		if n == 0 {
			break
		}
	}
	h.log.Info("shutting down: no new turns; waiting for running turns", "grace", h.cfg.ShutdownGrace.String())
	deadline := time.Now().Add(h.cfg.ShutdownGrace)
	for time.Now().Before(deadline) && h.runningTurns() > 0 {
		time.Sleep(100 * time.Millisecond)
	}
	for _, s := range h.loaded() {
		s.mu.Lock()
		s.interruptLocked()
		s.mu.Unlock()
	}
	for end := time.Now().Add(h.cfg.InterruptTimeout); time.Now().Before(end) && h.runningTurns() > 0; {
		time.Sleep(50 * time.Millisecond)
	}
	var wg sync.WaitGroup
	for _, s := range h.loaded() {
		wg.Go(func() { s.stopProcess("shutdown") })
	}
	wg.Wait()
	h.procs.Wait()
	for _, s := range h.loaded() {
		s.mu.Lock()
		s.unloadLocked()
		s.mu.Unlock()
	}
	// One write frees every conversation this process held.
	if h.replica != nil {
		if err := h.replica.Release(context.Background()); err != nil {
			h.log.Warn("release the replica lease", "err", err)
		}
	}
}

func (h *Harness) runningTurns() int {
	n := 0
	for _, s := range h.loaded() {
		s.mu.Lock()
		if s.meta.Turn != nil && s.proc != nil {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// slots caps live CLI processes. A session that cannot get a slot waits in
// FIFO order; a released slot is handed straight to the first waiter, so a
// newcomer cannot overtake it.
type slots struct {
	mu sync.Mutex
	// max is the cap; live counts slots held; waiting is the FIFO of
	// sessions waiting; all guarded by mu.
	max     int
	live    int
	waiting []*session
}

// acquire takes a slot for s if one is free and nobody waits.
func (sl *slots) acquire(s *session) bool {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.live < sl.max && len(sl.waiting) == 0 {
		sl.live++
		return true
	}
	for _, w := range sl.waiting {
		if w == s {
			return false
		}
	}
	sl.waiting = append(sl.waiting, s)
	return false
}

// status returns live, max and s's 1-based position in the queue (0 if not
// queued).
func (sl *slots) status(s *session) (live, max, pos int) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	for i, w := range sl.waiting {
		if w == s {
			pos = i + 1
		}
	}
	return sl.live, sl.max, pos
}

func (sl *slots) dequeue(s *session) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	for i, w := range sl.waiting {
		if w == s {
			sl.waiting = append(sl.waiting[:i], sl.waiting[i+1:]...)
			return
		}
	}
}

// release gives a slot back, or hands it to the first waiter.
func (sl *slots) release() {
	sl.mu.Lock()
	if len(sl.waiting) == 0 {
		sl.live--
		sl.mu.Unlock()
		return
	}
	next := sl.waiting[0]
	sl.waiting = sl.waiting[1:]
	sl.mu.Unlock()
	next.h.procs.Go(func() {
		next.mu.Lock()
		defer next.mu.Unlock()
		if next.gone || !next.queued {
			next.h.slots.release() // no longer wanted: pass it on
			return
		}
		next.slot, next.queued = true, false
		next.pumpLocked()
		if next.proc == nil {
			next.releaseSlotLocked() // nothing to run after all
		}
	})
}

// WaitingTurns returns how many conversations wait for a process slot.
func (h *Harness) WaitingTurns() int {
	h.slots.mu.Lock()
	defer h.slots.mu.Unlock()
	return len(h.slots.waiting)
}

// LiveProcesses returns how many process slots are held.
func (h *Harness) LiveProcesses() int {
	h.slots.mu.Lock()
	defer h.slots.mu.Unlock()
	return h.slots.live
}

func (s *session) releaseSlotLocked() {
	if s.slot {
		s.slot = false
		s.h.slots.release()
	}
}

// evictIdle stops the least recently active idle CLI process when sessions
// wait for a slot, so a waiting turn runs instead of an idle process
// holding memory. The stopped session resumes from its transcript later.
func (h *Harness) evictIdle() {
	if h.WaitingTurns() == 0 {
		return
	}
	var victim *session
	var victimProc *process
	var oldest time.Time
	for _, s := range h.loaded() {
		s.mu.Lock()
		if p := s.proc; p != nil && s.meta.Turn == nil && len(s.meta.Pending) == 0 && !p.stopping() {
			if victim == nil || p.lastActive.Before(oldest) {
				victim, victimProc, oldest = s, p, p.lastActive
			}
		}
		s.mu.Unlock()
	}
	if victim == nil {
		return // every process is busy: the waiters wait for a turn to end
	}
	victim.mu.Lock()
	ok := victim.proc == victimProc && victim.meta.Turn == nil && len(victim.meta.Pending) == 0
	if ok {
		victimProc.beginStop("evicted")
	}
	victim.mu.Unlock()
	if ok {
		h.log.Info("stopping an idle claude code process to make room", "conversation", victim.conv)
		victimProc.terminate(h.cfg.StopGrace)
	}
}
