package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/lease"
	"github.com/talkide/talkide/internal/worker/sandbox"
	"github.com/talkide/talkide/internal/worker/sessionstore"
	"github.com/talkide/talkide/internal/worker/streamjson"
)

// session is one conversation this worker process owns and has loaded.
type session struct {
	h    *Harness
	conv string
	log  *sessionstore.EventLog
	// held is the conversation's lease (nil without Leases).
	held *lease.Held

	mu sync.Mutex
	// meta is the durable state; every change is saved before it is acted
	// on. meta.Turn is the message whose turn runs; guarded by mu.
	meta *sessionstore.Meta
	// proc is the live CLI process, nil when none; guarded by mu.
	proc *process
	// gone is set when the session was unloaded (lease released or lost);
	// a caller holding a stale pointer must look the session up again;
	// guarded by mu.
	gone bool
	// followers counts connected event streams; guarded by mu.
	followers int
	// deferSync is set while handle stores a line's events with the
	// reader's next line at hand: their sync waits (emitAllLocked); guarded
	// by mu.
	deferSync bool
	// pins counts requests between finding the session (Harness.session)
	// and being done with it (unpin): an idle session is not unloaded
	// under a request about to use it; guarded by h.mu.
	pins int
	// slot is true while the session holds one of the MaxProcesses slots,
	// queued while it waits for one; guarded by mu.
	slot, queued bool
	// resolved remembers the ids of recently resolved permission requests
	// (to answer a late answer with 409); guarded by mu.
	resolved []string
	// workDir is the agent's working directory, under the workspace root;
	// empty, with workDirErr set, when the stored state was refused
	// (workdir.go). Set once at load.
	workDir    string
	workDirErr error
	// files is what the next CLI start needs from the agent's files, read
	// before the session takes a process slot (agentfiles.go); nil once a
	// start used it; guarded by mu.
	files *agentFiles
	// calls is what the live process's stdout showed of tool calls and
	// sub-agents (toolcalls.go); reset when the process is gone; guarded by
	// mu.
	calls toolCalls
}

// configDir is the conversation's CLAUDE_CONFIG_DIR (its transcripts) and
// homeDir its HOME: one each per conversation, so no agent can read
// another conversation's transcript.
func (s *session) configDir() string { return filepath.Join(s.h.cfg.ConfigDir, s.conv) }
func (s *session) homeDir() string   { return filepath.Join(s.h.cfg.HomeDir, s.conv) }

// agentUser is the account the conversation's agent runs as; nil: the
// worker's own.
func (s *session) agentUser() *sandbox.User {
	if s.h.cfg.AgentUIDs != nil && s.meta.AgentUID != 0 {
		return &sandbox.User{UID: s.meta.AgentUID, GID: s.meta.AgentUID}
	}
	return s.h.cfg.AgentUser
}

func (s *session) statusLocked() contract.SessionStatus {
	st := contract.SessionStatus{
		ConversationID: s.conv,
		UserID:         s.meta.UserID,
		State:          contract.StateIdle,
		SessionID:      s.meta.SessionID,
		WorkDir:        s.workDir,
		ProcessRunning: s.proc != nil,
		QueuedMessages: len(s.meta.Pending),
		LastEventID:    s.log.LastID(),
	}
	switch {
	case s.meta.Turn != nil:
		st.State = contract.StateRunning
	case s.meta.Stopped:
		st.State = contract.StateStopped
	}
	return st
}

// emitLocked appends an event to the log. A failed append (e.g. a full disk)
// is logged; the conversation goes on, and readers see the gap as missing ids
// never assigned (Append does not consume an id on failure).
func (s *session) emitLocked(t contract.EventType, payload any) {
	s.emitAllLocked(newEvent{t, payload})
}

// newEvent is an event to emit: its type and payload.
type newEvent struct {
	t       contract.EventType
	payload any
}

