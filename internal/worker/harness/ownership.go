package harness

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/agentfs"
	"github.com/talkide/talkide/internal/worker/sandbox"
	"github.com/talkide/talkide/internal/worker/sessionstore"
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
	// What the reader kept is stored while the session is still found
	// (dropped if it is no longer ours).
	s.commitLocked()
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
// lease. Queued messages stay stored for the next owner. stopRenewing ends
// the replica lease's renewal; it is called just before the release.
func (h *Harness) shutdown(stopRenewing func()) {
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
	stopRenewing()
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

// slots caps live CLI processes and shares them fairly between the users
// of the tenant-env (docs/sessions.md, "Fair share"):
//
//   - there are max slots, and one user holds at most perUser of them (its
//     idle processes count), so one user's long turns always leave a slot
//     to the others;
//   - a session that cannot get a slot (none free, or its user holds
//     perUser) waits. A freed slot goes to the waiter whose user holds the
//     fewest slots, ties by arrival, skipping users at perUser. A waiter's
//     rank counts its user's waiters ahead of it as held (they are served
//     first), so the position a waiter is told is the order it is served
//     in if nothing else changes;
//   - a freed slot is handed straight to the waiter it goes to: while a
//     slot is free, no waiter may take it (grantLocked keeps that), so a
//     newcomer that takes a free slot overtakes nobody.
type slots struct {
	mu sync.Mutex
	// max and perUser are the caps (perUser 0: max); live counts the slots
	// held (taken, or handed over and not yet taken), held counts them per
	// user and holders per session (one each at most); waiting holds the
	// waiters in order of arrival. All guarded by mu.
	max, perUser int
	live         int
	held         map[string]int
	holders      map[*session]*holding
	waiting      []waiter
}

// waiter is a session waiting for a slot, with its user.
type waiter struct {
	s    *session
	user string
}

// holding is a session's slot: the user it counts for, and whether the
// session took it (false while it is being handed over).
type holding struct {
	user  string
	taken bool
}

func (sl *slots) perUserLocked() int {
	if sl.perUser <= 0 || sl.perUser > sl.max {
		return sl.max
	}
	return sl.perUser
}

func (sl *slots) holdLocked(s *session, user string, taken bool) {
	if sl.held == nil {
		sl.held = make(map[string]int)
		sl.holders = make(map[*session]*holding)
	}
	sl.live++
	sl.held[user]++
	sl.holders[s] = &holding{user: user, taken: taken}
}

// acquire takes a slot for s: the one being handed to it, or a free one
// when s's user holds fewer than perUser; else s waits (once). The caller
// holds s.mu.
func (sl *slots) acquire(s *session) bool {
	user := s.meta.UserID
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if hd := sl.holders[s]; hd != nil {
		// Handed over to s and not taken yet: take it now (hand finds it
		// taken and does nothing).
		hd.taken = true
		return true
	}
	if slices.ContainsFunc(sl.waiting, func(w waiter) bool { return w.s == s }) {
		return false
	}
	if sl.live < sl.max && sl.held[user] < sl.perUserLocked() {
		sl.holdLocked(s, user, true)
		return true
	}
	sl.waiting = append(sl.waiting, waiter{s: s, user: user})
	return false
}

// ranksLocked returns each waiter's rank: the slots its user holds plus its
// user's waiters ahead of it. Waiters are served by rank, ties by arrival.
func (sl *slots) ranksLocked() []int {
	ahead := make(map[string]int)
	ranks := make([]int, len(sl.waiting))
	for i, w := range sl.waiting {
		ranks[i] = sl.held[w.user] + ahead[w.user]
		ahead[w.user]++
	}
	return ranks
}

// nextLocked returns the index in waiting of the waiter a freed slot goes
// to, or -1 when no waiter may take one (none waits, or every waiting
// user holds perUser). The first waiter by rank is its user's first, whose
// rank is what its user holds.
func (sl *slots) nextLocked() int {
	ranks := sl.ranksLocked()
	best := -1
	for i, r := range ranks {
		if best < 0 || r < ranks[best] {
			best = i
		}
	}
	if best < 0 || ranks[best] >= sl.perUserLocked() {
		return -1
	}
	return best
}

// grantLocked hands free slots to the waiters next in order, and returns
// them (the caller hands the slots over, see hand).
func (sl *slots) grantLocked() []waiter {
	var granted []waiter
	for sl.live < sl.max {
		i := sl.nextLocked()
		if i < 0 {
			break
		}
		w := sl.waiting[i]
		sl.waiting = slices.Delete(sl.waiting, i, i+1)
		sl.holdLocked(w.s, w.user, false)
		granted = append(granted, w)
	}
	return granted
}

// status returns live, max and s's 1-based position in the order waiters
// are served (0 if not waiting).
func (sl *slots) status(s *session) (live, max, pos int) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	ranks := sl.ranksLocked()
	for i, w := range sl.waiting {
		if w.s != s {
			continue
		}
		pos = 1
		for j, r := range ranks {
			if r < ranks[i] || r == ranks[i] && j < i {
				pos++
			}
		}
	}
	return sl.live, sl.max, pos
}

