package harness

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/localproxy"
	"github.com/talkide/talkide/internal/worker/sandbox"
	"github.com/talkide/talkide/internal/worker/sessionstore"
	"github.com/talkide/talkide/internal/worker/streamjson"
)

// process is one running Claude Code CLI.
type process struct {
	cmd *exec.Cmd
	// cell is the process's jail (Config.Jail), nil when not jailed.
	cell    *sandbox.Cell
	pgid    int
	resumed bool
	// in feeds the stdin writer goroutine; never closed by senders.
	in   chan []byte
	done chan struct{} // closed once the process is reaped
	// turnStarted (capacity 1) tells the limit watcher a turn started.
	turnStarted chan struct{}

	// Fields below are guarded by the owning session's mu.
	announced bool   // session_started emitted
	apiError  string // text of a synthetic API error message of the turn
	// requests are the upstream request ids of the turn's model calls
	// (contract.TurnCompleted.RequestIDs).
	requests  []string
	idle      *time.Timer
	interrupt *time.Timer // kills the process if an interrupted turn does not end
	// lastActive is when the process last finished a turn (or started).
	lastActive time.Time
	mcp        *mcpProcess // MCP servers of the process (mcp.go); set before it runs
	// limitHits are the jail's counters as last reported, limitEvents when
	// (memory, processes) they were last reported (jail.go); guarded by mu.
	limitHits   sandbox.Counters
	limitEvents [2]time.Time

	mu sync.Mutex
	// reason is why the harness stops the process, "" if it does not; guarded by mu.
	reason string
	// stdinClosed is set once stdin is closed; guarded by mu.
	stdinClosed bool
	// stdin writes to the CLI's stdin pipe without waiting (nil: every
	// line goes through the writer goroutine); queued counts the lines
	// handed to that goroutine and not yet written. Guarded by mu.
	stdin  syscall.RawConn
	queued int
	// stderr keeps the tail of the CLI's stderr for diagnostics; guarded by mu.
	stderr []byte

	exitCode int // set before done is closed
}

// stdinQueue bounds lines waiting for the CLI to read them; a CLI that stops
// reading stdin this long is stuck and gets stopped.
const stdinQueue = 256

// maxStderrTail bounds the stderr kept for messages.
const maxStderrTail = 4 << 10

// send writes line to the CLI's stdin, or queues it for the writer
// goroutine; it reports false when stdin is closed or stdinQueue lines
// already wait. With nothing queued, what the pipe takes at once is
// written here: handing a line to the writer costs a scheduling round
// (about a millisecond on a busy 2-core host) on every message.
func (p *process) send(line []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdinClosed {
		return false
	}
	if p.queued == 0 && p.stdin != nil {
		line = line[p.writeNowLocked(line):]
		if len(line) == 0 {
			return true
		}
	}
	select {
	case p.in <- line:
		p.queued++
		return true
	default:
		return false
	}
}

// writeNowLocked writes what of b the stdin pipe takes without waiting
// and returns how many bytes that was (0 when full or closed).
func (p *process) writeNowLocked(b []byte) int {
	n := 0
	_ = p.stdin.Write(func(fd uintptr) bool {
		if m, err := unix.Write(int(fd), b); err == nil {
			n = m
		}
		return true // one try: a full pipe is the writer's to wait on
	})
	return n
}

// noteRequest records the request id of a model call of the turn, once.
func (p *process) noteRequest(id string) {
	if id == "" || len(p.requests) >= contract.MaxTurnRequestIDs || slices.Contains(p.requests, id) {
		return
	}
	p.requests = append(p.requests, id)
}

// attachStdin lets send write to stdin, the pipe to the CLI's stdin,
// without waiting when it can.
func (p *process) attachStdin(stdin io.Writer) {
	if f, ok := stdin.(syscall.Conn); ok {
		p.stdin, _ = f.SyscallConn()
	}
}

// writeQueued writes the lines send queued to stdin, in order, until the
// queue is closed or a write fails (the process is gone: its stdout reader
// sees EOF), then closes stdin.
func (p *process) writeQueued(stdin io.WriteCloser) {
	defer stdin.Close()
	for line := range p.in {
		if _, err := stdin.Write(line); err != nil {
			return
		}
		p.mu.Lock()
		p.queued--
		p.mu.Unlock()
	}
}

