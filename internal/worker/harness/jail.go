package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"golang.org/x/sys/unix"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/sandbox"
)

// This file starts a conversation's CLI in its jail (Config.Jail) and
// watches the jail's limits.

// Paths, inside an agent's jail, of the files the worker gives it.
const (
	// managedSettingsPath is where Claude Code on Linux reads its managed
	// (operator) settings: the highest-precedence source, which user,
	// project, local and command-line settings cannot override.
	managedSettingsPath = "/etc/claude-code/managed-settings.json"
	// jailMCPConfigPath holds the --mcp-config document.
	jailMCPConfigPath = "/run/talkide/mcp.json"
)

// managedSettings keep the permission policy the operator's (case C4):
// permission rules come only from here (none: every tool call the CLI does
// not consider safe is asked about, and the harness answers per
// Config.PermissionPolicy), hooks only from here (none: an agent-written
// hook would run commands nobody approved), and bypassPermissions mode is
// refused whatever a settings file says, unless the operator chose it
// (TALKIDE_PERMISSION_MODE=bypassPermissions, which the "ask" policy
// refuses). Checked with Claude Code 2.1.332 by
// TestAgentCannotLoosenThePermissionPolicy.
func managedSettings(cfg Config) []byte {
	bypass := `"permissions":{"disableBypassPermissionsMode":"disable"},`
	if cfg.PermissionMode == "bypassPermissions" {
		bypass = ""
	}
	return []byte(`{` + bypass + `"allowManagedPermissionRulesOnly":true,"allowManagedHooksOnly":true}` + "\n")
}

// limitPoll is how often a running jail's limit counters are read;
// limitEventEvery is the least time between two limit_reached events of
// one limit of one process.
const (
	limitPoll       = time.Second
	limitEventEvery = time.Minute
)

// commandLocked returns the command that runs the CLI with args and env:
// in the conversation's jail when the harness has one (then with its Cell),
// else as a plain child process of the agent user. The MCP configuration
// (servers' headers and environment may hold secrets) goes to the CLI in a
// file only this agent can read, never on its command line (case C5).
func (s *session) commandLocked(args, env []string, tmp string, mcpConfig json.RawMessage) (*exec.Cmd, *sandbox.Cell, error) {
	cfg := s.h.cfg
	if cfg.Jail == nil {
		if len(mcpConfig) > 0 {
			path := filepath.Join(tmp, "mcp-config.json")
			if err := writeAgentFile(path, mcpConfig, s.agentUser()); err != nil {
				return nil, nil, fmt.Errorf("write the MCP configuration: %w", err)
			}
			args = append(args, "--mcp-config", path)
		}
		cmd := exec.Command(cfg.ClaudeBin, args...)
		cmd.Dir = s.workDir
		cmd.Env = env
		// Own process group, so the CLI and every tool it spawns are
		// signalled together; Pdeathsig kills the CLI if the worker dies.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if u := s.agentUser(); u != nil {
			cmd.SysProcAttr.Credential = u.Credential()
		}
		return cmd, nil, nil
	}
	files := []sandbox.File{{Path: managedSettingsPath, Data: managedSettings(cfg)}}
	if cfg.PermissionPolicy == PolicyAsk {
		// HOME is the agent's: a ~/.gitconfig it wrote (a filter, a pager)
		// would run in the CLI's own git calls, which nobody is asked about
		// (the CLI neutralises the repository's settings, not these, and
		// passes git no GIT_CONFIG_GLOBAL). Empty read-only files stand in
		// their places: a mount the agent can neither change nor move.
		for _, p := range []string{".gitconfig", ".config/git/config"} {
			files = append(files, sandbox.File{Path: filepath.Join(s.homeDir(), p)})
		}
	}
	if len(mcpConfig) > 0 {
		files = append(files, sandbox.File{Path: jailMCPConfigPath, Data: mcpConfig})
		args = append(args, "--mcp-config", jailMCPConfigPath)
	}
	bin, err := filepath.EvalSymlinks(cfg.ClaudeBin)
	if err != nil {
		return nil, nil, fmt.Errorf("find the CLI: %w", err)
	}
	// A network of its own where the jail can have one: the worker serves
	// the local gateway proxy on a listener inside it, at the address of
	// ANTHROPIC_BASE_URL; nothing else is reachable.
	listen := ""
	if cfg.Jail.Helper != "" {
		u, err := url.Parse(s.h.proxy.BaseURL(s.conv))
		if err != nil || u.Host == "" {
			return nil, nil, fmt.Errorf("the local gateway proxy's address: %v", err)
		}
		listen = u.Host
	}
	cell, err := cfg.Jail.Command(sandbox.Spec{
		Name: s.conv, User: s.agentUser(), Path: bin, Args: args, Env: env, Dir: s.workDir,
		PrivateNetwork: listen != "", Listen: listen,
		Writable: []string{s.workDir, s.configDir(), s.homeDir(), tmp},
		// The CLI's npm package (its binary and what ships beside it).
		ReadOnly: []string{filepath.Dir(filepath.Dir(bin))},
		Files:    files,
		// Its /tmp, /var/tmp and /dev/shm on disk where no cgroup counts
		// memory filesystems; tmp is fresh for each process.
		Scratch: tmp,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("build the agent's jail: %w", err)
	}
	return cell.Cmd, cell, nil
}

