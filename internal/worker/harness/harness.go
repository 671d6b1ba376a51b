package harness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/lease"
	"github.com/talkide/talkide/internal/worker/localproxy"
	"github.com/talkide/talkide/internal/worker/samples"
	"github.com/talkide/talkide/internal/worker/sandbox"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// Config configures a Harness. Zero values take the defaults noted.
type Config struct {
	// ClaudeBin is the Claude Code CLI binary. Required.
	ClaudeBin string
	// ConfigDir holds one CLAUDE_CONFIG_DIR per conversation (its
	// transcripts), <ConfigDir>/<conversation id>. Required; on the session
	// volume.
	ConfigDir string
	// WorkspaceRoot holds one working directory per conversation,
	// <WorkspaceRoot>/<conversation id>. Required; on the session volume so
	// the path is the same on every replica.
	WorkspaceRoot string
	// HomeDir holds one HOME per conversation (the CLI writes MCP logs
	// under $HOME/.cache), <HomeDir>/<conversation id>. Required.
	HomeDir string
	// TmpRoot holds each process's private CLAUDE_CODE_TMPDIR and TMPDIR,
	// <TmpRoot>/<conversation id>; on local disk, private to this replica.
	// Default: <os temp dir>/talkide-cli/<Identity.Holder>.
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
	// Leases gives single ownership of conversations across replicas; nil
	// means this is the only process using the session volume.
	Leases lease.Manager
	// Identity names this worker process (with Leases).
	Identity lease.Identity
	// MaxProcesses caps live CLI processes. A turn beyond the cap waits in
	// a queue (a turn_queued event) while idle processes are stopped to make
	// room. Default 4.
	MaxProcesses int
	// MaxProcessesPerUser caps the live CLI processes of one user (its idle
	// ones count): a turn of a user at the cap waits even when a process
	// slot is free, so one user's long turns cannot make the others wait.
	// A freed slot goes to the waiting turn whose user holds the fewest
	// (ownership.go, slots). 1 to MaxProcesses; default MaxProcesses-1
	// (1 when MaxProcesses is 1).
	MaxProcessesPerUser int
	// InterruptTimeout bounds how long an interrupted turn may take to end
	// before its process is killed. Default 10 s.
	InterruptTimeout time.Duration
	// ShutdownGrace is how long running turns may go on after shutdown
	// begins before they are interrupted. Default 20 s.
	ShutdownGrace time.Duration
	// PermissionPolicy is PolicyAllow (the default: every tool call the CLI
	// asks about is allowed) or PolicyAsk (each becomes a
	// permission_requested event for the control plane to answer).
	PermissionPolicy string
	// PermissionTimeout denies an unanswered request after this long.
	// Default 5 minutes.
	PermissionTimeout time.Duration
	// AgentUser, when set, is the one account every CLI process (and so
	// every command the agent runs) runs as, instead of the worker's own: a
	// worker running as root must not hand root to the agent. The harness
	// gives it each conversation's directories (config, home, working and
	// tmp directory) and nothing else.
	AgentUser *sandbox.User
	// AgentUIDs, when set (instead of AgentUser), gives each conversation's
	// agent a user id of its own from the range, so the agents of two
	// conversations cannot read each other's files, transcripts or
	// environments either. It needs the worker to run as root.
	AgentUIDs *sandbox.UIDRange
	// Jail, when set, runs each conversation's CLI in a jail of its own
	// (jail.go, sandbox.Jail): its processes end with it, it sees only its
	// own processes and directories, it has the jail's limits, and the
	// managed settings keep the permission policy the operator's. Nil runs
	// the CLI as a plain child process (the weaker guarantee of
	// TALKIDE_CONTAINMENT=weak).
	Jail *sandbox.Jail
	// DiskLimit caps the bytes a conversation's directories take, and
	// DiskFileLimit the names of their files and directories (0: no limit);
	// DiskCheckEvery is how often they are walked while its CLI runs
	// (default 30 s; also at a turn's start when the last walk is 10 s old
	// or may no longer hold, and at once when the filesystem grows by more
	// than the conversation has left; see jail.go).
	DiskLimit      int64
	DiskFileLimit  int64
	DiskCheckEvery time.Duration
	// MaxConversations caps the conversations stored on the session volume
	// (the tenant-env's); MaxConversationsPerUser caps one user's among
	// them. Creating one more fails with ErrQuota. Defaults 1000 and 100;
	// negative: no cap.
	MaxConversations, MaxConversationsPerUser int
	// RecoverInterval is how often the harness looks for conversations with
	// waiting work that no live replica owns (handed over by a replica that
	// shut down or died). Default 5 s.
	RecoverInterval time.Duration
	// AdmitLoad, when set, is asked before a conversation is loaded, with
	// the number loaded (or loading) now; an error refuses the load and is
	// returned wrapped with ErrUnavailable (admit.go). Nil admits every load.
	AdmitLoad func(loaded int) error
}

