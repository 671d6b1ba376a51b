package sandbox

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Jail confines each conversation's agent (its CLI and every process the
// CLI starts) with kernel mechanisms, set up by bubblewrap (bwrap, the
// audited tool Claude Code's own Linux sandbox and Flatpak use) rather than
// namespace code of our own:
//
//   - a PID namespace of its own: the agent sees only its own processes in a
//     private /proc, and when the CLI exits, the kernel kills every process
//     left in the namespace, however it detached (setsid, double fork,
//     cleared environment). bwrap's --die-with-parent does the same when the
//     worker dies.
//   - a mount namespace with a view of its own: the host's system
//     directories read-only (ReadOnly), its conversation's directories
//     read-write, a private /tmp, and the files the worker gives it (the
//     managed settings that carry the operator's permission policy, the MCP
//     configuration) read-only and visible to no other process. The session
//     volume, the worker's state and other conversations are not in it.
//   - IPC and UTS namespaces, a new session (no terminal to inject into),
//     no capabilities, and a user namespace when the agent is not root.
//   - with Spec.PrivateNetwork, a network namespace of its own (loopback
//     only), and with Spec.Listen a listener in it the worker serves.
//   - a seccomp filter (seccomp.go): no disk reserved without writing it,
//     no io_uring, no user namespace of its own.
//   - with Cgroups, a control group of its own with Limits (memory,
//     processes, CPU weight), counted (Counters) and killed as a whole.
//
// The worker needs, from its host or pod: bwrap and prlimit on PATH; for
// agents of their own uids, root (or CAP_SETUID/CAP_SETGID) in the worker's
// user namespace; unprivileged user namespaces allowed (bwrap creates one
// per agent; seccomp profiles such as Docker's default forbid this, so the
// pod needs an Unconfined or a custom profile) and an unmasked /proc (so a
// new procfs may be mounted: procMount Unmasked, or a privileged container);
// for limits, a writable cgroup (v2 delegated, or v1). Check tries all
// of that once at start.
type Jail struct {
	// Bwrap is the bubblewrap binary. Required.
	Bwrap string
	// Prlimit is util-linux's prlimit, used inside the jail to cap the size
	// of any one file the agent writes (Limits.DiskBytes) and forbid core
	// dumps; "" skips that.
	Prlimit string
	// Cgroups, when set, gives each agent a control group with Limits.
	Cgroups *Cgroups
	// Limits are each agent's limits (with defaults applied by the caller).
	Limits Limits
	// ReadOnly are host paths every agent sees read-only at the same path.
	// Nil means DefaultReadOnly. /etc is rebuilt from the host's entries, so
	// the worker can add its own files under it (/etc/claude-code) without
	// changing the host.
	ReadOnly []string
	// SharedProc gives the agent the worker's /proc instead of a new one,
	// for hosts where no procfs can be mounted (a pod whose /proc the
	// runtime masks, as every pod with hostUsers: true): the agent then
	// sees the pod's process list and command lines, though it can neither
	// read other users' process environments or memory nor signal a
	// process outside its own PID namespace. Check sets it when it must.
	SharedProc bool
	// Helper is the program (the worker's own binary: MaybeRunHelper) that
	// gives a jail with Spec.Listen its listener, at a path agents can
	// reach (InstallHelper); "" refuses Listen.
	Helper string
}

// OOMScoreAdj is every agent process's oom_score_adj: when memory runs out
// where the agents run (the pod's limit, the host), the kernel ends the
// largest agent before the worker.
const OOMScoreAdj = 1000

// DefaultReadOnly is what an agent sees of the host: the operating system
// and the tools installed with it. Home directories, /root, /srv, /var,
// /run (sockets of local services) and the worker's data are not in it.
var DefaultReadOnly = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/etc"}

// File is a file given to the agent read-only at Path inside its view.
type File struct {
	Path string
	Data []byte
}