// emitAllLocked emits events as emitLocked does, stored with one write and
// one sync (each sync is a disk round trip a turn waits on). While the
// stdout reader has more lines at hand (deferSync), the sync waits for
// them (group commit, at most maxUnsynced events): under load one sync
// then stores many lines' events.
func (s *session) emitAllLocked(events ...newEvent) {
	if !s.ownedLocked() {
		for _, e := range events {
			s.h.log.Warn("event dropped: conversation no longer owned", "conversation", s.conv, "type", e.t)
		}
		return
	}
	evs := make([]contract.Event, 0, len(events))
	var err error
	for _, e := range events {
		var ev contract.Event
		if ev, err = contract.NewEvent(s.conv, e.t, e.payload); err != nil {
			break
		}
		evs = append(evs, ev)
	}
	if err == nil {
		_, err = s.log.Write(evs)
	}
	if err != nil {
		for _, e := range events {
			s.h.log.Error("append event", "conversation", s.conv, "type", e.t, "err", err)
		}
		return
	}
	if s.deferSync && s.log.Pending() < maxUnsynced {
		return
	}
	s.commitLocked()
}

// maxUnsynced bounds the events the stdout reader stores under one sync.
const maxUnsynced = 256

// commitLocked stores the events emitted without a sync (one write, one
// sync) and publishes them (readers, metrics, the report feed). A failed
// write or sync drops them, logged; so does a session no longer owned.
func (s *session) commitLocked() {
	if !s.ownedLocked() {
		// Another replica may own the log by now: what this one kept is
		// never written.
		for _, ev := range s.log.Discard() {
			s.h.log.Warn("event dropped: conversation no longer owned", "conversation", s.conv, "type", ev.Type)
		}
		return
	}
	evs, err := s.log.Commit()
	if err != nil {
		for _, ev := range evs {
			s.h.log.Error("append event", "conversation", s.conv, "type", ev.Type, "err", err)
		}
		return
	}
	m := s.h.metrics.Load()
	if m != nil && len(evs) > 0 {
		m.syncs.Inc()
	}
	for _, ev := range evs {
		if m != nil {
			m.observe(ev)
		}
		if s.h.cfg.OnEvent != nil {
			s.h.cfg.OnEvent(ev)
		}
	}
}

// commitEvents is commitLocked for the stdout reader, before it waits
// for the CLI's next line.
func (s *session) commitEvents() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commitLocked()
}

func (s *session) saveLocked() error {
	if !s.ownedLocked() {
		return fmt.Errorf("save state of %s: %w", s.conv, ErrNotOwner)
	}
	s.commitLocked() // the state never runs ahead of the events before it
	if err := s.h.store.SaveMeta(s.meta); err != nil {
		s.h.log.Error("save session state", "conversation", s.conv, "err", err)
		// The cause names the worker's volume and files: it goes to the log
		// only; the browser learns what it means for the conversation.
		s.emitLocked(contract.EventError, contract.ErrorEvent{Code: "storage_error", Message: "the worker could not save this conversation's state; what happens next may be lost if the worker restarts (the worker's log has the cause)"})
		return err
	}
	if m := s.h.metrics.Load(); m != nil {
		m.saves.Inc()
	}
	return nil
}

// enqueueLocked stores a message in the queue and starts its turn if it can.
func (s *session) enqueueLocked(req contract.SendMessageRequest) (contract.SendMessageResponse, error) {
	if req.UserID != s.meta.UserID {
		return contract.SendMessageResponse{}, ErrUserMismatch
	}
	resp := contract.SendMessageResponse{ClientMessageID: req.ClientMessageID}
	if seen, same := s.meta.HasAccepted(req.ClientMessageID, req.Text); seen {
		if !same {
			return contract.SendMessageResponse{}, fmt.Errorf("%w: client_message_id %s was used for another text", ErrConflict, req.ClientMessageID)
		}
		resp.Duplicate = true
		return resp, nil
	}
	prev := *s.meta
	s.meta.Accept(req.ClientMessageID, req.Text)
	s.meta.Stopped = false
	msg := sessionstore.PendingMessage{ClientMessageID: req.ClientMessageID, Text: req.Text, AcceptedAt: time.Now().UTC()}
	// A message to a warm, idle agent is accepted and its turn begun with
	// one save instead of two (each is a state file written and synced):
	// what a crash between them could tell apart is a turn not yet
	// written to the agent, which recovery ends as cut either way.
	atOnce := s.canBeginLocked() && len(s.meta.Pending) == 0 && s.proc != nil
	if atOnce {
		s.meta.Turn = &msg
	} else {
		s.meta.Pending = append(s.meta.Pending, msg)
	}
	if err := s.saveLocked(); err != nil {
		*s.meta = prev // not stored: not accepted
		return contract.SendMessageResponse{}, fmt.Errorf("store message: %w", err)
	}
	accepted := newEvent{contract.EventUserMessage, contract.UserMessage{ClientMessageID: req.ClientMessageID, Text: req.Text}}
	if atOnce {
		s.beginTurnLocked(msg, accepted)
	} else {
		s.emitAllLocked(accepted)
		s.pumpLocked()
	}
	return resp, nil
}

