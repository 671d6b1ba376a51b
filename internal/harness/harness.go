package harness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/gatewayproxy"
	"github.com/talkide/talkide/internal/sessionstore"
)

// Config configures a Harness. Zero values take the defaults noted.
type Config struct {
	// ClaudeBin is the Claude Code CLI binary. Required.
	ClaudeBin string
	// ConfigDir is the CLI's CLAUDE_CONFIG_DIR (transcripts live under it).
	// Required; on the session volume.
	ConfigDir string
	// WorkspaceRoot holds one working directory per conversation,
	// <WorkspaceRoot>/<conversation id>. Required; on the session volume so
	// the path is the same on every replica.
	WorkspaceRoot string
	// HomeDir is the CLI's HOME (it writes MCP logs under $HOME/.cache).
	// Required.
	HomeDir string
	// TmpRoot holds each process's private CLAUDE_CODE_TMPDIR and TMPDIR,
	// <TmpRoot>/<conversation id>. Default: <os temp dir>/talkide-cli.
	TmpRoot string
	// Model is the default --model; empty leaves the CLI's default.
	Model string
	// PermissionMode is the CLI's --permission-mode. Default "default", with
	// permission prompts answered by the harness (allow).
	PermissionMode string
	// IdleTimeout stops a conversation's CLI process after this long without
	// a turn. Default 10 minutes; the next message resumes the session.
	IdleTimeout time.Duration
	// StopGrace is how long a process may take to exit after its stdin is
	// closed before its process group is signalled. Default 5 s.
	StopGrace time.Duration
	// ExtraEnv are extra NAME=value entries for the CLI environment (e.g.
	// API_TIMEOUT_MS). ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN,
	// ANTHROPIC_BASE_URL and TALKIDE_* entries are refused by New.
	ExtraEnv []string
	// Logger receives the harness's logs. Default slog.Default().
	Logger *slog.Logger
	// MCP, when set, decides the MCP servers offered to each CLI process
	// (see mcp.go). Nil offers none.
	MCP MCPProvider
	// OnEvent, when set, is called with each event after it is stored in a
	// conversation's log. It runs under the session's lock: it must return
	// at once and must not call the Harness.
	OnEvent func(contract.Event)
}

func (c *Config) setDefaults() error {
	if c.ClaudeBin == "" || c.ConfigDir == "" || c.WorkspaceRoot == "" || c.HomeDir == "" {
		return errors.New("harness config: ClaudeBin, ConfigDir, WorkspaceRoot and HomeDir are required")
	}
	if c.TmpRoot == "" {
		c.TmpRoot = filepath.Join(os.TempDir(), "talkide-cli")
	}
	if c.PermissionMode == "" {
		c.PermissionMode = "default"
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.StopGrace <= 0 {
		c.StopGrace = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	for _, kv := range c.ExtraEnv {
		if name := envName(kv); forbiddenEnv(name) {
			return fmt.Errorf("harness config: extra env %s is not allowed in the CLI environment", name)
		}
	}
	for _, d := range []*string{&c.ConfigDir, &c.WorkspaceRoot, &c.HomeDir, &c.TmpRoot} {
		abs, err := filepath.Abs(*d)
		if err != nil {
			return fmt.Errorf("harness config: %w", err)
		}
		*d = abs
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return fmt.Errorf("harness config: %w", err)
		}
	}
	return nil
}

// Errors returned by Harness methods.
var (
	// ErrNotFound: the conversation has no session on this worker.
	ErrNotFound = errors.New("conversation not found")
	// ErrUserMismatch: the request names another user than the session's.
	ErrUserMismatch = errors.New("conversation belongs to another user")
	// ErrInvalid: the request is malformed (the message says how).
	ErrInvalid = errors.New("invalid request")
	// ErrTooLarge: the message text is over contract.MaxMessageBytes.
	ErrTooLarge = errors.New("message too large")
	// ErrShuttingDown: the worker is stopping and takes no new turns.
	ErrShuttingDown = errors.New("worker shutting down")
)

// Harness runs the conversations of one worker.
type Harness struct {
	cfg   Config
	store *sessionstore.Store
	proxy *gatewayproxy.Server
	log   *slog.Logger

	mu sync.Mutex
	// sessions holds every conversation loaded since start; guarded by mu.
	sessions map[string]*session
	// closing is set when Run's context ends; guarded by mu.
	closing bool

	// procs counts live CLI processes' goroutines, waited for by Run.
	procs sync.WaitGroup
}

// New returns a Harness storing state in store and routing model calls
// through proxy.
func New(cfg Config, store *sessionstore.Store, proxy *gatewayproxy.Server) (*Harness, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Harness{cfg: cfg, store: store, proxy: proxy, log: cfg.Logger, sessions: make(map[string]*session)}, nil
}

// Run blocks until ctx ends, then stops every CLI process (closing stdin,
// then signalling its process group after StopGrace) and waits for them.
func (h *Harness) Run(ctx context.Context) error {
	<-ctx.Done()
	h.mu.Lock()
	h.closing = true
	sessions := make([]*session, 0, len(h.sessions))
	for _, s := range h.sessions {
		sessions = append(sessions, s)
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Go(func() { s.stopProcess("shutdown") })
	}
	wg.Wait()
	h.procs.Wait()
	for _, s := range sessions {
		s.log.Close()
	}
	return nil
}

func (h *Harness) isClosing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closing
}