// Spec is one agent process to start in a jail.
type Spec struct {
	// Name names its control group (the conversation id).
	Name string
	// User is the account it runs as; nil runs it as the worker's own.
	User *User
	// Path and Args are the program and its arguments (Args[0] excluded).
	Path string
	Args []string
	// Env is its whole environment.
	Env []string
	// Dir is its working directory; it must be in Writable.
	Dir string
	// Writable are host directories it sees read-write at the same path.
	Writable []string
	// ReadOnly are further host paths it sees read-only (the CLI binary's
	// directory).
	ReadOnly []string
	// Files are given to it read-only.
	Files []File
	// PrivateNetwork gives the jail a network namespace of its own, with
	// only a loopback interface: no host service, no other conversation, no
	// internet.
	PrivateNetwork bool
	// Listen, with PrivateNetwork, is an address ("127.0.0.1:port", port
	// 1024 or above) on which a TCP listener is made inside the jail's
	// network namespace before its program runs; Cell.Listener returns it
	// once started, and the worker serves the agent on it (the local
	// gateway proxy). Needs Jail.Helper.
	Listen string
	// Scratch, when set, is a fresh directory of the agent's (counted in
	// its disk use) that holds its /tmp, /var/tmp and /dev/shm where the
	// jail has no control group: on disk, not memory no cgroup would
	// count (Command makes the subdirectories, the agent's).
	Scratch string
}

// Cell is one started (or ready to start) jailed process.
type Cell struct {
	// Cmd is the bwrap process; set Stdin, Stdout and Stderr (or take
	// pipes) before Start, and Wait for it as for any command.
	Cmd *exec.Cmd
	cg  *Cgroup
	// block is the write end of bwrap's --block-fd: the jailed program
	// does not start before it is written to (after the jail's processes
	// were put in their control group).
	block *os.File
	// parentFiles are the parent's copies of the child's extra files.
	parentFiles []*os.File
	// listenSock receives the listener of Spec.Listen; listener is it.
	listenSock *os.File
	listener   net.Listener
}

// Listener returns the listener made inside the jail's network namespace
// for Spec.Listen, once Start returned; nil without one. The caller closes
// it.
func (c *Cell) Listener() net.Listener { return c.listener }