func (p *process) beginStop(reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reason == "" {
		p.reason = reason
	}
}

func (p *process) stopping() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reason != ""
}

func (p *process) stopReason() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reason
}

func (p *process) stderrTail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.TrimSpace(string(p.stderr))
}

// Write collects stderr.
func (p *process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stderr = append(p.stderr, b...)
	if n := len(p.stderr) - maxStderrTail; n > 0 {
		p.stderr = append([]byte(nil), p.stderr[n:]...)
	}
	return len(b), nil
}

func (p *process) closeStdin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stdinClosed {
		p.stdinClosed = true
		close(p.in)
	}
}

func (p *process) stopIdleTimer() {
	if p.idle != nil {
		p.idle.Stop()
		p.idle = nil
	}
}

func (p *process) armIdleTimer(d time.Duration, f func()) {
	p.stopIdleTimer()
	p.idle = time.AfterFunc(d, f)
}

func (p *process) armInterruptTimer(d time.Duration, f func()) {
	if p.interrupt == nil {
		p.interrupt = time.AfterFunc(d, f)
	}
}

func (p *process) stopInterruptTimer() {
	if p.interrupt != nil {
		p.interrupt.Stop()
		p.interrupt = nil
	}
}

// kill ends the whole process group at once (SIGKILL); the reader sees EOF
// and reaps the process.
func (p *process) kill() {
	if p.cell != nil {
		p.cell.Kill()
		return
	}
	_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
}

// terminate ends the process: close stdin (the CLI exits within about half
// a second after its last result), then SIGTERM and later SIGKILL to its
// whole process group. It returns once the process is reaped.
func (p *process) terminate(grace time.Duration) {
	p.closeStdin()
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.pgid, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(2 * time.Second):
	}
	_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
	<-p.done
}