// session returns the loaded session of conv, loading it from the store if
// needed. With create set, a missing session is created for userID.
func (h *Harness) session(conv, userID, model string, create bool) (*session, error) {
	if err := contract.ValidConversationID(conv); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if s, ok := h.sessions[conv]; ok {
		return s, nil
	}
	meta, err := h.store.LoadMeta(conv)
	switch {
	case errors.Is(err, sessionstore.ErrNotFound):
		if !create {
			return nil, ErrNotFound
		}
		if userID == "" {
			return nil, fmt.Errorf("%w: user_id is required", ErrInvalid)
		}
		if model == "" {
			model = h.cfg.Model
		}
		meta = &sessionstore.Meta{
			ConversationID: conv,
			UserID:         userID,
			Model:          model,
			CreatedAt:      time.Now().UTC(),
			SessionID:      uuid.NewString(),
			WorkDir:        filepath.Join(h.cfg.WorkspaceRoot, conv),
		}
		if err := os.MkdirAll(meta.WorkDir, 0o700); err != nil {
			return nil, fmt.Errorf("create working directory: %w", err)
		}
		if err := h.store.SaveMeta(meta); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	}
	elog, rep, err := h.store.OpenEventLog(conv)
	if err != nil {
		return nil, err
	}
	s := &session{h: h, conv: conv, meta: meta, log: elog}
	if rep.TornBytes > 0 || rep.BadRecords > 0 {
		h.log.Warn("event log repaired", "conversation", conv, "torn_bytes", rep.TornBytes, "bad_records", rep.BadRecords)
		s.emitLocked(contract.EventError, contract.ErrorEvent{Code: "event_log_repaired",
			Message: fmt.Sprintf("the event log ended in an incomplete record (%d bytes, from a crash) which was removed; %d unreadable records were skipped", rep.TornBytes, rep.BadRecords)})
	}
	h.sessions[conv] = s
	return s, nil
}

// CreateSession creates the session of conv for req.UserID, or returns the
// existing one (ErrUserMismatch if it belongs to another user).
func (h *Harness) CreateSession(conv string, req contract.CreateSessionRequest) (contract.SessionStatus, error) {
	s, err := h.session(conv, req.UserID, req.Model, true)
	if err != nil {
		return contract.SessionStatus{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.meta.UserID != req.UserID {
		return contract.SessionStatus{}, ErrUserMismatch
	}
	return s.statusLocked(), nil
}

// SendMessage accepts a user message into the queue of conv's session
// (created before with CreateSession; else ErrNotFound) and starts its turn
// when the conversation is free. A client message id seen before is
// acknowledged again with Duplicate set and nothing runs. The message is
// stored before SendMessage returns. Errors: ErrInvalid, ErrTooLarge,
// ErrNotFound, ErrUserMismatch (req.UserID is not the session's user),
// ErrShuttingDown.
func (h *Harness) SendMessage(conv string, req contract.SendMessageRequest) (contract.SendMessageResponse, error) {
	if err := contract.ValidConversationID(req.ClientMessageID); err != nil {
		return contract.SendMessageResponse{}, fmt.Errorf("%w: client_message_id must be 1-64 characters of [A-Za-z0-9_-]", ErrInvalid)
	}
	if req.UserID == "" {
		return contract.SendMessageResponse{}, fmt.Errorf("%w: user_id is required", ErrInvalid)
	}
	if req.Text == "" {
		return contract.SendMessageResponse{}, fmt.Errorf("%w: text must not be empty", ErrInvalid)
	}
	if len(req.Text) > contract.MaxMessageBytes {
		return contract.SendMessageResponse{}, fmt.Errorf("%w: text is over %d bytes", ErrTooLarge, contract.MaxMessageBytes)
	}
	if h.isClosing() {
		return contract.SendMessageResponse{}, ErrShuttingDown
	}
	s, err := h.session(conv, "", "", false)
	if err != nil {
		return contract.SendMessageResponse{}, err
	}
	return s.enqueue(req)
}

// Interrupt asks conv's running turn to stop. It returns false when no turn
// was running.
func (h *Harness) Interrupt(conv string) (bool, error) {
	s, err := h.session(conv, "", "", false)
	if err != nil {
		return false, err
	}
	return s.interrupt(), nil
}

// Stop stops conv's CLI process (the running turn fails as interrupted,
// queued messages are dropped). The next message resumes the session.
func (h *Harness) Stop(conv string) (contract.SessionStatus, error) {
	s, err := h.session(conv, "", "", false)
	if err != nil {
		return contract.SessionStatus{}, err
	}
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statusLocked(), nil
}

// Status returns conv's status.
func (h *Harness) Status(conv string) (contract.SessionStatus, error) {
	s, err := h.session(conv, "", "", false)
	if err != nil {
		return contract.SessionStatus{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statusLocked(), nil
}

// Events returns conv's event log, to follow.
func (h *Harness) Events(conv string) (*sessionstore.EventLog, error) {
	s, err := h.session(conv, "", "", false)
	if err != nil {
		return nil, err
	}
	return s.log, nil
}

// Recover loads every conversation that has accepted messages waiting and
// starts their turns; call it once at start-up, after the local proxy
// listens. It returns the number of conversations resumed.
func (h *Harness) Recover() (int, error) {
	ids, err := h.store.List()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		meta, err := h.store.LoadMeta(id)
		if err != nil {
			h.log.Error("load conversation state", "conversation", id, "err", err)
			continue
		}
		if len(meta.Pending) == 0 {
			continue
		}
		s, err := h.session(id, "", "", false)
		if err != nil {
			h.log.Error("load conversation", "conversation", id, "err", err)
			continue
		}
		s.mu.Lock()
		s.pumpLocked()
		s.mu.Unlock()
		n++
	}
	return n, nil
}
