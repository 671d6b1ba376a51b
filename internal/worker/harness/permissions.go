package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/sessionstore"
	"github.com/talkide/talkide/internal/worker/streamjson"
)

// This file handles the CLI's permission requests (can_use_tool). With
// policy "allow" every request is allowed at once. With "ask" each becomes
// a permission_requested event the control plane answers over HTTP; an
// unanswered request is denied after PermissionTimeout. A request pending
// when the worker dies is raised again after the restart: the cut turn goes
// on (a continuation message asks the agent to retry the call) and the
// answer to the original request id applies to the repeated call.

// Permission policies (Config.PermissionPolicy).
const (
	PolicyAllow = "allow"
	PolicyAsk   = "ask"
)

// Errors of AnswerPermission.
var (
	// ErrPermissionResolved: the permission request was already answered,
	// timed out, or its turn ended.
	ErrPermissionResolved = errors.New("permission request already resolved")
	// ErrPermissionNotFound: the conversation has no such request.
	ErrPermissionNotFound = errors.New("permission request not found")
)

// With the "ask" policy the harness also registers askHookID as the CLI's
// PreToolUse hook for Bash (in the initialize request) and answers it with
// askHookAnswer: "ask", so that every shell command becomes a permission
// request, including those the CLI would run without asking (read-only
// ones such as git status, ls or cat). Those are not safe to run unasked:
// they run what the agent wrote (a repository setting that runs a program,
// a shell start-up file, the shell snapshot the CLI sources before every
// command), so "nothing the agent writes runs a command nobody approved"
// needs each of them approved.
const askHookID = "talkide-ask-every-command"

// askHookTools is the hook's matcher: the shell, and the worktree tools,
// which run git (with the agent's settings) without asking.
const askHookTools = "Bash|EnterWorktree|ExitWorktree"

var askHookAnswer = map[string]any{"continue": true, "hookSpecificOutput": map[string]any{
	"hookEventName": "PreToolUse", "permissionDecision": "ask",
	"permissionDecisionReason": "every shell command is approved by the user (TALKIDE_PERMISSION_POLICY=ask)",
}}

// maxResolved bounds the remembered ids of resolved requests (for 409s).
const maxResolved = 256

// askToUseToolLocked turns the CLI's can_use_tool request m into a stored
// permission request and raises it to the user (TALKIDE_PERMISSION_POLICY=ask).
func (s *session) askToUseToolLocked(p *process, m *streamjson.ControlRequest) {
	var req struct {
		ToolName    string          `json:"tool_name"`
		Input       json.RawMessage `json:"input"`
		ToolUseID   string          `json:"tool_use_id"`
		Description string          `json:"description"`
	}
	_ = json.Unmarshal(m.Request, &req)
	if len(req.Input) == 0 {
		req.Input = json.RawMessage("{}")
	}
	// A call repeated by a turn continued after a restart takes over the
	// request raised again for it.
	for i := range s.meta.Permissions {
		pr := &s.meta.Permissions[i]
		if pr.CLIRequestID == "" && pr.ToolName == req.ToolName && sameJSON(pr.Input, req.Input) {
			pr.CLIRequestID, pr.ToolUseID = m.RequestID, req.ToolUseID
			_ = s.saveLocked()
			if pr.Answer != "" {
				s.answerCLILocked(*pr, pr.Answer, "the user denied this tool call")
				s.dropPermissionLocked(pr.RequestID)
			}
			return
		}
	}
	pr := sessionstore.PermissionRequest{
		RequestID: "perm_" + token.NewID()[:20], CLIRequestID: m.RequestID, ToolName: req.ToolName,
		ToolUseID: req.ToolUseID, Input: req.Input, Description: req.Description,
		ExpiresAt: time.Now().Add(s.h.cfg.PermissionTimeout).UTC(),
	}
	s.meta.Permissions = append(s.meta.Permissions, pr)
	_ = s.saveLocked()
	s.raiseLocked(pr, false)
}

// raiseLocked emits permission_requested and arms its timeout.
func (s *session) raiseLocked(pr sessionstore.PermissionRequest, again bool) {
	s.emitLocked(contract.EventPermissionRequested, contract.PermissionRequested{
		RequestID: pr.RequestID, ToolName: pr.ToolName, ToolUseID: pr.ToolUseID, Input: pr.Input,
		Description: pr.Description, ExpiresAt: pr.ExpiresAt, Reraised: again,
	})
	id := pr.RequestID
	time.AfterFunc(time.Until(pr.ExpiresAt), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if i := s.permissionLocked(id); i >= 0 && s.meta.Permissions[i].Answer == "" {
			s.resolveLocked(id, "deny", "no answer within the permission timeout", "timeout")
		}
	})
}

func (s *session) permissionLocked(id string) int {
	for i, pr := range s.meta.Permissions {
		if pr.RequestID == id {
			return i
		}
	}
	return -1
}

