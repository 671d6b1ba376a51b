package sessionstore

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/worker/atomicfile"
)

// FormatVersion is the on-disk format of events.jsonl, and of state.json
// when it held the whole state (see StateFormat). A reader refuses files of
// another version rather than misread them.
const FormatVersion = 1

// ErrNotFound is returned for a conversation the store does not hold.
var ErrNotFound = errors.New("conversation not found")

// ErrFormat is returned for a file of an unknown format version.
var ErrFormat = errors.New("unsupported on-disk format")

// Meta is a conversation's durable state (see state.go for its files).
type Meta struct {
	Format         int       `json:"format"`
	ConversationID string    `json:"conversation_id"`
	UserID         string    `json:"user_id"`
	Model          string    `json:"model,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	// SessionID is the Claude Code session id (UUID) of the conversation.
	SessionID string `json:"session_id"`
	// Workspace is the agent's working directory as a name under the
	// worker's workspace root (the conversation id), so nothing stored
	// depends on where the session volume is mounted (see WorkDirIn).
	Workspace string `json:"workspace,omitempty"`
	// WorkDir is the working directory's absolute path on the worker that
	// saved the state. Workers that predate Workspace run from it, so it is
	// still written (during a rolling update they may load a conversation
	// again); this worker reads it only to migrate state without Workspace
	// and never trusts its directory part.
	WorkDir string `json:"work_dir,omitempty"`
	// Stopped is set by a Stop command and cleared by the next message.
	Stopped bool `json:"stopped,omitempty"`
	// AcceptedMessages are the client message ids accepted so far, newest
	// last, bounded by MaxAcceptedMessages.
	AcceptedMessages []string `json:"accepted_messages,omitempty"`
	// Pending are accepted messages whose turn has not started, oldest first.
	Pending []PendingMessage `json:"pending,omitempty"`
	// Turn is the message whose turn runs (sent to the CLI, no result yet);
	// nil when idle. A Turn found on load means its worker died mid-turn.
	Turn *PendingMessage `json:"turn,omitempty"`
	// Permissions are the agent's permission requests waiting for an answer.
	Permissions []PermissionRequest `json:"permissions,omitempty"`
	// AgentUID is the user id the conversation's agent runs as, when the
	// worker gives each conversation its own (0: none).
	AgentUID uint32 `json:"agent_uid,omitempty"`
	// Process describes the live CLI process, so a successor can clean up
	// after a crash; nil when none runs.
	Process *ProcessInfo `json:"process,omitempty"`
	// Sample is the sample project the working tree started from, if any.
	Sample string `json:"sample,omitempty"`
	// CLITotalCostUSD is the CLI's cumulative session cost at the last result
	// line (the CLI's own figure, used to derive per-turn cost).
	CLITotalCostUSD float64 `json:"cli_total_cost_usd,omitempty"`

	// slot is where this state was last loaded from or saved to.
	slot slotPos
}

// PendingMessage is an accepted user message waiting for its turn.
type PendingMessage struct {
	ClientMessageID string    `json:"client_message_id"`
	Text            string    `json:"text"`
	AcceptedAt      time.Time `json:"accepted_at"`
	// Continuation is set on a message the worker made up to continue a
	// turn a restart cut while a permission request was pending.
	Continuation bool `json:"continuation,omitempty"`
}

// PermissionRequest is a pending request of the agent to use a tool.
type PermissionRequest struct {
	RequestID string `json:"request_id"`
	// CLIRequestID is the CLI's control request id to answer; empty after
	// a worker restart until the continued turn asks again.
	CLIRequestID string          `json:"cli_request_id,omitempty"`
	ToolName     string          `json:"tool_name"`
	ToolUseID    string          `json:"tool_use_id"`
	Input        json.RawMessage `json:"input"`
	Description  string          `json:"description,omitempty"`
	ExpiresAt    time.Time       `json:"expires_at"`
	// Answer is "allow" when the answer came while no CLI was asking
	// (after a restart); it is given as soon as the CLI asks again.
	Answer string `json:"answer,omitempty"`
}

// ProcessInfo identifies a CLI process and its process group.
type ProcessInfo struct {
	PID int `json:"pid"`
	// PGID is the process group of the CLI and every tool it started.
	PGID int `json:"pgid"`
	// Holder and Incarnation name the worker process that started it.
	Holder      string    `json:"holder"`
	Incarnation string    `json:"incarnation"`
	StartedAt   time.Time `json:"started_at"`
	// TmpDir is the process's CLAUDE_CODE_TMPDIR: every process it started
	// carries it in its environment, which is how leftovers are found. For
	// diagnosis: a successor looks for leftovers by its own tmp dir of the
	// conversation, since this path may be another worker's after the
	// session volume moved.
	TmpDir string `json:"tmp_dir"`
}

// MaxAcceptedMessages bounds Meta.AcceptedMessages; a retried send older than
// that many messages would run again.
const MaxAcceptedMessages = 10000

// Each AcceptedMessages entry is "<client message id> <text digest>" (just
// the id in entries of older workers).

func textDigest(text string) string {
	sum := sha256.Sum256([]byte(text))
	return hex.EncodeToString(sum[:8])
}

// HasAccepted reports whether the client message id was accepted before
// and, if so, whether with the same text (true when the entry predates
// digests).
func (m *Meta) HasAccepted(id, text string) (seen, sameText bool) {
	for i := len(m.AcceptedMessages) - 1; i >= 0; i-- {
		e := m.AcceptedMessages[i]
		gotID, digest, hasDigest := strings.Cut(e, " ")
		if gotID == id {
			return true, !hasDigest || digest == textDigest(text)
		}
	}
	return false, false
}

// Accept records a client message id with its text's digest.
func (m *Meta) Accept(id, text string) {
	m.AcceptedMessages = append(m.AcceptedMessages, id+" "+textDigest(text))
	if n := len(m.AcceptedMessages) - MaxAcceptedMessages; n > 0 {
		m.AcceptedMessages = append([]string(nil), m.AcceptedMessages[n:]...)
	}
}

// Store is the SessionStore rooted at one directory.
type Store struct {
	root string
	// KeepEvents bounds each conversation's event log: when it holds half as
	// many again, the oldest are dropped down to KeepEvents. 0 keeps all.
	// Set it before opening logs.
	KeepEvents int
	// RecentEvents is how many newest events each open event log keeps in
	// memory, so that live subscribers never touch the file; a follower
	// further behind reads the file. 0 means DefaultRecentEvents. Set it
	// before opening logs.
	RecentEvents int
}

// DefaultRecentEvents is Store.RecentEvents when unset.
const DefaultRecentEvents = 4096

// Open returns the store rooted at dir, creating it (0700) if needed.
func Open(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open session store: %w", err)
	}
	for _, d := range []string{"conversations", "waiting"} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o700); err != nil {
			return nil, fmt.Errorf("open session store: %w", err)
		}
	}
	return &Store{root: abs}, nil
}

// Dir returns the directory of a conversation's files.
func (s *Store) Dir(conv string) string {
	return filepath.Join(s.root, "conversations", conv)
}

// ownDir returns Dir(conv), or an error when conv would name a directory
// other than one right under the conversations' (a path, "..").
func (s *Store) ownDir(conv string) (string, error) {
	dir := s.Dir(conv)
	if filepath.Dir(dir) != filepath.Join(s.root, "conversations") {
		return "", fmt.Errorf("%q is not a conversation id", conv)
	}
	return dir, nil
}

// List returns the ids of all conversations that have a state file.
func (s *Store) List() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(s.root, "conversations"))
	if err != nil {
		return nil, fmt.Errorf("list conversations: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(s.root, "conversations", e.Name(), stateMarker)); err == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

func syncDir(dir string) error { return atomicfile.SyncDir(dir) }
