package buildjob

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkide/talkide/internal/worker/agentfs"
	"github.com/talkide/talkide/internal/worker/sandbox"
)

// LocalRunner runs builds on the worker's own machine, for the one-machine
// platform (`make run`), where no Kubernetes runs Jobs: Gradle, as the
// conversation's agent user, in the conversation's working tree,
//
//	gradle --no-daemon --console=plain --offline <tasks…> [--tests <filter>]
//
// with the tasks and filter checked as for a Job (plain names, never
// options), always offline (nothing is downloaded: a project's libraries
// must be on the machine, as Debian's are in /usr/share/java), with an
// environment of its own (PATH, HOME, GRADLE_USER_HOME, LANG, JAVA_HOME
// when set; nothing of the worker's, which holds its secrets) and a fresh
// Gradle home per build, removed afterwards.
//
// Containment: with Jail set, the build runs in a jail like the agent's
// (its own PID namespace, a view of only the working tree and the system
// read-only, a control group with the agent's limits named
// <conversation>-build), and every process of it ends with the build. Without
// one, it is a plain child process in a process group of its own, killed
// if the worker dies (Pdeathsig); when it ends, its process group and
// every process still carrying its GRADLE_USER_HOME in its environment are
// killed: a process that also cleared its environment and left the group
// escapes that, as an agent's can without a jail (TALKIDE_CONTAINMENT=weak).
// A build never outlives the worker, and a restarted worker does not pick
// it up again (unlike Jobs, which KubeRunner adopts).
//
// Disk: the Gradle home is outside the conversation's directories, which
// the agent's disk check measures, so a running build is measured itself
// every DiskCheckEvery (its Gradle home, its working tree and the files its
// processes deleted but hold open) and killed over DiskLimit (the agents'
// limit): failed, reason DiskLimit. The Gradle home is removed with
// sandbox.RemoveTree, however deep the build made it.
//
// Stale reports: Gradle leaves a test task's reports in place when the
// task is up to date, and a build that runs no tests leaves an earlier
// build's. So the build first removes build/test-results (ReportsDir),
// as the agent user, inside the jail, never as the worker: the test task
// then always runs again (its outputs are gone; compilation stays up to
// date), and the Report's Results are exactly the tests this build ran.
//
// Builds of one conversation run one after another (they share a working
// tree); at most MaxConcurrent run at once on the machine, the others
// queue and are told their place. Safe for concurrent use.
type LocalRunner struct {
	// Gradle is the path of the gradle launcher. Empty: "gradle" on the
	// worker's PATH, looked up on first use; when there is none, Run and
	// Check return ErrNoGradle, which says what to install.
	Gradle string
	// JavaHome, when set, is the JDK Gradle runs on (JAVA_HOME, and its bin
	// first on PATH; visible read-only in the jail). Empty: the java on
	// PATH (Debian's default JDK, which the gradle package pulls in).
	JavaHome string
	// WorkspaceRoot holds the working trees, <WorkspaceRoot>/<conversation>,
	// as the harness's Config.WorkspaceRoot. Required.
	WorkspaceRoot string
	// TmpRoot is where each build's Gradle home is made
	// (<TmpRoot>/talkide-gradle-*, owned by the build's user, removed when
	// the build ends). Default: the worker's temp directory (os.TempDir).
	TmpRoot string
	// Jail, when set, runs each build in a jail of its own with the jail's
	// Limits (the agents'). Nil: a plain child process (see above).
	Jail *sandbox.Jail
	// MaxConcurrent is how many builds run at once on the machine; the
	// others wait in order. Default 1: a Gradle build is a JVM or two of
	// hundreds of MB each, beside the agents.
	MaxConcurrent int
	// DiskLimit caps the disk a running build takes, in allocated bytes:
	// its Gradle home (HOME and GRADLE_USER_HOME, under TmpRoot, outside
	// the conversation's directories the agent's disk check measures), its
	// working tree, and the files its processes deleted but hold open. It
	// is measured every DiskCheckEvery; over it the build is killed and
	// its outcome is failed, reason DiskLimit. Zero: the jail's
	// Limits.DiskBytes (the agents' limit, TALKIDE_AGENT_DISK), or no limit
	// without a jail; negative: no limit.
	DiskLimit int64
	// DiskCheckEvery is how often a running build's disk use is measured.
	// Default 2 seconds.
	DiskCheckEvery time.Duration
	// Timeout ends a build that runs longer (queueing not counted): it is
	// killed and its outcome is failed, reason DeadlineExceeded. Default 30
	// minutes, as Base.ActiveDeadline for a Job.
	Timeout time.Duration
	// Logger receives a line per build started and ended. Default
	// slog.Default().
	Logger *slog.Logger

	once      sync.Once
	gradle    string // the launcher, resolved
	gradleDir string // its installation (shown read-only in a jail)
	initErr   error
	slots     queue // MaxConcurrent slots

	convMu sync.Mutex
	convs  map[string]chan struct{} // conversation → held while one of its builds runs; guarded by convMu
}