// resolveLocked settles a pending request: the CLI gets the answer (when
// one is asking), the request leaves the state and permission_resolved is
// emitted.
func (s *session) resolveLocked(id, behavior, message, reason string) {
	i := s.permissionLocked(id)
	if i < 0 {
		return
	}
	pr := s.meta.Permissions[i]
	if pr.CLIRequestID != "" {
		s.answerCLILocked(pr, behavior, message)
		s.dropPermissionLocked(id)
	} else {
		// Nobody asks right now (the worker restarted): keep the answer
		// for the repeated call.
		s.meta.Permissions[i].Answer = behavior
		_ = s.saveLocked()
	}
	s.emitLocked(contract.EventPermissionResolved, contract.PermissionResolved{RequestID: id, Behavior: behavior, Reason: reason})
}

func (s *session) answerCLILocked(pr sessionstore.PermissionRequest, behavior, message string) {
	if s.proc == nil {
		return
	}
	if behavior == "allow" {
		s.proc.send(streamjson.ControlSuccess(pr.CLIRequestID, map[string]any{
			"behavior": "allow", "updatedInput": pr.Input, "toolUseID": pr.ToolUseID}))
		return
	}
	s.proc.send(streamjson.ControlSuccess(pr.CLIRequestID, map[string]any{"behavior": "deny", "message": message}))
}

func (s *session) dropPermissionLocked(id string) {
	if i := s.permissionLocked(id); i >= 0 {
		s.meta.Permissions = append(s.meta.Permissions[:i:i], s.meta.Permissions[i+1:]...)
		_ = s.saveLocked()
	}
	s.resolved = append(s.resolved, id)
	if len(s.resolved) > maxResolved {
		s.resolved = s.resolved[len(s.resolved)-maxResolved:]
	}
}

// endPermissionsLocked resolves the requests a finished turn left open.
func (s *session) endPermissionsLocked() {
	for _, pr := range append([]sessionstore.PermissionRequest(nil), s.meta.Permissions...) {
		s.dropPermissionLocked(pr.RequestID)
		if pr.Answer == "" {
			s.emitLocked(contract.EventPermissionResolved, contract.PermissionResolved{RequestID: pr.RequestID, Behavior: "deny", Reason: "turn_ended"})
		}
	}
}

// continueAfterCrashLocked turns a turn cut while permission requests were
// pending into a continuation: the requests are raised again (same ids,
// fresh deadline) and a continuation message asks the agent to repeat the
// call. It reports false when there is nothing to continue.
func (s *session) continueAfterCrashLocked(t *sessionstore.PendingMessage) bool {
	if len(s.meta.Permissions) == 0 {
		return false
	}
	var tools []string
	for i := range s.meta.Permissions {
		pr := &s.meta.Permissions[i]
		pr.CLIRequestID = ""
		pr.ExpiresAt = time.Now().Add(s.h.cfg.PermissionTimeout).UTC()
		tools = append(tools, pr.ToolName)
	}
	s.meta.Pending = append([]sessionstore.PendingMessage{{
		ClientMessageID: t.ClientMessageID, AcceptedAt: time.Now().UTC(), Continuation: true,
		Text: fmt.Sprintf("(TalkIDE: the session was restarted while you waited for permission to use %s. Continue the task: request that tool call again, with the same input.)", strings.Join(tools, ", ")),
	}}, s.meta.Pending...)
	s.meta.Turn = nil
	for _, pr := range s.meta.Permissions {
		s.raiseLocked(pr, true)
	}
	return true
}

// AnswerPermission answers permission request id of conv ("allow" or
// "deny"). Errors: ErrInvalid (bad behavior), ErrNotFound (unknown
// conversation), ErrPermissionNotFound, ErrPermissionResolved (already answered, timed out, or
// its turn ended), *NotOwnerError, ErrUnavailable.
func (h *Harness) AnswerPermission(conv, id string, a contract.PermissionAnswer) (contract.PermissionResolved, error) {
	if a.Behavior != "allow" && a.Behavior != "deny" {
		return contract.PermissionResolved{}, fmt.Errorf("%w: behavior must be allow or deny", ErrInvalid)
	}
	var out contract.PermissionResolved
	err := h.with(conv, "", "", false, func(s *session) error {
		i := s.permissionLocked(id)
		if i < 0 || s.meta.Permissions[i].Answer != "" {
			for _, r := range s.resolved {
				if r == id {
					return ErrPermissionResolved
				}
			}
			if i >= 0 {
				return ErrPermissionResolved
			}
			return ErrPermissionNotFound
		}
		msg := a.Message
		if msg == "" {
			msg = "the user denied this tool call"
		}
		s.resolveLocked(id, a.Behavior, msg, "answered")
		out = contract.PermissionResolved{RequestID: id, Behavior: a.Behavior, Reason: "answered"}
		return nil
	})
	return out, err
}

func sameJSON(a, b json.RawMessage) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return bytes.Equal(a, b)
	}
	ja, _ := json.Marshal(va)
	jb, _ := json.Marshal(vb)
	return bytes.Equal(ja, jb)
}