// startLocked starts a CLI process for the session.
func (s *session) startLocked() (*process, error) {
	cfg := s.h.cfg
	if err := s.workDirRefusal(); err != nil {
		return nil, err
	}
	resume := s.resumeModeLocked()
	tmp := filepath.Join(cfg.TmpRoot, s.conv)
	// A clean private tmp dir per process: no stale sockets or files of a
	// process that died (removed however deep the agent made it).
	if err := sandbox.RemoveTree(tmp); err != nil {
		s.h.log.Warn("clear the agent's tmp dir", "conversation", s.conv, "err", err)
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("create tmp dir: %w", err)
	}
	for _, d := range []string{s.workDir, s.configDir(), s.homeDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create the agent's directories: %w", err)
		}
	}
	if u := s.agentUser(); u != nil {
		if err := u.PrepareDir(cfg.TmpRoot, tmp); err != nil {
			return nil, err
		}
		for _, d := range []string{s.workDir, s.configDir(), s.homeDir()} {
			if err := sandbox.ChownTree(d, *u); err != nil {
				return nil, fmt.Errorf("give the agent its directories: %w", err)
			}
		}
	}
	secret := localproxy.NewPlaceholderSecret()
	base := s.h.proxy.BaseURL(s.conv)
	if base == "" {
		return nil, errors.New("local gateway proxy not listening")
	}
	args := []string{
		"--output-format", "stream-json", "--verbose", "--input-format", "stream-json",
		"--permission-prompt-tool", "stdio", "--permission-mode", cfg.PermissionMode,
		// No user, project or local settings files: the agent writes them
		// (CLAUDE_CONFIG_DIR, HOME, the workspace's .claude/), and keys such
		// as apiKeyHelper, otelHeadersHelper and env would run commands
		// nobody approved at every start (case C4). Managed settings (the
		// operator's) still apply.
		"--setting-sources=",
	}
	if resume {
		args = append(args, "--resume", s.meta.SessionID)
	} else {
		args = append(args, "--session-id", s.meta.SessionID)
	}
	if s.meta.Model != "" {
		args = append(args, "--model", s.meta.Model)
	}
	args = append(args, projectInstructionsArgs(s.workDir)...)
	mcp, err := s.mcpLocked()
	if err != nil {
		return nil, err
	}
	args = append(args, mcp.args...)
	env := buildSDKEnv(cfg, os.Environ(), agentDirs{config: s.configDir(), home: s.homeDir(), tmp: tmp}, base, secret)
	cmd, cell, err := s.commandLocked(args, env, tmp, mcp.config)
	if err != nil {
		mcp.release()
		return nil, err
	}
	p := &process{cmd: cmd, cell: cell, resumed: resume, in: make(chan []byte, stdinQueue), done: make(chan struct{}), turnStarted: make(chan struct{}, 1), lastActive: time.Now()}
	cmd.Stderr = p
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("stdin pipe: %w", err)
	}
	p.attachStdin(stdin)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	s.h.proxy.Register(s.conv, secret)
	start := cmd.Start
	if cell != nil {
		start = cell.Start
	}
	if err := start(); err != nil {
		s.h.proxy.Unregister(s.conv)
		mcp.release()
		return nil, fmt.Errorf("start %s: %w", cfg.ClaudeBin, err)
	}
	if cell != nil && cell.Listener() != nil {
		s.serveInJail(p, cell.Listener())
	}
	p.pgid = cmd.Process.Pid
	s.meta.Process = &sessionstore.ProcessInfo{PID: p.pgid, PGID: p.pgid, Holder: s.h.cfg.Identity.Holder,
		Incarnation: s.h.cfg.Identity.Incarnation, StartedAt: time.Now().UTC(), TmpDir: tmp}
	_ = s.saveLocked() // best effort: it only helps a successor clean up after a crash
	mcp.attach(s, p)
	s.h.log.Info("claude code started", "conversation", s.conv, "session", s.meta.SessionID, "pid", p.pgid, "resume", resume, "jailed", cell != nil)
	s.watchLimits(p)

	s.h.procs.Add(2)
	go func() {
		defer s.h.procs.Done()
		p.writeQueued(stdin)
	}()
	go func() { // stdout reader, then reaper
		defer s.h.procs.Done()
		r := streamjson.NewReader(stdout)
		for {
			if !r.HasLine() {
				s.commitEvents() // before waiting for the CLI
			}
			line, err := r.Next()
			if errors.Is(err, streamjson.ErrLineTooLong) {
				s.h.log.Warn("claude code line over the limit skipped", "conversation", s.conv)
				s.mu.Lock()
				s.emitLocked(contract.EventError, contract.ErrorEvent{Code: "cli_output_dropped",
					Message: fmt.Sprintf("an output line of the agent over %d MiB was dropped", streamjson.MaxLine>>20)})
				s.mu.Unlock()
				continue
			}
			if err != nil {
				if err != io.EOF {
					s.h.log.Warn("read claude code stdout", "conversation", s.conv, "err", err)
				}
				break
			}
			m, err := streamjson.Parse(line)
			if err != nil {
				s.h.log.Warn("unparsable claude code line", "conversation", s.conv, "err", err)
				continue
			}
			s.handle(p, m, r.HasLine())
		}
		s.commitEvents()
		p.closeStdin()
		err := cmd.Wait()
		p.exitCode = cmd.ProcessState.ExitCode()
		// Tools the CLI started may still run, in its group or in groups of
		// their own: end them all. In a jail the kernel did it already (the
		// PID namespace ended with the CLI); its control group goes too.
		_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
		if p.cell != nil {
			s.checkLimits(p)
			p.cell.Close()
		} else if n := killByMarker(tmp); n > 0 {
			s.h.log.Info("killed processes the agent left behind", "conversation", s.conv, "count", n)
		}
		if err != nil && p.stopReason() == "" {
			s.h.log.Warn("claude code exited", "conversation", s.conv, "exit_code", p.exitCode, "stderr", p.stderrTail())
		} else {
			s.h.log.Info("claude code exited", "conversation", s.conv, "exit_code", p.exitCode, "reason", p.stopReason())
		}
		// exited before done: whoever waits for the process to end (Stop)
		// then sees the session without it.
		s.exited(p)
		close(p.done)
	}()
	return p, nil
}