var _ Runner = (*LocalRunner)(nil)

// ErrNoGradle is returned (wrapped) by LocalRunner's Run and Check when
// Gradle is not installed.
var ErrNoGradle = errors.New("gradle is not installed on this machine: install Debian's gradle and junit4 packages (`make tools` does, as root: apt-get install gradle junit4)")

// localPath is the build's PATH (JavaHome's bin goes first when set).
const localPath = "/usr/local/bin:/usr/bin:/bin"

// cleanAndRun is the build's command line, run by /bin/sh as the build's
// user in the working tree: remove the reports of earlier builds, then
// become gradle ($0) with the checked arguments ($@), never interpreted
// by the shell.
const cleanAndRun = `rm -rf -- ` + ReportsDir + ` && exec "$0" "$@"`

func (l *LocalRunner) init() {
	l.once.Do(func() {
		if l.MaxConcurrent <= 0 {
			l.MaxConcurrent = 1
		}
		l.slots.max = l.MaxConcurrent
		if l.Timeout <= 0 {
			l.Timeout = 30 * time.Minute
		}
		if l.Logger == nil {
			l.Logger = slog.Default()
		}
		if l.DiskLimit == 0 && l.Jail != nil {
			l.DiskLimit = l.Jail.Limits.DiskBytes
		}
		if l.DiskLimit < 0 {
			l.DiskLimit = 0
		}
		if l.DiskCheckEvery <= 0 {
			l.DiskCheckEvery = 2 * time.Second
		}
		if l.TmpRoot == "" {
			l.TmpRoot = os.TempDir()
		}
		l.convs = map[string]chan struct{}{}
		if l.WorkspaceRoot == "" {
			l.initErr = errors.New("local build runner: no workspace root")
			return
		}
		name := l.Gradle
		if name == "" {
			name = "gradle"
		}
		path, err := exec.LookPath(name)
		if err != nil {
			l.initErr = fmt.Errorf("%w (looked for %s: %v)", ErrNoGradle, name, err)
			return
		}
		// The launcher is a script beside its libraries (Debian:
		// /usr/bin/gradle → /usr/share/gradle/bin/gradle): the jail shows
		// the installation, <dir>/bin/gradle's <dir>.
		if l.gradle, err = filepath.Abs(path); err == nil {
			l.gradle, err = filepath.EvalSymlinks(l.gradle)
		}
		if err != nil {
			l.initErr = fmt.Errorf("%w (%s: %v)", ErrNoGradle, path, err)
			return
		}
		l.gradleDir = filepath.Dir(filepath.Dir(l.gradle))
	})
}