// canBeginLocked reports whether a turn may begin now: none runs, the
// worker is not shutting down, the session is this worker's, and its
// agent (if it has one) is not being stopped.
func (s *session) canBeginLocked() bool {
	return s.meta.Turn == nil && !s.h.isClosing() && s.ownedLocked() && (s.proc == nil || !s.proc.stopping())
}

// pumpLocked starts the next queued turn if none runs, the worker is not
// shutting down, and a process slot is free (else the session queues for
// one and is pumped again when it gets it).
func (s *session) pumpLocked() {
	for len(s.meta.Pending) > 0 && s.canBeginLocked() {
		if s.proc == nil {
			// The agent's files are read before taking a slot: never while
			// holding what other conversations wait for.
			s.prepareStartLocked()
			if !s.slot {
				if !s.h.slots.acquire(s) {
					if !s.queued {
						s.queued = true
						live, max, pos := s.h.slots.status(s)
						s.emitLocked(contract.EventTurnQueued, contract.TurnQueued{
							ClientMessageID: s.meta.Pending[0].ClientMessageID, Position: pos, LiveProcesses: live, MaxProcesses: max})
						s.h.procs.Go(s.h.evictIdle)
					}
					return // slots.release hands us a slot and pumps again
				}
				s.slot, s.queued = true, false
			}
			p, err := s.startLocked()
			s.files = nil
			if err != nil {
				next := s.meta.Pending[0]
				s.meta.Pending = s.meta.Pending[1:]
				_ = s.saveLocked()
				s.h.log.Error("start claude code", "conversation", s.conv, "err", err)
				s.emitLocked(contract.EventTurnFailed, contract.TurnFailed{
					ClientMessageID: next.ClientMessageID, Reason: contract.FailStartFailed,
					Message: startFailedMessage(err),
				})
				s.releaseSlotLocked()
				continue
			}
			s.proc, s.calls = p, toolCalls{}
		}
		next := s.meta.Pending[0]
		s.meta.Pending = s.meta.Pending[1:]
		s.meta.Turn = &next
		if err := s.saveLocked(); err != nil {
			// Not stored: do not run it (a restart would not know of it).
			s.meta.Turn = nil
			s.meta.Pending = append([]sessionstore.PendingMessage{next}, s.meta.Pending...)
			return
		}
		s.beginTurnLocked(next)
		return
	}
}

// beginTurnLocked announces the stored turn t (s.meta.Turn), after the
// events before (stored with it), and writes its message to the running
// agent.
func (s *session) beginTurnLocked(t sessionstore.PendingMessage, before ...newEvent) {
	s.proc.stopIdleTimer()
	s.emitAllLocked(append(before, newEvent{contract.EventTurnStarted, contract.TurnStarted{ClientMessageID: t.ClientMessageID, Continued: t.Continuation}})...)
	select {
	case s.proc.turnStarted <- struct{}{}:
	default:
	}
	if !s.proc.send(streamjson.UserInput(t.Text, "")) {
		s.h.log.Error("claude code stdin blocked; stopping it", "conversation", s.conv)
		s.proc.beginStop("exited")
		p := s.proc
		s.h.procs.Go(func() { p.terminate(s.h.cfg.StopGrace) })
	}
}

// resumeMode decides how to start the CLI for the session: resume when its
// transcript holds a turn; else start it under its id, or under a fresh id
// when a transcript without a turn already uses that id (the CLI refuses
// --session-id for an id in use), or when the file standing there was
// refused (a link, a FIFO, not the agent's: see agentfiles.go).
func (s *session) resumeModeLocked() (resume bool) {
	f := s.filesLocked()
	// The CLI's cumulative cost starts from the transcript's last cost-state
	// record (written when a process ends cleanly; a crash leaves an older
	// one), so per-turn costs are measured from there.
	s.meta.CLITotalCostUSD = f.cost
	switch {
	case f.hasTurn:
		return true
	case f.found:
		if f.transcriptErr != nil {
			s.transcriptRefusedLocked()
		}
		old := s.meta.SessionID
		s.meta.SessionID = uuid.NewString()
		s.h.log.Warn("transcript without a turn; starting a fresh session id", "conversation", s.conv, "old_session", old, "session", s.meta.SessionID)
		_ = s.saveLocked()
	}
	return false
}