// Command prepares the jailed process of spec. Call Start on the result, or
// Close if it will not be started.
func (j *Jail) Command(spec Spec) (*Cell, error) {
	if j.Bwrap == "" {
		return nil, errors.New("jail: no bwrap binary")
	}
	c := &Cell{}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	var extra []*os.File
	// fd numbers in the child: 3 + index in extra.
	addFile := func(f *os.File) int {
		extra = append(extra, f)
		c.parentFiles = append(c.parentFiles, f)
		return 2 + len(extra)
	}
	blockR, blockW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("jail: %w", err)
	}
	c.block = blockW
	blockFD := addFile(blockR)

	args := []string{"--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
		"--unshare-cgroup-try", "--hostname", "talkide-agent", "--cap-drop", "ALL"}
	var helper, helperBind []string
	if spec.PrivateNetwork {
		args = append(args, "--unshare-net")
		if spec.Listen != "" {
			if j.Helper == "" {
				return nil, errors.New("jail: a listener in the jail needs Jail.Helper")
			}
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return nil, fmt.Errorf("jail: %w", err)
			}
			c.listenSock = os.NewFile(uintptr(fds[0]), "jail-listen")
			child := addFile(os.NewFile(uintptr(fds[1]), "jail-listen-child"))
			helperBind = []string{"--ro-bind", j.Helper, jailHelperPath}
			helper = []string{jailHelperPath, HelperArg, strconv.Itoa(child), spec.Listen, "--"}
		}
	} else if spec.Listen != "" {
		return nil, errors.New("jail: Listen needs PrivateNetwork")
	}
	if spec.User != nil && spec.User.UID != 0 || spec.User == nil && os.Geteuid() != 0 {
		args = append(args, "--unshare-user")
		// No user namespace of its own inside: their root reaches kernel
		// code (netfilter, mounts) no agent needs. bwrap sets that through
		// a /proc/sys of the jail, which the worker's /proc (SharedProc)
		// keeps read-only.
		if !j.SharedProc {
			args = append(args, "--disable-userns")
		}
	}
	ro := j.ReadOnly
	if ro == nil {
		ro = DefaultReadOnly
	}
	for _, p := range ro {
		if filepath.Clean(p) == "/etc" {
			a, err := etcArgs()
			if err != nil {
				return nil, err
			}
			args = append(args, a...)
			continue
		}
		args = append(args, bindArgs("--ro-bind", p)...)
	}
	if j.SharedProc {
		args = append(args, "--bind", "/proc", "/proc")
	} else {
		args = append(args, "--proc", "/proc")
	}
	// The agent's /tmp, /var/tmp and /dev/shm: sized memory filesystems,
	// whose pages its control group counts; without one, directories of
	// its scratch space on disk, which its disk use counts (tmpfs pages
	// are memory no process holds, which nothing would bound or
	// attribute). /dev, bwrap's own tmpfs, becomes read-only around
	// /dev/shm.
	args = append(args, "--dev", "/dev")
	if j.Cgroups == nil && spec.Scratch != "" {
		dirs, err := scratchDirs(spec.Scratch, spec.User)
		if err != nil {
			return nil, err
		}
		args = append(args, "--bind", dirs[0], "/dev/shm", "--bind", dirs[1], "/tmp", "--bind", dirs[2], "/var/tmp")
	} else {
		tmp, varTmp, shm := tmpfsSizes(j.Limits.MemoryBytes)
		args = append(args, sizedTmpfs(shm, "/dev/shm")...)
		args = append(args, sizedTmpfs(tmp, "/tmp")...)
		args = append(args, sizedTmpfs(varTmp, "/var/tmp")...)
	}
	args = append(args, "--tmpfs", "/run")
	args = append(args, helperBind...)
	for _, p := range spec.ReadOnly {
		args = append(args, bindArgs("--ro-bind", p)...)
	}
	for _, w := range spec.Writable {
		args = append(args, "--bind", w, w)
	}
	for _, f := range spec.Files {
		fd, err := unix.MemfdCreate("talkide-jail-file", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("jail: memfd: %w", err)
		}
		mf := os.NewFile(uintptr(fd), f.Path)
		if _, err := mf.Write(f.Data); err != nil {
			mf.Close()
			return nil, fmt.Errorf("jail: write %s: %w", f.Path, err)
		}
		if _, err := mf.Seek(0, 0); err != nil {
			mf.Close()
			return nil, fmt.Errorf("jail: %w", err)
		}
		n := addFile(mf)
		args = append(args, "--dir", filepath.Dir(f.Path), "--perms", "0444", "--ro-bind-data", strconv.Itoa(n), f.Path)
	}
	// The tmpfs mounts bwrap built (/, /etc, /run) belong to the agent's
	// user namespace and so to the agent: read-only, so it can neither
	// rename /etc/claude-code (and the managed settings with it) nor /etc
	// nor put anything beside them. Only its binds and /tmp are writable.
	args = append(args, "--remount-ro", "/etc", "--remount-ro", "/run", "--remount-ro", "/dev", "--remount-ro", "/")
	if spec.Dir != "" {
		args = append(args, "--chdir", spec.Dir)
	}
	filter, err := seccompFilter()
	if err != nil {
		return nil, err
	}
	if filter != nil {
		fd, err := unix.MemfdCreate("talkide-seccomp", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("jail: memfd: %w", err)
		}
		mf := os.NewFile(uintptr(fd), "seccomp")
		if _, err := mf.Write(filter); err != nil {
			mf.Close()
			return nil, fmt.Errorf("jail: seccomp filter: %w", err)
		}
		if _, err := mf.Seek(0, 0); err != nil {
			mf.Close()
			return nil, fmt.Errorf("jail: %w", err)
		}
		args = append(args, "--seccomp", strconv.Itoa(addFile(mf)))
	}
	args = append(args, "--block-fd", strconv.Itoa(blockFD), "--")
	args = append(args, helper...)
	if j.Prlimit != "" {
		lim := []string{j.Prlimit, "--core=0"}
		if d := j.Limits.DiskBytes; d > 0 {
			lim = append(lim, "--fsize="+strconv.FormatInt(d, 10))
		}
		// Without a control group the process limit is the kernel's per-
		// user one: the agent's processes all run as its uid in its user
		// namespace.
		if n := j.Limits.Processes; n > 0 && j.Cgroups == nil {
			lim = append(lim, "--nproc="+strconv.FormatInt(n, 10))
		}
		args = append(args, append(lim, "--")...)
	}
	args = append(args, spec.Path)
	args = append(args, spec.Args...)

	cmd := exec.Command(j.Bwrap, args...)
	cmd.Env = spec.Env
	cmd.ExtraFiles = extra
	// Its own process group, and killed if the worker dies (bwrap's
	// --die-with-parent then ends the jail's namespace).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if spec.User != nil {
		cmd.SysProcAttr.Credential = spec.User.Credential()
	}
	c.Cmd = cmd
	if j.Cgroups != nil {
		if c.cg, err = j.Cgroups.New(spec.Name, j.Limits); err != nil {
			return nil, err
		}
	}
	ok = true
	return c, nil
}