// Check reports whether builds can run: ErrNoGradle (wrapped) when Gradle
// is missing, or an error for a runner without a WorkspaceRoot. The worker
// calls it at start to say so once, before any agent asks for a build.
func (l *LocalRunner) Check() error {
	l.init()
	return l.initErr
}

// Run implements Runner. req.RunAsUser is the user the build runs as, the
// owner of the working tree: any uid but 0 when the worker runs as root,
// and only the worker's own uid otherwise (a worker that is not root runs
// its agents as itself). Errors: the refused request or spec, ErrNoGradle,
// a working tree that is missing or not a directory of that user, or a
// build that could not be started; a build that ran and failed, was
// cancelled or timed out is a Report.
func (l *LocalRunner) Run(ctx context.Context, req Request, spec Spec, hooks Hooks) (Report, error) {
	start := time.Now()
	rep := Report{Runner: "local", ExitCode: -1, Outcome: Outcome{Job: JobName(KindGradle, req.Conversation, req.ID)}}
	l.init()
	args, err := spec.gradleArgs(true)
	err = errors.Join(req.validate(), err)
	if euid := os.Geteuid(); euid != 0 && req.RunAsUser != int64(euid) && req.RunAsUser > 0 {
		err = errors.Join(err, fmt.Errorf("run as user %d: a worker that is not root builds as its own uid %d only", req.RunAsUser, euid))
	}
	if err != nil {
		return rep, err
	}
	if l.initErr != nil {
		return rep, l.initErr
	}
	tree := filepath.Join(l.WorkspaceRoot, req.Conversation)
	if err := checkTree(tree, req.RunAsUser); err != nil {
		return rep, err
	}

	if err := l.acquire(ctx, req.Conversation, hooks.progress); err != nil {
		rep.Outcome.Phase, rep.Outcome.Reason, rep.Outcome.Message = PhaseCancelled, "Cancelled", "cancelled while queued"
		rep.DurationMS = since(start)
		return rep, nil
	}
	defer l.release(req.Conversation)
	hooks.progress(Progress{Started: true})
	l.Logger.Info("build started", "conversation", req.Conversation, "build", req.ID, "tasks", spec.Tasks, "tests", spec.Tests, "jailed", l.Jail != nil)

	logs := newTail(LogTailLines)
	res, err := l.run(ctx, req, tree, args, func(s string) {
		logs.add(s)
		hooks.line(s)
	})
	rep.LogTail = logs.get()
	if err != nil {
		rep.DurationMS = since(start)
		return rep, err
	}
	rep.ExitCode = res.exitCode
	o := &rep.Outcome
	switch {
	case res.cancelled:
		o.Phase, o.Reason, o.Message = PhaseCancelled, "Cancelled", "cancelled"
	case res.timedOut:
		o.Phase, o.Reason, o.Message = PhaseFailed, "DeadlineExceeded", fmt.Sprintf("the build ran longer than its limit of %v and was stopped", l.Timeout)
	case res.diskOver != "":
		o.Phase, o.Reason, o.Message = PhaseFailed, "DiskLimit", res.diskOver
	case res.exitCode == 0:
		o.Phase = PhaseSucceeded
	case res.oomKills > 0:
		o.Phase, o.Reason = PhaseFailed, "OOMKilled"
		o.Message = fmt.Sprintf("the build reached its memory limit of %d MiB (exit status %d)", l.Jail.Limits.MemoryBytes>>20, res.exitCode)
	case res.exitCode > 128:
		o.Phase, o.Reason = PhaseFailed, "Signaled"
		o.Message = fmt.Sprintf("gradle was ended by signal %d (%v)", res.exitCode-128, syscall.Signal(res.exitCode-128))
	default:
		o.Phase, o.Reason, o.Message = PhaseFailed, "ExitCode", fmt.Sprintf("gradle exited with status %d", res.exitCode)
	}
	if !res.cancelled {
		rep.readResults(l.WorkspaceRoot, req)
	}
	rep.DurationMS = since(start)
	l.Logger.Info("build ended", "conversation", req.Conversation, "build", req.ID, "phase", o.Phase, "reason", o.Reason,
		"exit_code", rep.ExitCode, "tests", rep.Results.Tests, "failures", rep.Results.Failures+rep.Results.Errors, "duration_ms", rep.DurationMS)
	return rep, nil
}