// dequeue removes s from the waiters (a slot being handed to it is given
// back by hand).
func (sl *slots) dequeue(s *session) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	sl.waiting = slices.DeleteFunc(sl.waiting, func(w waiter) bool { return w.s == s })
}

// release gives s's slot back and hands the freed slot to the waiter next
// in order, if any.
func (sl *slots) release(s *session) {
	for _, w := range sl.put(s) {
		w.s.h.procs.Go(func() { sl.hand(w.s) })
	}
}

// put gives s's slot back (nothing if it holds none) and returns the
// waiters granted a slot for it.
func (sl *slots) put(s *session) []waiter {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	hd := sl.holders[s]
	if hd == nil {
		return nil
	}
	delete(sl.holders, s)
	if sl.held[hd.user]--; sl.held[hd.user] <= 0 {
		delete(sl.held, hd.user)
	}
	sl.live--
	return sl.grantLocked()
}

// claim marks the slot handed to s taken; false when there is none to take
// (s took it itself in acquire, or gave it back).
func (sl *slots) claim(s *session) bool {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	hd := sl.holders[s]
	if hd == nil || hd.taken {
		return false
	}
	hd.taken = true
	return true
}

// hand gives next the slot granted to it and starts its turn.
func (sl *slots) hand(next *session) {
	next.mu.Lock()
	defer next.mu.Unlock()
	if !sl.claim(next) {
		return
	}
	if next.gone || !next.queued {
		sl.release(next) // no longer wanted: pass it on
		return
	}
	next.slot, next.queued = true, false
	next.pumpLocked()
	if next.proc == nil {
		next.releaseSlotLocked() // nothing to run after all
	}
}

// eviction reports whether stopping s's idle process would let a
// waiter run (its slot would go to one), and how many slots s's user
// holds.
func (sl *slots) eviction(s *session) (helps bool, held int) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	hd := sl.holders[s]
	if hd == nil || !hd.taken {
		return false, 0
	}
	held = sl.held[hd.user]
	// As put would: one slot fewer for the user, one more free.
	sl.held[hd.user]--
	helps = sl.nextLocked() >= 0
	sl.held[hd.user]++
	return helps, held
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
		s.h.slots.release(s)
	}
}

// evictIdle stops an idle CLI process when sessions wait for a slot, so a
// waiting turn runs instead of an idle process holding memory. Only a
// process whose slot would go to a waiter is stopped (a user at its
// per-user cap is helped only by stopping one of its own); among those, one
// of the user holding the most slots, the least recently active first. The
// stopped session resumes from its transcript later.
func (h *Harness) evictIdle() {
	if h.WaitingTurns() == 0 {
		return
	}
	var victim *session
	var victimProc *process
	var victimHeld int
	var oldest time.Time
	for _, s := range h.loaded() {
		s.mu.Lock()
		if p := s.proc; p != nil && s.meta.Turn == nil && len(s.meta.Pending) == 0 && !p.stopping() {
			helps, held := h.slots.eviction(s)
			if helps && (victim == nil || held > victimHeld || held == victimHeld && p.lastActive.Before(oldest)) {
				victim, victimProc, victimHeld, oldest = s, p, held, p.lastActive
			}
		}
		s.mu.Unlock()
	}
	if victim == nil {
		return // no idle process would make room: the waiters wait for a turn to end
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