// writeAgentFile creates path (which must not exist: the directory is the
// process's fresh tmp dir) with data, readable by u only.
func writeAgentFile(path string, data []byte, u *sandbox.User) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o400)
	if err != nil {
		return err
	}
	if u != nil {
		if err := f.Chown(int(u.UID), int(u.GID)); err != nil {
			f.Close()
			return err
		}
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// watchLimits reads p's limit counters every limitPoll, and watches the
// conversation's disk use (watchDisk), until p ends.
func (s *session) watchLimits(p *process) {
	disk := s.h.cfg.DiskLimit > 0 || s.h.cfg.DiskFileLimit > 0
	if p.cell == nil && !disk {
		return
	}
	s.h.procs.Go(func() {
		poll := limitPoll
		if disk {
			poll = diskPoll
		}
		t := time.NewTicker(poll)
		defer t.Stop()
		// The first walk is at the first turn's start (turnStarted); a
		// later turn's start walks only when the last walk may no longer
		// hold (staleAtTurnStart).
		w := diskWatch{s: s, p: p}
		nextLimits := time.Now().Add(limitPoll)
		for {
			turnStart := false
			select {
			case <-p.done:
				return
			case <-p.turnStarted:
				turnStart = true
			case <-t.C:
			}
			if p.cell != nil && !time.Now().Before(nextLimits) {
				s.checkLimits(p)
				nextLimits = time.Now().Add(limitPoll)
			}
			if disk && (turnStart && w.staleAtTurnStart() || w.due()) {
				w.check(turnStart)
			}
		}
	})
}

// checkLimits turns new hits of p's memory and process limits into
// limit_reached events.
func (s *session) checkLimits(p *process) {
	c := p.cell.Counters()
	now := time.Now()
	p.mu.Lock()
	// New hits since the last event of that limit; at most one event per
	// limit per limitEventEvery, so an agent that keeps hitting a limit
	// cannot flood its event log (the next event carries the total).
	oom := c.OOMKills - p.limitHits.OOMKills
	procs := c.ProcessLimitHits - p.limitHits.ProcessLimitHits
	if oom > 0 && now.Sub(p.limitEvents[0]) >= limitEventEvery {
		p.limitHits.OOMKills, p.limitEvents[0] = c.OOMKills, now
	} else {
		oom = 0
	}
	if procs > 0 && now.Sub(p.limitEvents[1]) >= limitEventEvery {
		p.limitHits.ProcessLimitHits, p.limitEvents[1] = c.ProcessLimitHits, now
	} else {
		procs = 0
	}
	p.mu.Unlock()
	l := s.h.cfg.Jail.Limits
	if !p.cell.HasCgroup() && l.MemoryBytes > 0 {
		// No cgroup bounds the jail: its processes' resident memory,
		// sampled, does (memoryGuard keeps the worker's whole below its
		// limit).
		if rss := p.cell.ResidentBytes(); rss > l.MemoryBytes && !p.stopping() {
			s.limitReached(contract.LimitReached{Limit: contract.LimitMemory, Max: l.MemoryBytes, Used: rss,
				Message: fmt.Sprintf("the agent's processes held %d MiB, over its memory limit of %d MiB; the running turn was stopped", rss>>20, l.MemoryBytes>>20)})
			p.beginStop("memory limit")
			p.kill()
			return
		}
	}
	if oom > 0 {
		s.limitReached(contract.LimitReached{Limit: contract.LimitMemory, Max: l.MemoryBytes, Used: c.OOMKills,
			Message: fmt.Sprintf("the agent's processes reached their memory limit of %d MiB; the largest was ended", l.MemoryBytes>>20)})
	}
	if procs > 0 {
		s.limitReached(contract.LimitReached{Limit: contract.LimitProcesses, Max: l.Processes, Used: c.ProcessLimitHits,
			Message: fmt.Sprintf("the agent reached its limit of %d processes; new ones were refused", l.Processes)})
	}
}

// Where agents have no cgroup of their own, the kernel's OOM killer, once
// the worker's memory (its pod's) runs out, ends the largest process,
// whichever conversation's: memoryGuard ends the jail that holds the most
// first, while memoryGuardAt of the limit is still free.
const (
	memoryGuardEvery = 250 * time.Millisecond
	memoryGuardAt    = 0.9
	// memoryGuardSettle is how long after stopping a jail the guard waits
	// for its memory to be freed before it would stop another.
	memoryGuardSettle = 2 * time.Second
)

// memoryGuard keeps the worker's own memory below memoryGuardAt of its
// limit, until ctx ends, by ending the jail with the most resident memory
// (the conversation gets a limit_reached event).
func (h *Harness) memoryGuard(ctx context.Context) {
	if _, _, ok := sandbox.OwnMemory(); !ok {
		h.log.Warn("the worker's own memory cannot be read: only the kernel's OOM killer bounds the agents' memory together")
		return
	}
	t := time.NewTicker(memoryGuardEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		used, limit, ok := sandbox.OwnMemory()
		if !ok || float64(used) < memoryGuardAt*float64(limit) {
			continue
		}
		var victim *session
		var victimProc *process
		var most int64
		for _, s := range h.loaded() {
			s.mu.Lock()
			p := s.proc
			s.mu.Unlock()
			if p == nil || p.cell == nil || p.stopping() {
				continue
			}
			if rss := p.cell.ResidentBytes(); rss > most {
				victim, victimProc, most = s, p, rss
			}
		}
		if victim == nil {
			continue
		}
		victim.limitReached(contract.LimitReached{Limit: contract.LimitMemory, Max: limit, Used: used,
			Message: fmt.Sprintf("the worker's memory is nearly exhausted (%d of %d MiB); this conversation's agent held the most (%d MiB), and its running turn was stopped",
				used>>20, limit>>20, most>>20)})
		victimProc.beginStop("worker memory")
		victimProc.kill()
		select {
		case <-ctx.Done():
			return
		case <-time.After(memoryGuardSettle):
		}
	}
}

// The disk watch: the filesystem's own counts of used blocks and inodes are
// read every diskPoll (one statfs per filesystem); the conversation's
// directories are walked (sandbox.MeasureDisk, bounded by the file limit)
// at its first turn's start, every Config.DiskCheckEvery, and at once when
// the filesystem grew by more bytes or inodes than the conversation had
// left. A later turn's start walks too, unless the last walk is less than
// turnStartWalkEvery old, found the conversation under its limits, and the
// filesystem has not grown by what it had left since: the agent is then not
// frozen for a walk at every turn of a quick exchange. What net counts can
// hide (space freed elsewhere on the same filesystem while the conversation
// grew, hard links, a filesystem without inode counts) is found by the next
// walk, at most turnStartWalkEvery later at a turn's start and
// DiskCheckEvery during a turn. A turn that starts over a limit may only
// free space: it is stopped once its files grow by diskShrinkSlack (its
// answer's transcript needs a little), and checked every limitPoll.
const (
	diskPoll           = 250 * time.Millisecond
	diskShrinkSlack    = 8 << 20
	diskShrinkFiles    = 100
	turnStartWalkEvery = 10 * time.Second
)

// diskWatch is the disk state of one process's watcher goroutine.
type diskWatch struct {
	s *session
	p *process
	// fs is the filesystems' use at the last walk; left and filesLeft what
	// the conversation had left then (below the limits).
	fs              fsUse
	left, filesLeft int64
	last            time.Time
	// floor, floorFiles: the use at the start of a turn that started over
	// a limit (floor > 0 while it runs, until the use is under again).
	floor, floorFiles int64
}

// fsUse is what the filesystems of a conversation's directories use;
// noInodes is set when one of them keeps no inode count (btrfs, a tmpfs
// without an inode limit).
type fsUse struct {
	bytes, inodes int64
	noInodes      bool
	// each holds one of the dirs per filesystem counted.
	each []string
}

// fsUsed returns the bytes and inodes in use on the filesystems of dirs
// together, each filesystem once (the workspace may be on the session
// volume, the tmp dir on local disk); zero if none can be read.
func fsUsed(dirs ...string) fsUse {
	var seen []unix.Fsid
	var total fsUse
	for _, d := range dirs {
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err != nil || slices.Contains(seen, st.Fsid) {
			continue
		}
		seen = append(seen, st.Fsid)
		total.bytes += int64(st.Blocks-st.Bfree) * st.Bsize
		total.inodes += int64(st.Files - st.Ffree)
		total.noInodes = total.noInodes || st.Files == 0
		total.each = append(total.each, d)
	}
	return total
}

// dirs are the conversation's directories the disk limit counts.
func (w *diskWatch) dirs() []string {
	return []string{w.s.workDir, w.s.configDir(), w.s.homeDir(), w.s.tmpDir()}
}

// grown reports whether the filesystems grew, since the last walk, by more
// than the conversation had left (bytes or inodes).
func (w *diskWatch) grown() bool {
	// Every diskPoll of every busy agent: one statfs per filesystem of the
	// last walk, all dirs only if one of those is gone.
	now := fsUsed(w.fs.each...)
	if len(now.each) < len(w.fs.each) {
		now = fsUsed(w.dirs()...)
	}
	return w.fs.bytes > 0 && (now.bytes-w.fs.bytes > w.left || now.inodes-w.fs.inodes > w.filesLeft)
}

// due reports whether the conversation's directories should be walked now.
func (w *diskWatch) due() bool {
	since := time.Since(w.last)
	if since >= w.s.h.cfg.DiskCheckEvery || w.floor > 0 && since >= limitPoll {
		return true
	}
	return w.grown()
}

// staleAtTurnStart reports whether a turn's start needs a walk: there was
// none yet or it is turnStartWalkEvery old, the last found the
// conversation over a limit (or could not measure it), inode growth cannot
// be seen, or the filesystems grew by what it had left since.
func (w *diskWatch) staleAtTurnStart() bool {
	return w.last.IsZero() || time.Since(w.last) >= turnStartWalkEvery || w.fs.bytes == 0 || w.fs.noInodes ||
		w.floor > 0 || w.left <= 0 || w.filesLeft <= 0 || w.grown()
}

// check measures the conversation's directories, and over a limit stops
// p's turn, unless the turn starts now: then it may only free space.
func (w *diskWatch) check(turnStart bool) {
	s, p, cfg := w.s, w.p, w.s.h.cfg
	fs := fsUsed(w.dirs()...)
	// The agent is stopped while its directories are walked: it cannot
	// move what it holds out of the walk's way as the walk goes.
	var thaw func()
	if p.cell != nil {
		thaw = p.cell.Freeze()
	}
	u := sandbox.MeasureDisk(w.dirs(), cfg.DiskFileLimit)
	if thaw != nil {
		thaw()
	}
	if m := s.h.metrics.Load(); m != nil {
		m.walks.Inc()
	}
	w.last = time.Now()
	used := u.Bytes
	if p.cell != nil {
		// Files deleted while the agent keeps them open take disk space no
		// directory shows.
		used += sandbox.DeletedOpenBytes(p.cell.Processes())
	}
	w.fs = fs
	w.left, w.filesLeft = diskShrinkSlack, diskShrinkFiles
	overBytes := cfg.DiskLimit > 0 && used > cfg.DiskLimit
	overFiles := cfg.DiskFileLimit > 0 && u.Stopped
	if !overBytes && !overFiles && u.Unmeasured == "" {
		w.floor, w.floorFiles = 0, 0
		w.left, w.filesLeft = 1<<62, int64(1)<<62
		if cfg.DiskLimit > 0 {
			w.left = cfg.DiskLimit - used
		}
		if cfg.DiskFileLimit > 0 {
			w.filesLeft = cfg.DiskFileLimit - u.Files
		}
		return
	}
	if p.stopping() {
		return
	}
	ev := contract.LimitReached{Limit: contract.LimitDisk, Max: cfg.DiskLimit, Used: used}
	var what string
	switch {
	case u.Unmeasured != "":
		what = fmt.Sprintf("the worker cannot measure %s, which counts as over the disk limit", u.Unmeasured)
	case overFiles:
		ev = contract.LimitReached{Limit: contract.LimitFiles, Max: cfg.DiskFileLimit, Used: u.Files}
		what = fmt.Sprintf("the conversation has more than %d files and directories, its limit", cfg.DiskFileLimit)
	default:
		what = fmt.Sprintf("the conversation's files take %d MiB, over its disk limit of %d MiB", used>>20, cfg.DiskLimit>>20)
	}
	if turnStart {
		w.floor, w.floorFiles = max(used, 1), u.Files
		ev.Message = what + "; this turn may only free space (it is stopped if the files grow): ask the agent to delete files"
		s.limitReached(ev)
		return
	}
	if w.floor > 0 && used <= w.floor+diskShrinkSlack && u.Files <= w.floorFiles+diskShrinkFiles {
		return // still over, but not growing: it may be freeing space
	}
	if w.floor > 0 {
		ev.Message = what + "; the files grew during a turn that may only free space, and it was stopped"
	} else {
		ev.Message = what + "; the running turn was stopped (ask the agent to delete files)"
	}
	s.limitReached(ev)
	p.beginStop("disk limit")
	p.kill()
}

func (s *session) limitReached(ev contract.LimitReached) {
	s.h.log.Warn("agent limit reached", "conversation", s.conv, "limit", ev.Limit, "max", ev.Max, "used", ev.Used)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.emitLocked(contract.EventLimitReached, ev)
}

// killOrphansAfterInterrupt ends, in p's jail, the processes an interrupted
// turn detached: now, and again shortly after, since a detached process is
// adopted by the jail's init only once the command that started it ends.
func (s *session) killOrphansAfterInterrupt(p *process) {
	if p.cell == nil {
		return
	}
	s.h.procs.Go(func() {
		n := 0
		for _, wait := range []time.Duration{0, 200 * time.Millisecond, time.Second} {
			select {
			case <-p.done:
				return
			case <-time.After(wait):
			}
			n += p.cell.KillOrphans()
		}
		if n > 0 {
			s.h.log.Info("ended processes an interrupted turn left behind", "conversation", s.conv, "count", n)
		}
	})
}

// maxProjectInstructions bounds the CLAUDE.md given to the CLI.
const maxProjectInstructions = 1 << 20

// projectInstructionsArgs gives the CLI the project's instructions
// (CLAUDE.md at the top of the workspace) that it no longer finds by
// itself once it reads no settings sources (--setting-sources=): appended
// to its system prompt. The CLI reads the file, as the agent, in the
// agent's view; the worker only looks whether the name exists, without
// opening it.
func projectInstructionsArgs(workDir string) []string {
	p := filepath.Join(workDir, "CLAUDE.md")
	// Only a plain file of a sane size: a link, a FIFO or a device would
	// have the CLI block or read without end at its start.
	if st, err := os.Lstat(p); err != nil || !st.Mode().IsRegular() || st.Size() > maxProjectInstructions {
		return nil
	}
	return []string{"--append-system-prompt-file", p}
}

// serveInJail serves the local gateway proxy to p's agent on ln, the
// listener inside its jail's network namespace, until p ends.
func (s *session) serveInJail(p *process, ln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	s.h.procs.Go(func() {
		<-p.done
		cancel()
	})
	s.h.procs.Go(func() {
		if err := s.h.proxy.ServeConversation(ctx, ln, s.conv); err != nil {
			s.h.log.Warn("serve the local gateway proxy in the agent's jail", "conversation", s.conv, "err", err)
		}
	})
}