func (c *Config) setDefaults() error {
	if c.ClaudeBin == "" || c.ConfigDir == "" || c.WorkspaceRoot == "" || c.HomeDir == "" {
		return errors.New("harness config: ClaudeBin, ConfigDir, WorkspaceRoot and HomeDir are required")
	}
	if c.TmpRoot == "" {
		holder := c.Identity.Holder
		if holder == "" {
			holder = "local"
		}
		c.TmpRoot = filepath.Join(os.TempDir(), "talkide-cli", holder)
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
	if c.MaxProcesses <= 0 {
		c.MaxProcesses = 4
	}
	switch {
	case c.MaxProcessesPerUser == 0:
		c.MaxProcessesPerUser = max(c.MaxProcesses-1, 1)
	case c.MaxProcessesPerUser < 0 || c.MaxProcessesPerUser > c.MaxProcesses:
		return fmt.Errorf("harness config: MaxProcessesPerUser %d: want 1 to MaxProcesses (%d)", c.MaxProcessesPerUser, c.MaxProcesses)
	}
	if c.InterruptTimeout <= 0 {
		c.InterruptTimeout = 10 * time.Second
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 20 * time.Second
	}
	switch c.PermissionPolicy {
	case "":
		c.PermissionPolicy = PolicyAllow
	case PolicyAllow, PolicyAsk:
	default:
		return fmt.Errorf("harness config: permission policy %q: want allow or ask", c.PermissionPolicy)
	}
	if c.PermissionPolicy == PolicyAsk && c.PermissionMode == "bypassPermissions" {
		return errors.New("harness config: permission mode bypassPermissions would never ask: it contradicts the ask policy")
	}
	if c.PermissionTimeout <= 0 {
		c.PermissionTimeout = 5 * time.Minute
	}
	if c.DiskCheckEvery <= 0 {
		c.DiskCheckEvery = 30 * time.Second
	}
	if c.RecoverInterval <= 0 {
		c.RecoverInterval = 5 * time.Second
	}
	if c.MaxConversations == 0 {
		c.MaxConversations = 1000
	}
	if c.MaxConversationsPerUser == 0 {
		c.MaxConversationsPerUser = 100
	}
	if c.Leases != nil && (c.Identity.Holder == "" || c.Identity.Incarnation == "") {
		return errors.New("harness config: Identity is required with Leases")
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
	// ErrConflict: a client message id was reused for another text.
	ErrConflict = errors.New("conflict")
	// ErrTooLarge: the message text is over contract.MaxMessageBytes.
	ErrTooLarge = errors.New("message too large")
	// ErrNotOwner: another live replica owns the conversation; NotOwnerError
	// says which, so the request can be forwarded there.
	ErrNotOwner = errors.New("conversation owned by another replica")
	// ErrUnavailable: the conversation cannot be served right now (its lease
	// could not be read or taken); retry shortly.
	ErrUnavailable = errors.New("conversation temporarily unavailable")
)

// NotOwnerError is ErrNotOwner with the owner's lease record.
type NotOwnerError struct{ Owner lease.Record }

func (e *NotOwnerError) Error() string {
	return fmt.Sprintf("conversation owned by %s at %s", e.Owner.Holder, e.Owner.Address)
}
func (e *NotOwnerError) Unwrap() error { return ErrNotOwner }

// Harness runs the conversations of one worker.
type Harness struct {
	cfg   Config
	store *sessionstore.Store
	proxy *localproxy.Server
	log   *slog.Logger

	mu sync.Mutex
	// sessions holds the conversations this process owns and has loaded;
	// guarded by mu.
	sessions map[string]*session
	// loading holds, per conversation being loaded, a channel closed when
	// the load ends; guarded by mu.
	loading map[string]chan struct{}
	// closing is set when shutdown begins: no new turn starts.
	closing atomic.Bool

	slots slots
	// metrics is set by RegisterMetrics.
	metrics atomic.Pointer[metrics]

	// procs counts goroutines of CLI processes, waited for by Run.
	procs sync.WaitGroup
	// createMu serializes the creation of conversations (quota.go).
	createMu sync.Mutex
	// quotaCount is the number of conversations on the volume when last
	// listed, at quotaAt; quotaCreated counts creates admitted since
	// (quota.go). Guarded by createMu.
	quotaCount, quotaCreated int
	quotaAt                  time.Time
	// replica is this process's replica lease (nil without Leases): the
	// one renewal that keeps every conversation lease it holds.
	replica *lease.Replica
}

// New returns a Harness storing state in store and routing model calls
// through proxy.
func New(cfg Config, store *sessionstore.Store, proxy *localproxy.Server) (*Harness, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	h := &Harness{cfg: cfg, store: store, proxy: proxy, log: cfg.Logger, sessions: make(map[string]*session), loading: make(map[string]chan struct{})}
	h.slots.max, h.slots.perUser = cfg.MaxProcesses, cfg.MaxProcessesPerUser
	if cfg.Leases != nil {
		h.replica = lease.NewReplica(cfg.Leases, h.loseAll)
	}
	if cfg.AgentUser != nil || cfg.AgentUIDs != nil {
		// The roots of the per-conversation directories: agents pass
		// through them to their own conversation's, and list nothing.
		// With per-conversation uids any agent is "others" to them; nobody
		// stands in for one in the check.
		probe := sandbox.Nobody
		if cfg.AgentUser != nil {
			probe = *cfg.AgentUser
		}
		for _, d := range []string{cfg.ConfigDir, cfg.HomeDir, cfg.WorkspaceRoot, cfg.TmpRoot} {
			if err := sandbox.MakeTraversable(filepath.Dir(d), d, probe); err != nil {
				return nil, fmt.Errorf("prepare agent directories: %w", err)
			}
		}
	}
	return h, nil
}

// Run keeps the harness's leases and recovery going until ctx ends, then
// shuts down gracefully: no new turn starts (messages are still accepted
// and stored for the next owner), running turns get ShutdownGrace to
// finish, then they are interrupted, every CLI process is stopped and every
// lease released. It returns when all of that is done.
func (h *Harness) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	loopCtx, stopLoops := context.WithCancel(ctx)
	// The replica lease is renewed until shutdown releases it, not only
	// until ctx ends: a shutdown that waits for running turns longer than
	// the lease's trust window must still own its conversations, or the
	// events it writes last (a turn's end, the process's stop) are dropped.
	renewCtx, stopRenewing := context.WithCancel(context.WithoutCancel(ctx))
	var renewing sync.WaitGroup
	if h.replica != nil {
		renewing.Go(func() { h.renewLoop(renewCtx) })
	}
	wg.Go(func() { h.recoverLoop(loopCtx) })
	if j := h.cfg.Jail; j != nil && j.Cgroups == nil {
		wg.Go(func() { h.memoryGuard(loopCtx) })
	}
	<-ctx.Done()
	stopLoops()
	wg.Wait()
	h.shutdown(func() {
		stopRenewing()
		renewing.Wait()
	})
	return nil
}

func (h *Harness) isClosing() bool { return h.closing.Load() }

// loaded returns the sessions loaded now.
func (h *Harness) loaded() []*session {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*session, 0, len(h.sessions))
	for _, s := range h.sessions {
		out = append(out, s)
	}
	return out
}