// handle processes one stdout line of p.
//
// more says the reader has the CLI's next line at hand: the events of this
// one may wait for its sync (emitAllLocked).
func (s *session) handle(p *process, m streamjson.Message, more bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deferSync = more
	defer func() { s.deferSync = false }()
	if s.proc != p {
		return // a line from a process already replaced
	}
	switch m := m.(type) {
	case *streamjson.SystemInit:
		if !p.announced {
			p.announced = true
			s.emitLocked(contract.EventSessionStarted, contract.SessionStarted{
				SessionID: m.SessionID, Model: m.Model, WorkDir: m.Cwd, Resumed: p.resumed,
				ClaudeCodeVersion: m.ClaudeCodeVersion,
			})
		}
		if m.SessionID != "" && m.SessionID != s.meta.SessionID {
			s.h.log.Warn("claude code reports another session id", "conversation", s.conv, "session", s.meta.SessionID, "reported", m.SessionID)
		}
	case *streamjson.Assistant:
		parent := parentOf(m.ParentToolUseID)
		if s.meta.Turn != nil {
			p.noteRequest(m.RequestID)
		}
		if m.IsAPIErrorMessage {
			if parent == "" { // a sub-agent's failure reaches the main agent as its Agent call's result
				p.apiError = joinText(m.Message.Blocks())
			}
			return
		}
		for _, b := range m.Message.Blocks() {
			switch b.Type {
			case "text":
				// A sub-agent's text is left out: its final report is the
				// Agent call's tool_result, and the CLI prints the rest
				// only for sub-agents run in the background.
				if parent == "" && strings.TrimSpace(b.Text) != "" {
					s.emitLocked(contract.EventAssistantText, contract.AssistantText{MessageID: m.Message.ID, Text: b.Text})
				}
			case "tool_use":
				if u, ok := s.calls.use(b.ID, b.Name, b.Input, parent, m.AgentID); ok {
					s.emitLocked(contract.EventToolUse, u)
				}
			}
		}
	case *streamjson.User:
		if m.IsReplay {
			return
		}
		// A sub-agent's user lines are its prompt (already in the Agent
		// call's input) and its tool results.
		for _, b := range m.Message.Blocks() {
			if b.Type == "tool_result" {
				s.emitLocked(contract.EventToolResult, s.calls.result(b, parentOf(m.ParentToolUseID)))
			}
		}
	case *streamjson.TaskStarted:
		s.calls.agentStarted(m.TaskID, m.ToolUseID)
	case *streamjson.TaskNotification:
		s.calls.agentEnded(m.TaskID)
	case *streamjson.APIRetry:
		ev := contract.APIRetry{Attempt: m.Attempt, MaxRetries: m.MaxRetries, RetryDelayMS: m.RetryDelayMS, Error: m.Error}
		if m.ErrorStatus != nil {
			ev.ErrorStatus = *m.ErrorStatus
		}
		s.emitLocked(contract.EventAPIRetry, ev)
	case *streamjson.Result:
		s.finishTurnLocked(p, m)
	case *streamjson.ControlRequest:
		switch {
		case s.mcpControlLocked(p, m):
		case m.Subtype() == "can_use_tool":
			ask := s.h.cfg.PermissionPolicy == PolicyAsk
			// The client sees the call before any request about it.
			if u, ok := s.calls.asked(m); ok {
				s.emitLocked(contract.EventToolUse, u)
			}
			if ask {
				s.askToUseToolLocked(p, m)
			} else {
				// Allowed without asking: the call, and what the CLI said
				// before it, are stored before the tool runs.
				s.commitLocked()
				p.send(answerControl(m))
			}
		default:
			p.send(answerControl(m))
		}
	case *streamjson.ControlResponse:
		s.controlResponseLocked(m)
	}
}