// Start starts the jail, puts its processes in their control group, and
// then lets the program run. On error nothing is left running.
func (c *Cell) Start() error {
	if err := c.Cmd.Start(); err != nil {
		c.Close()
		return err
	}
	for _, f := range c.parentFiles {
		f.Close() // the child has its copies
	}
	c.parentFiles = nil
	// bwrap waits on --block-fd before it runs the program, so every
	// process of the jail exists and none has run agent code yet: mark (and
	// move) the whole tree. A fork racing with it either shows up in the
	// second scan or inherits from its parent.
	var err error
	for range 2 {
		for _, pid := range append([]int{c.Cmd.Process.Pid}, descendants(c.Cmd.Process.Pid)...) {
			// Best effort: raising it needs no privilege, and a process
			// that exited meanwhile has none to set.
			_ = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(OOMScoreAdj)), 0)
			if c.cg == nil {
				continue
			}
			if e := c.cg.Add(pid); e != nil && !errors.Is(e, syscall.ESRCH) {
				err = e
			}
		}
	}
	if err != nil {
		c.Kill()
		_ = c.Cmd.Wait()
		c.Close()
		return err
	}
	_, err = c.block.Write([]byte{1})
	c.block.Close()
	c.block = nil
	if err != nil {
		// bwrap ended before it read the block fd: it could not build the
		// jail (its stderr, the caller's, says why).
		c.Kill()
		werr := c.Cmd.Wait()
		c.Close()
		return fmt.Errorf("jail: bwrap ended before starting the program (%v); its error output says why", werr)
	}
	if c.listenSock != nil {
		ln, err := receiveListener(c.listenSock, helperWait)
		c.listenSock.Close()
		c.listenSock = nil
		if err != nil {
			c.Kill()
			_ = c.Cmd.Wait()
			c.Close()
			return fmt.Errorf("jail: the listener inside the jail: %w", err)
		}
		c.listener = ln
	}
	return nil
}

// Kill ends every process of the jail at once.
func (c *Cell) Kill() {
	if c.Cmd.Process != nil {
		_ = syscall.Kill(-c.Cmd.Process.Pid, syscall.SIGKILL)
	}
	if c.cg != nil {
		c.cg.Kill()
	}
}

// Processes returns the host ids of the jail's processes: the members of
// its control group (every process it started, however detached), else the
// descendants of bwrap found by walking /proc, which costs a read per
// process on the host.
func (c *Cell) Processes() []int {
	if c.Cmd.Process == nil {
		return nil
	}
	if c.cg != nil {
		pids := c.cg.Processes()
		if !slices.Contains(pids, c.Cmd.Process.Pid) {
			pids = append(pids, c.Cmd.Process.Pid)
		}
		return pids
	}
	return append([]int{c.Cmd.Process.Pid}, descendants(c.Cmd.Process.Pid)...)
}

// Counters returns the jail's limit counters (zero without a control group).
func (c *Cell) Counters() Counters {
	if c.cg == nil {
		return Counters{}
	}
	return c.cg.Counters()
}

// Close releases the jail after its process was waited for: whatever is
// left in its control group is killed and the group removed.
func (c *Cell) Close() {
	if c.block != nil {
		c.block.Close()
		c.block = nil
	}
	for _, f := range c.parentFiles {
		f.Close()
	}
	c.parentFiles = nil
	if c.listenSock != nil {
		c.listenSock.Close()
		c.listenSock = nil
	}
	if c.cg != nil {
		c.cg.Remove()
	}
}