// session returns the loaded session of conv, loading it (taking its lease,
// reading its state from the store, cleaning up after a crashed previous
// owner) if needed, pinned: the caller calls unpin when done with it. With create set, a missing session is created for
// userID. Errors: ErrInvalid, ErrNotFound, *NotOwnerError, ErrUnavailable.
func (h *Harness) session(conv, userID, model string, create bool) (*session, error) {
	if err := contract.ValidConversationID(conv); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	for {
		h.mu.Lock()
		if s, ok := h.sessions[conv]; ok {
			s.pins++
			h.mu.Unlock()
			return s, nil
		}
		if wait, ok := h.loading[conv]; ok {
			// Another request loads it: wait, then look again.
			h.mu.Unlock()
			<-wait
			continue
		}
		if h.closing.Load() {
			// A replica shutting down takes no new ownership; the next
			// owner serves the conversation.
			h.mu.Unlock()
			return nil, fmt.Errorf("%w: worker shutting down", ErrUnavailable)
		}
		if err := h.admitLoadLocked(); err != nil {
			h.mu.Unlock()
			return nil, err
		}
		// Load without holding mu: taking a lease may be a network call
		// (Kubernetes), and other conversations must not wait for it.
		done := make(chan struct{})
		h.loading[conv] = done
		h.mu.Unlock()
		s, err := h.load(conv, userID, model, create)
		h.mu.Lock()
		delete(h.loading, conv)
		if err == nil {
			h.sessions[conv] = s
			s.pins++
		}
		h.mu.Unlock()
		close(done)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.pumpLocked()
		s.mu.Unlock()
		return s, nil
	}
}