func (s *session) finishTurnLocked(p *process, r *streamjson.Result) {
	msgID := ""
	if s.meta.Turn != nil {
		msgID = s.meta.Turn.ClientMessageID
	}
	usage := contract.Usage{
		InputTokens: r.Usage.InputTokens, OutputTokens: r.Usage.OutputTokens,
		CacheCreationInputTokens: r.Usage.CacheCreationInputTokens, CacheReadInputTokens: r.Usage.CacheReadInputTokens,
	}
	turnCost := r.TotalCostUSD - s.meta.CLITotalCostUSD
	if turnCost < 0 {
		turnCost = r.TotalCostUSD
	}
	s.meta.CLITotalCostUSD = r.TotalCostUSD
	if !r.IsError {
		s.emitLocked(contract.EventTurnCompleted, contract.TurnCompleted{
			ClientMessageID: msgID, Result: r.Result, Usage: usage,
			CostNanoUSD: int64(math.Round(turnCost * 1e9)), DurationMS: r.DurationMS,
			NumTurns: r.NumTurns, StopReason: r.StopReason, RequestIDs: p.requests,
		})
	} else {
		f := contract.TurnFailed{ClientMessageID: msgID, Usage: usage, Message: r.Result, RequestIDs: p.requests}
		switch {
		case r.TerminalReason == "api_error" || r.APIErrorStatus != nil:
			f.Reason = contract.FailAPIError
			if r.APIErrorStatus != nil {
				f.APIErrorStatus = *r.APIErrorStatus
			}
			if f.Message == "" {
				f.Message = p.apiError
			}
		case strings.HasPrefix(r.TerminalReason, "aborted"):
			f.Reason = contract.FailInterrupted
			// The CLI's result holds diagnostics ("[ede_diagnostic] ..."),
			// not words for the user.
			f.Message = "the turn was interrupted"
			// What the turn detached (setsid, nohup) stops with it.
			s.killOrphansAfterInterrupt(p)
		case r.Subtype == "error_max_turns" || r.TerminalReason == "max_turns":
			f.Reason = contract.FailMaxTurns
		default:
			f.Reason = contract.FailExecution
		}
		if f.Message == "" && len(r.Errors) > 0 {
			f.Message = strings.Join(r.Errors, "; ")
		}
		s.emitLocked(contract.EventTurnFailed, f)
	}
	p.apiError, p.requests = "", nil
	p.lastActive = time.Now()
	p.stopInterruptTimer()
	s.endPermissionsLocked()
	s.meta.Turn = nil
	_ = s.saveLocked()
	s.pumpLocked()
	if s.meta.Turn == nil {
		p.armIdleTimer(s.h.cfg.IdleTimeout, func() { s.stopIfIdle(p) })
		if s.h.WaitingTurns() > 0 {
			s.h.procs.Go(s.h.evictIdle) // this process is idle now: make room for a waiting turn
		}
	}
}

// answerControl answers a control request of the CLI. Permission prompts are
// allowed with the input unchanged; hook callbacks continue; anything else
// is refused with an error the CLI reports.
func answerControl(m *streamjson.ControlRequest) []byte {
	switch m.Subtype() {
	case "can_use_tool":
		var req struct {
			Input     json.RawMessage `json:"input"`
			ToolUseID string          `json:"tool_use_id"`
		}
		_ = json.Unmarshal(m.Request, &req)
		if len(req.Input) == 0 {
			req.Input = json.RawMessage("{}")
		}
		return streamjson.ControlSuccess(m.RequestID, map[string]any{
			"behavior": "allow", "updatedInput": req.Input, "toolUseID": req.ToolUseID,
		})
	case "hook_callback":
		var req struct {
			CallbackID string `json:"callback_id"`
		}
		_ = json.Unmarshal(m.Request, &req)
		if req.CallbackID == askHookID {
			return streamjson.ControlSuccess(m.RequestID, askHookAnswer)
		}
		return streamjson.ControlSuccess(m.RequestID, map[string]any{"continue": true})
	default:
		return streamjson.ControlError(m.RequestID, "unsupported control request "+m.Subtype())
	}
}