// bindArgs binds host path p at the same path with flag, or recreates it
// when p is a symbolic link (merged /usr: /bin -> usr/bin). A missing p
// gives nothing.
func bindArgs(flag, p string) []string {
	st, err := os.Lstat(p)
	if err != nil {
		return nil
	}
	if st.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(p)
		if err != nil {
			return nil
		}
		return []string{"--symlink", target, p}
	}
	return []string{flag, p, p}
}

// etcArgs rebuild /etc as a tmpfs holding read-only binds of the host's
// entries, so the jail can add files of its own under it. The host's
// /etc/claude-code is left out: the agent's managed settings come from the
// worker only. Links into /proc and /run (mtab, resolv.conf under
// systemd-resolved) are replaced by what they point to, or kept as links.
func etcArgs() ([]string, error) {
	entries, err := os.ReadDir("/etc")
	if err != nil {
		return nil, fmt.Errorf("jail: read /etc: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.Name() != "claude-code" {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	args := []string{"--tmpfs", "/etc"}
	for _, n := range names {
		p := "/etc/" + n
		st, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if st.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				continue
			}
			if real, err := filepath.EvalSymlinks(p); err == nil && strings.HasPrefix(real, "/run/") {
				args = append(args, "--ro-bind-try", real, p)
				continue
			}
			args = append(args, "--symlink", target, p)
			continue
		}
		args = append(args, "--ro-bind-try", p, p)
	}
	return args, nil
}

// descendants returns the ids of pid's descendants, from /proc.
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	parent := map[int]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			parent[p] = pp
		}
	}
	var out []int
	want := map[int]bool{pid: true}
	for changed := true; changed; {
		changed = false
		for p, pp := range parent {
			if want[pp] && !want[p] {
				want[p] = true
				out = append(out, p)
				changed = true
			}
		}
	}
	return out
}