// load takes conv's lease and reads its session from the store (see
// session).
func (h *Harness) load(conv, userID, model string, create bool) (*session, error) {
	if !create {
		// Do not take a lease for a conversation that does not exist.
		if _, err := h.store.LoadMeta(conv); errors.Is(err, sessionstore.ErrNotFound) {
			return nil, ErrNotFound
		}
	}
	var held *lease.Held
	if h.replica != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var err error
		held, err = h.replica.Hold(ctx, conv)
		cancel()
		var he *lease.HeldError
		if errors.As(err, &he) {
			return nil, &NotOwnerError{Owner: he.Record}
		}
		if err != nil {
			h.log.Error("take conversation lease", "conversation", conv, "err", err)
			return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
	}
	s, err := h.open(conv, userID, model, create, held)
	if err != nil && held != nil {
		_ = held.Release(context.Background())
	}
	return s, err
}

// open reads conv's state and event log (creating them when create is set)
// and cleans up after a crashed previous owner. held is its lease.
func (h *Harness) open(conv, userID, model string, create bool, held *lease.Held) (*session, error) {
	meta, err := h.store.LoadMeta(conv)
	created := false
	switch {
	case errors.Is(err, sessionstore.ErrNotFound):
		if !create {
			return nil, ErrNotFound
		}
		if userID == "" {
			return nil, fmt.Errorf("%w: user_id is required", ErrInvalid)
		}
		admitted, err := h.admitNew(userID)
		if err != nil {
			return nil, err
		}
		defer admitted()
		created = true
		if model == "" {
			model = h.cfg.Model
		}
		meta = &sessionstore.Meta{
			ConversationID: conv,
			UserID:         userID,
			Model:          model,
			CreatedAt:      time.Now().UTC(),
			SessionID:      uuid.NewString(),
			Workspace:      conv,
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
		if created {
			// Refused (e.g. out of open files): as if never created, so a
			// create that was answered with an error leaves nothing behind.
			_ = h.store.Delete(conv)
			_ = os.Remove(meta.WorkDir)
		}
		return nil, err
	}
	s := &session{h: h, conv: conv, meta: meta, log: elog, held: held}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resolveWorkDirLocked()
	if r := h.cfg.AgentUIDs; r != nil {
		if err := s.agentUIDLocked(r); err != nil {
			elog.Close()
			if created {
				_ = h.store.Delete(conv) // refused: as if never created
			}
			return nil, err
		}
	}
	if rep.TornBytes > 0 || rep.BadRecords > 0 {
		h.log.Warn("event log repaired", "conversation", conv, "torn_bytes", rep.TornBytes, "bad_records", rep.BadRecords)
		s.emitLocked(contract.EventError, contract.ErrorEvent{Code: "event_log_repaired",
			Message: fmt.Sprintf("the event log ended in an incomplete record (%d bytes, from a crash) which was removed; %d unreadable records were skipped", rep.TornBytes, rep.BadRecords)})
	}
	s.recoverLocked()
	return s, nil
}

// CreateSession creates the session of conv for req.UserID, or returns the
// existing one (ErrUserMismatch if it belongs to another user). A new
// session's working tree starts from the sample project req.Sample when
// one is named (package samples); an unknown sample is ErrInvalid.
func (h *Harness) CreateSession(conv string, req contract.CreateSessionRequest) (contract.SessionStatus, error) {
	if req.Sample != "" {
		if _, err := samples.FS(req.Sample); err != nil {
			return contract.SessionStatus{}, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	var st contract.SessionStatus
	err := h.with(conv, req.UserID, req.Model, true, func(s *session) error {
		if s.meta.UserID != req.UserID {
			return ErrUserMismatch
		}
		if req.Sample != "" && s.meta.Sample == "" && len(s.meta.AcceptedMessages) == 0 && s.proc == nil && s.meta.Process == nil {
			if err := s.copySampleLocked(req.Sample); err != nil {
				return err
			}
		}
		st = s.statusLocked()
		return nil
	})
	return st, err
}

// copySampleLocked makes the new conversation's working tree a copy of the
// sample project name, owned by its agent. The tree is still the empty
// directory the worker made (no agent has run): it is replaced, never
// entered, and samples.Copy creates everything beneath its own descriptor.
func (s *session) copySampleLocked(name string) error {
	if s.workDir == "" {
		return s.workDirRefusal()
	}
	uid, gid := -1, -1
	if u := s.agentUser(); u != nil {
		uid, gid = int(u.UID), int(u.GID)
	}
	if err := os.Remove(s.workDir); err != nil {
		return fmt.Errorf("%w: a sample project starts only a new conversation's empty working tree", ErrInvalid)
	}
	if err := samples.Copy(name, s.workDir, uid, gid); err != nil {
		_ = os.Mkdir(s.workDir, 0o700)
		return fmt.Errorf("copy the sample project %s: %w", name, err)
	}
	s.meta.Sample = name
	s.h.log.Info("working tree started from a sample project", "conversation", s.conv, "sample", name)
	return s.saveLocked()
}

// with runs f with conv's session locked, retrying once when the session
// was unloaded between lookup and lock.
func (h *Harness) with(conv, userID, model string, create bool, f func(s *session) error) error {
	for range 3 {
		s, err := h.session(conv, userID, model, create)
		if err != nil {
			return err
		}
		s.mu.Lock()
		if s.gone {
			s.mu.Unlock()
			s.unpin()
			continue
		}
		err = f(s)
		s.mu.Unlock()
		s.unpin()
		// A conversation with nothing running and nobody following costs
		// nothing: no open file, no lease.
		s.maybeUnload()
		return err
	}
	return fmt.Errorf("%w: session reloaded repeatedly", ErrUnavailable)
}

// SendMessage accepts a user message into the queue of conv's session
// (created before with CreateSession; else ErrNotFound) and starts its turn
// when the conversation is free. A client message id seen before is
// acknowledged again with Duplicate set and nothing runs. The message is
// stored before SendMessage returns. During shutdown messages are still
// accepted; the next owner runs them. Errors: ErrInvalid, ErrTooLarge,
// ErrNotFound, ErrUserMismatch (req.UserID is not the session's user),
// *NotOwnerError, ErrUnavailable.
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
	var resp contract.SendMessageResponse
	err := h.with(conv, "", "", false, func(s *session) error {
		var err error
		resp, err = s.enqueueLocked(req)
		return err
	})
	return resp, err
}

// Interrupt asks conv's running turn to stop. The turn ends within
// InterruptTimeout: if the CLI does not end it, its process is killed. It
// returns false when no turn was running.
func (h *Harness) Interrupt(conv string) (bool, error) {
	var ok bool
	err := h.with(conv, "", "", false, func(s *session) error {
		ok = s.interruptLocked()
		return nil
	})
	return ok, err
}

// Emit appends an event of type t with payload to conv's event log as its
// owner, outside any turn: what a build the conversation waited for
// reports after a worker restart. It loads the conversation (taking its
// lease) when no replica holds it. Errors: ErrNotFound (no such
// conversation, or deleted), *NotOwnerError (another replica owns it: it
// delivers instead), ErrUnavailable.
func (h *Harness) Emit(conv string, t contract.EventType, payload any) error {
	return h.with(conv, "", "", false, func(s *session) error {
		if !s.ownedLocked() {
			return fmt.Errorf("%w: the conversation's lease was lost", ErrUnavailable)
		}
		s.emitLocked(t, payload)
		return nil
	})
}

// Stop stops conv's CLI process (the running turn fails as interrupted,
// queued messages are dropped). The next message resumes the session.
func (h *Harness) Stop(conv string) (contract.SessionStatus, error) {
	s, err := h.session(conv, "", "", false)
	if err != nil {
		return contract.SessionStatus{}, err
	}
	defer s.maybeUnload()
	defer s.unpin()
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statusLocked(), nil
}

// Status returns conv's status.
func (h *Harness) Status(conv string) (contract.SessionStatus, error) {
	var st contract.SessionStatus
	err := h.with(conv, "", "", false, func(s *session) error {
		st = s.statusLocked()
		return nil
	})
	return st, err
}

// Follow streams conv's events after id after to onEvent (see
// sessionstore.EventLog.Follow) until ctx ends, onEvent or onIdle fails, or
// this process stops owning the conversation (then it returns
// sessionstore.ErrClosed and the client reconnects, reaching the new owner).
// While a follower is connected the conversation stays loaded. onStart is
// called once the conversation was found, before any event; errors before
// it (ErrNotFound, *NotOwnerError, ...) mean nothing was streamed.
func (h *Harness) Follow(ctx context.Context, conv string, after int64, heartbeat time.Duration, onEvent func(contract.Event) error, onIdle, onStart func() error) error {
	var s *session
	if err := h.with(conv, "", "", false, func(ls *session) error {
		s = ls
		s.followers++
		return nil
	}); err != nil {
		return err
	}
	defer func() {
		s.mu.Lock()
		s.followers--
		s.mu.Unlock()
		s.maybeUnload()
	}()
	if last := s.log.LastID(); after > last {
		return fmt.Errorf("%w: Last-Event-ID %d is beyond the newest event %d of this conversation", ErrInvalid, after, last)
	}
	if err := onStart(); err != nil {
		return err
	}
	return s.log.Follow(ctx, after, heartbeat, onEvent, onIdle)
}

// Events returns conv's event log for reading: the live log when this
// process owns the conversation, else a read-only view of the stored log
// (no lease is taken; Follow on it does not see later appends). Use Follow
// to stream events to a client.
func (h *Harness) Events(conv string) (*sessionstore.EventLog, error) {
	if err := contract.ValidConversationID(conv); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	h.mu.Lock()
	s, ok := h.sessions[conv]
	h.mu.Unlock()
	if ok {
		return s.log, nil
	}
	l, err := h.store.OpenEventLogReader(conv)
	if errors.Is(err, sessionstore.ErrNotFound) {
		return nil, ErrNotFound
	}
	return l, err
}