// checkTree makes sure the working tree is a directory (not a link) of
// uid; as root, only then does the build's user enter it (the change of
// directory happens in the child, after it took the user's credentials).
func checkTree(tree string, uid int64) error {
	st, err := os.Lstat(tree)
	if err != nil {
		return fmt.Errorf("the conversation's working tree: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || !ok {
		return fmt.Errorf("the conversation's working tree %s: not a directory", tree)
	}
	if int64(sys.Uid) != uid {
		return fmt.Errorf("the conversation's working tree %s: owned by uid %d, not the build's user %d", tree, sys.Uid, uid)
	}
	return nil
}

// acquire waits until no other build of conv runs, then for a machine
// slot. While it waits for conv's running build it reports place 1.
func (l *LocalRunner) acquire(ctx context.Context, conv string, progress func(Progress)) error {
	for reported := false; ; {
		l.convMu.Lock()
		busy, ok := l.convs[conv]
		if !ok {
			l.convs[conv] = make(chan struct{})
			l.convMu.Unlock()
			break
		}
		l.convMu.Unlock()
		if !reported {
			progress(Progress{Queued: 1})
			reported = true
		}
		select {
		case <-busy:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := l.slots.acquire(ctx, progress); err != nil {
		l.releaseConv(conv)
		return err
	}
	return nil
}

func (l *LocalRunner) release(conv string) {
	l.slots.release()
	l.releaseConv(conv)
}

func (l *LocalRunner) releaseConv(conv string) {
	l.convMu.Lock()
	defer l.convMu.Unlock()
	close(l.convs[conv])
	delete(l.convs, conv)
}

// localResult is how a build's process ended.
type localResult struct {
	exitCode            int
	cancelled, timedOut bool
	oomKills            int64
	diskOver            string // why the build was killed over its disk limit
}

// run runs the build's process to its end, passing each line of its
// output (stdout and stderr, in the order written) to line, and leaves no
// process of it behind.
func (l *LocalRunner) run(ctx context.Context, req Request, tree string, args []string, line func(string)) (localResult, error) {
	res := localResult{exitCode: -1}
	asRoot := os.Geteuid() == 0
	var user *sandbox.User
	if asRoot {
		user = &sandbox.User{UID: uint32(req.RunAsUser), GID: uint32(req.RunAsUser)}
	}
	home, err := os.MkdirTemp(l.TmpRoot, "talkide-gradle-")
	if err != nil {
		return res, fmt.Errorf("make the build's Gradle home: %w", err)
	}
	// Descriptor-based, following no link and bounded in descriptors
	// however deep the build made it (sandbox.RemoveTree), as the build's
	// user wrote in it; what cannot be removed is logged, not left unsaid.
	defer func() {
		if err := sandbox.RemoveTree(home); err != nil {
			l.Logger.Error("remove the build's Gradle home", "conversation", req.Conversation, "build", req.ID, "dir", home, "err", err)
		}
	}()
	if user != nil {
		if err := agentfs.ChownDir(home, user.UID, user.GID); err != nil {
			return res, fmt.Errorf("give the build's Gradle home to its user: %w", err)
		}
	}
	env := l.env(home)
	argv := append([]string{"-c", cleanAndRun, l.gradle}, args...)

	pr, pw, err := os.Pipe()
	if err != nil {
		return res, fmt.Errorf("start the build: %w", err)
	}
	defer pr.Close()
	var cmd *exec.Cmd
	var cell *sandbox.Cell
	if l.Jail != nil {
		ro := []string{l.gradleDir}
		if l.JavaHome != "" {
			ro = append(ro, l.JavaHome)
		}
		cell, err = l.Jail.Command(sandbox.Spec{
			Name: req.Conversation + "-build", User: user, Path: "/bin/sh", Args: argv, Env: env, Dir: tree,
			Writable: []string{tree, home}, ReadOnly: ro,
			// Gradle runs offline: the build's code (the agent's) reaches
			// nothing of the host, no other conversation, no internet.
			PrivateNetwork: true,
		})
		if err != nil {
			pw.Close()
			return res, fmt.Errorf("build the build's jail: %w", err)
		}
		cmd = cell.Cmd
	} else {
		cmd = exec.Command("/bin/sh", argv...)
		cmd.Dir, cmd.Env = tree, env
		// Its own process group, to be killed as one; Pdeathsig ends it
		// with the worker.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if user != nil {
			cmd.SysProcAttr.Credential = user.Credential()
		}
	}
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = pw, pw
	if cell != nil {
		err = cell.Start() // on error, the cell is closed
	} else {
		err = cmd.Start()
	}
	pw.Close() // the build holds its copies
	if err != nil {
		return res, fmt.Errorf("start the build: %w", err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		r := bufio.NewReaderSize(pr, 64<<10)
		for {
			// A last line without a newline is the build's too: its
			// output ends with its processes.
			s, whole, err := readLine(r)
			if whole || s != "" {
				line(s)
			}
			if err != nil {
				return
			}
		}
	}()

	// Kills are sent only while the build's first process is not reaped
	// (exited is closed before Wait): its pid, which is also its process
	// group's id, cannot belong to another process then.
	marker := "GRADLE_USER_HOME=" + home
	kill := func() {
		if cell != nil {
			cell.Kill()
			return
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		killByEnv(marker)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		waitExit(cmd.Process.Pid)
	}()
	// The build's processes, for the files they deleted but hold open:
	// its control group, or its process group and marked processes.
	pids := func() []int {
		if cell != nil {
			return cell.Processes()
		}
		return groupOrMarked(cmd.Process.Pid, marker)
	}
	var diskTick <-chan time.Time
	if l.DiskLimit > 0 {
		t := time.NewTicker(l.DiskCheckEvery)
		defer t.Stop()
		diskTick = t.C
	}
	runCtx, cancel := context.WithTimeout(ctx, l.Timeout)
	defer cancel()
wait:
	for {
		select {
		case <-exited:
			break wait
		case <-runCtx.Done():
			res.cancelled = ctx.Err() != nil
			res.timedOut = !res.cancelled
			kill()
			<-exited
			break wait
		case <-diskTick:
			if over := l.overDisk(req, home, tree, pids); over != "" {
				res.diskOver = over
				kill()
				<-exited
				break wait
			}
		}
	}
	// Whatever the build left running (a server a test started) ends with
	// it: its process group and marked processes, or, in a jail, its
	// control group (its PID namespace ends with bwrap's init besides).
	kill()
	werr := cmd.Wait()
	if cell != nil {
		res.oomKills = cell.Counters().OOMKills
		cell.Close()
	}
	var exitErr *exec.ExitError
	switch {
	case res.cancelled || res.timedOut || res.diskOver != "":
		// Killed by the runner: no status of its own.
	case werr == nil:
		res.exitCode = 0
	case errors.As(werr, &exitErr):
		res.exitCode = exitCode(exitErr)
	default:
		return res, fmt.Errorf("wait for the build: %w", werr)
	}
	// The output is read to its end, unless something of the build still
	// holds it open (which the kills above should have prevented).
	select {
	case <-read:
	case <-time.After(5 * time.Second):
		l.Logger.Warn("build output still open after the build ended", "conversation", req.Conversation, "build", req.ID)
		pr.Close()
		<-read
	}
	return res, nil
}

// overDisk measures the disk a running build takes (its Gradle home, its
// working tree, and what its processes hold open deleted) and, over
// DiskLimit, says so; "" when within it.
func (l *LocalRunner) overDisk(req Request, home, tree string, pids func() []int) string {
	// What cannot be measured (a directory too deep to walk) counts as
	// over: the build could hide anything there.
	homeUse, err := sandbox.DiskUsage(home)
	if err != nil {
		l.Logger.Warn("measure the build's Gradle home", "conversation", req.Conversation, "build", req.ID, "err", err)
		return fmt.Sprintf("the build's Gradle home could not be measured (%v), which counts as over the disk limit of %d MiB; the build was stopped", err, l.DiskLimit>>20)
	}
	treeUse, err := sandbox.DiskUsage(tree)
	if err != nil {
		l.Logger.Warn("measure the build's working tree", "conversation", req.Conversation, "build", req.ID, "err", err)
		return fmt.Sprintf("the build's working tree could not be measured (%v), which counts as over the disk limit of %d MiB; the build was stopped", err, l.DiskLimit>>20)
	}
	deleted := sandbox.DeletedOpenBytes(pids())
	used := homeUse + treeUse + deleted
	if used <= l.DiskLimit {
		return ""
	}
	l.Logger.Warn("build over its disk limit: killed", "conversation", req.Conversation, "build", req.ID,
		"limit", l.DiskLimit, "gradle_home", homeUse, "working_tree", treeUse, "deleted_open", deleted)
	return fmt.Sprintf("the build took %d MiB of disk (Gradle home %d MiB, working tree %d MiB, files deleted but held open %d MiB), over the disk limit of %d MiB; the build was stopped",
		used>>20, homeUse>>20, treeUse>>20, deleted>>20, l.DiskLimit>>20)
}

// groupOrMarked returns the processes of process group pgid (none for
// -1) and those whose environment holds the entry marker (see killByEnv).
func groupOrMarked(pgid int, marker string) []int {
	want := []byte(marker + "\x00")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			// pid (comm) state ppid pgrp …: comm may hold anything, so
			// the fields are read after its last ')'.
			if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
				if f := bytes.Fields(stat[i+1:]); len(f) > 2 {
					if g, err := strconv.Atoi(string(f[2])); err == nil && g == pgid {
						pids = append(pids, pid)
						continue
					}
				}
			}
		}
		f, err := os.Open("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		env, _ := io.ReadAll(io.LimitReader(f, maxEnviron))
		f.Close()
		if bytes.HasPrefix(env, want) || bytes.Contains(env, append([]byte{0}, want...)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitExit returns once process pid has exited, without reaping it
// (waitid WNOWAIT): until cmd.Wait, its pid stays its own.
func waitExit(pid int) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// env is the build's whole environment: nothing of the worker's.
func (l *LocalRunner) env(home string) []string {
	path := localPath
	env := []string{"HOME=" + home, "GRADLE_USER_HOME=" + home, "LANG=C.UTF-8"}
	if l.JavaHome != "" {
		path = filepath.Join(l.JavaHome, "bin") + ":" + path
		env = append(env, "JAVA_HOME="+l.JavaHome)
	}
	return append(env, "PATH="+path)
}

// exitCode is a finished process's exit status, or 128 + the signal that
// ended it (as a shell, bwrap and Kubernetes report it).
func exitCode(e *exec.ExitError) int {
	if ws, ok := e.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return e.ExitCode()
}

// maxEnviron bounds how much of a process's environment killByEnv reads:
// a build's process can make its environment as large as its stack limit
// allows.
const maxEnviron = 1 << 20

// killByEnv kills every process whose environment holds the entry marker
// (a build's unique GRADLE_USER_HOME): what a build without a jail started
// and detached from its process group, however it did (setsid, a double
// fork), as long as it kept its environment.
func killByEnv(marker string) {
	for _, pid := range groupOrMarked(-1, marker) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