// scratchDirs makes, in the fresh directory scratch, the agent's /dev/shm,
// /tmp and /var/tmp (mode 0700, given to u when set) and returns them in
// that order. A name that exists is refused: scratch is fresh, so the
// agent put it there, and it is never followed.
func scratchDirs(scratch string, u *User) ([]string, error) {
	var out []string
	for _, name := range []string{".dev-shm", ".tmp", ".var-tmp"} {
		d := filepath.Join(scratch, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("jail: the agent's %s: %w", name, err)
		}
		if u != nil {
			if err := os.Lchown(d, int(u.UID), int(u.GID)); err != nil {
				return nil, fmt.Errorf("jail: the agent's %s: %w", name, err)
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// tmpfsSizes are the sizes of the agent's /tmp, /var/tmp and /dev/shm,
// in bytes, for a memory limit of memory bytes: a quarter, an eighth and an
// eighth of it (half of it together); 0 (unsized) without a limit.
func tmpfsSizes(memory int64) (tmp, varTmp, shm int64) {
	if memory <= 0 {
		return 0, 0, 0
	}
	return memory / 4, memory / 8, memory / 8
}

// sizedTmpfs mounts a tmpfs at dir, of size bytes unless 0.
func sizedTmpfs(size int64, dir string) []string {
	if size > 0 {
		return []string{"--size", strconv.FormatInt(size, 10), "--tmpfs", dir}
	}
	return []string{"--tmpfs", dir}
}

// Check starts a probe in a jail, as u (nil: the worker's own user), and
// reports what the host or pod lacks for it, in words an operator can act
// on: bwrap missing or refused (user namespaces, seccomp), or a control
// group that cannot be made. Where no procfs can be mounted (a masked
// /proc, as in every pod with hostUsers: true) but the rest works, it sets
// SharedProc and succeeds: the caller reports the weaker guarantee.
func (j *Jail) Check(u *User, scratch string) error {
	err := j.check(u, scratch)
	if err != nil && !j.SharedProc && strings.Contains(err.Error(), "mount proc") {
		j.SharedProc = true
		if err2 := j.check(u, scratch); err2 == nil {
			return nil
		}
		j.SharedProc = false
	}
	return err
}

func (j *Jail) check(u *User, scratch string) error {
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return fmt.Errorf("jail check: %w", err)
	}
	if u != nil {
		if err := os.Chown(scratch, int(u.UID), int(u.GID)); err != nil {
			return fmt.Errorf("jail check: %w", err)
		}
	}
	defer os.RemoveAll(scratch)
	sh, err := exec.LookPath("sh")
	if err != nil {
		return fmt.Errorf("jail check: %w", err)
	}
	listen := ""
	if j.Helper != "" {
		listen = "127.0.0.1:40000"
	}
	c, err := j.Command(Spec{Name: "jail-check", User: u, Path: sh,
		// Its own PID namespace (a small pid), its own /proc, and a file given
		// to it; with a helper, a network of its own with a listener in it.
		Args:           []string{"-c", `test "$$" -le 3 && test -r /proc/self/stat && cat /etc/claude-code/probe`},
		Env:            []string{"PATH=/usr/bin:/bin"},
		Dir:            scratch,
		Writable:       []string{scratch},
		Files:          []File{{Path: "/etc/claude-code/probe", Data: []byte("jail-ok")}},
		PrivateNetwork: listen != "",
		Listen:         listen,
	})
	if err != nil {
		return fmt.Errorf("jail check: %w", err)
	}
	var out strings.Builder
	c.Cmd.Stdout, c.Cmd.Stderr = &out, &out
	if err := c.Start(); err != nil {
		return fmt.Errorf("jail check: start bwrap: %w: %s", err, strings.TrimSpace(out.String()))
	}
	err = c.Cmd.Wait()
	if ln := c.Listener(); ln != nil {
		ln.Close()
	}
	c.Close()
	if err != nil || !strings.Contains(out.String(), "jail-ok") {
		return fmt.Errorf("jail check: bwrap could not build the agent's jail (%v): %s; the worker needs unprivileged user namespaces (no seccomp or AppArmor profile forbidding them) and an unmasked /proc", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// KillOrphans ends the jail's processes that lost their parent (detached
// with setsid, nohup or a double fork, and adopted by the jail's init),
// with everything they started, and leaves the program (the CLI) and its
// children (running tools, MCP servers) alone. It returns how many
// processes it signalled. An interrupted turn calls it: what the turn
// detached stops with it.
func (c *Cell) KillOrphans() int {
	if c.Cmd.Process == nil {
		return 0
	}
	all := descendants(c.Cmd.Process.Pid)
	var init int
	inner := map[int]int{}
	parent := map[int]int{}
	for _, pid := range all {
		ns, pp := nsPid(pid)
		inner[pid], parent[pid] = ns, pp
		if ns == 1 {
			init = pid
		}
	}
	if init == 0 {
		return 0
	}
	n := 0
	for _, pid := range all {
		// ns pid 2 is the program: bwrap's init forks it first.
		if parent[pid] != init || inner[pid] == 2 {
			continue
		}
		for _, p := range append([]int{pid}, descendants(pid)...) {
			if syscall.Kill(p, syscall.SIGKILL) == nil {
				n++
			}
		}
	}
	return n
}

// nsPid returns pid's id in its innermost PID namespace and its parent's
// id (in ours), from /proc/<pid>/status.
func nsPid(pid int) (inner, ppid int) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		switch {
		case k == "NSpid" && len(f) > 0:
			inner, _ = strconv.Atoi(f[len(f)-1])
		case k == "PPid" && len(f) == 1:
			ppid, _ = strconv.Atoi(f[0])
		}
	}
	return inner, ppid
}

// Freeze stops every process of the jail (SIGSTOP, which no process can
// catch or ignore), again until no new one appears, and returns the func
// that lets them go on (SIGCONT). While frozen, nothing of the agent
// changes its files: the worker measures them so.
func (c *Cell) Freeze() (thaw func()) {
	stopped := map[int]bool{}
	for range 8 {
		n := 0
		for _, pid := range c.Processes() {
			if !stopped[pid] && syscall.Kill(pid, syscall.SIGSTOP) == nil {
				stopped[pid] = true
				n++
			}
		}
		if n == 0 {
			break
		}
	}
	return func() {
		for pid := range stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
}