func joinText(blocks []streamjson.ContentBlock) string {
	var parts []string
	for _, b := range blocks {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// exited is called once p has been reaped.
func (s *session) exited(p *process) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != p {
		return
	}
	s.proc = nil
	s.calls = toolCalls{}
	s.h.proxy.Unregister(s.conv)
	p.stopInterruptTimer()
	s.meta.Process = nil
	reason := p.stopReason()
	if reason == "" {
		reason = "exited"
	}
	if s.meta.Turn != nil {
		f := contract.TurnFailed{ClientMessageID: s.meta.Turn.ClientMessageID, Reason: contract.FailProcessExited,
			Message: fmt.Sprintf("the agent process ended (exit code %d) before the turn finished", p.exitCode), RequestIDs: p.requests}
		switch reason {
		case "stopped", "shutdown":
			f.Reason = contract.FailInterrupted
			f.Message = "the session was stopped (" + reason + ") during the turn"
		case "interrupt_timeout":
			f.Reason = contract.FailInterrupted
			f.Message = "the turn did not end within the interrupt timeout; its process was killed"
		}
		if tail := p.stderrTail(); tail != "" {
			f.Message += ": " + tail
		}
		s.endPermissionsLocked()
		s.emitLocked(contract.EventTurnFailed, f)
		s.meta.Turn = nil
	}
	s.emitLocked(contract.EventSessionStopped, contract.SessionStopped{Reason: reason, ExitCode: p.exitCode})
	if reason == "stopped" {
		for _, m := range s.meta.Pending {
			s.emitLocked(contract.EventTurnFailed, contract.TurnFailed{ClientMessageID: m.ClientMessageID,
				Reason: contract.FailInterrupted, Message: "the session was stopped before this message ran"})
		}
		s.meta.Pending = nil
	}
	_ = s.saveLocked()
	s.releaseSlotLocked()
	s.pumpLocked()
	if s.proc == nil && s.meta.Turn == nil && len(s.meta.Pending) == 0 {
		s.h.procs.Go(s.maybeUnload)
	}
}

// interruptLocked asks the running turn to stop: a control interrupt to the
// CLI, and a timer that kills the process if the turn has not ended within
// InterruptTimeout, so an interrupt never hangs.
func (s *session) interruptLocked() bool {
	if s.meta.Turn == nil || s.proc == nil {
		return false
	}
	p := s.proc
	p.send(streamjson.ControlRequestLine("interrupt-"+uuid.NewString(), "interrupt", nil))
	if p.mcp != nil {
		// A hosted tool call in flight (a build) stops with the turn.
		p.mcp.cancelCalls()
	}
	p.armInterruptTimer(s.h.cfg.InterruptTimeout, func() {
		s.mu.Lock()
		still := s.proc == p && s.meta.Turn != nil
		if still {
			p.beginStop("interrupt_timeout")
		}
		s.mu.Unlock()
		if still {
			s.h.log.Warn("interrupted turn did not end in time; killing its process", "conversation", s.conv)
			p.kill()
		}
	})
	return true
}

// stop stops the process and marks the session stopped.
func (s *session) stop() {
	s.mu.Lock()
	s.meta.Stopped = true
	_ = s.saveLocked()
	s.mu.Unlock()
	s.stopProcess("stopped")
}

// stopProcess ends the live process, if any, for reason and waits until it
// is reaped.
func (s *session) stopProcess(reason string) {
	s.mu.Lock()
	p := s.proc
	if p != nil {
		p.beginStop(reason)
	}
	s.mu.Unlock()
	if p != nil {
		p.terminate(s.h.cfg.StopGrace)
	}
}

func (s *session) stopIfIdle(p *process) {
	s.mu.Lock()
	idle := s.proc == p && s.meta.Turn == nil && len(s.meta.Pending) == 0
	if idle {
		p.beginStop("idle")
	}
	s.mu.Unlock()
	if idle {
		s.h.log.Info("stopping idle claude code process", "conversation", s.conv)
		p.terminate(s.h.cfg.StopGrace)
	}
}

// unpin ends a request's use of the session (see session.pins).
func (s *session) unpin() {
	s.h.mu.Lock()
	s.pins--
	s.h.mu.Unlock()
}

// startFailedMessage tells the browser why a turn could not start without
// the cause's internals (paths, binaries, system errors), which the
// worker's log has: a worker at its limits says so, anything else is the
// platform's fault.
func startFailedMessage(err error) string {
	var refused *startRefused
	if errors.As(err, &refused) {
		return refused.msg
	}
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOSPC) ||
		errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EAGAIN) {
		return "the agent could not be started: the worker is at one of its limits (open files, disk, memory or processes); send the message again shortly"
	}
	return "the agent could not be started because of a fault on the worker (its log has the cause); send the message again, and tell the operator if it keeps failing"
}
