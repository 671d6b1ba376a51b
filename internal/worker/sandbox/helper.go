package sandbox

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// HelperArg is the first argument that makes the worker's binary the
// jail's helper (RunHelper) instead of itself.
const HelperArg = "talkide-jail-listen"

// jailHelperPath is where the helper is bound, read-only, in a jail.
const jailHelperPath = "/run/talkide-jail-helper"

// helperReady is set once MaybeRunHelper returned: this binary can be the
// helper (a binary that never called it would run itself in the jail).
var helperReady atomic.Bool

// helperWait bounds how long Start waits for the helper's listener.
const helperWait = 30 * time.Second

// MaybeRunHelper runs the jail's helper and never returns when the process
// was started as one (os.Args[1] == HelperArg); else it returns at once.
// Every binary that runs jails with Spec.Listen (the worker, and test
// binaries that do) calls it first thing in main (or TestMain).
//
// The helper is the first program of such a jail, before any of the
// agent's: inside the jail's network namespace, as the agent, it listens on
// the address it is given, passes the listening socket to the worker over
// the descriptor it is given (SCM_RIGHTS), and executes the rest of its
// arguments. The worker then serves the agent on that socket from outside;
// nothing of the helper stays in the jail.
func MaybeRunHelper() {
	if len(os.Args) < 2 || os.Args[1] != HelperArg {
		helperReady.Store(true)
		return
	}
	err := runHelper(os.Args[2:])
	fmt.Fprintln(os.Stderr, "talkide jail helper:", err)
	os.Exit(127)
}

// runHelper takes "fd address -- command args..." and returns only on error.
func runHelper(args []string) error {
	if len(args) < 4 || args[2] != "--" {
		return errors.New("usage: fd address -- command [args...]")
	}
	fd, err := strconv.Atoi(args[0])
	if err != nil {
		return fmt.Errorf("fd %q: %w", args[0], err)
	}
	ln, err := net.Listen("tcp", args[1])
	if err != nil {
		return err
	}
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		return err
	}
	if err := unix.Sendmsg(fd, []byte{1}, unix.UnixRights(int(f.Fd())), nil, 0); err != nil {
		return fmt.Errorf("send the listener: %w", err)
	}
	f.Close()
	ln.Close()
	unix.Close(fd)
	cmd := args[3:]
	return syscall.Exec(cmd[0], cmd, os.Environ())
}

// InstallHelper returns a path of the running binary that agents can reach
// and run (bwrap, which binds it into the jail, runs as the agent): the
// binary's own path when every directory above it is searchable by others
// and the file readable and executable by them, else a copy in dir (made
// if missing, mode 0711, the copy 0755 and root's when the worker is).
// Errors are the file system's.
func InstallHelper(dir string) (string, error) {
	if !helperReady.Load() {
		return "", errors.New("this binary cannot be the jail's helper (its main does not call sandbox.MaybeRunHelper first)")
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("the jail's helper: %w", err)
	}
	if reachableByOthers(exe) {
		return exe, nil
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("the jail's helper: %w", err)
	}
	// Never a directory someone else made or can write (a shared /tmp).
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return "", fmt.Errorf("the jail's helper: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() {
		return "", fmt.Errorf("the jail's helper: %s is not a directory of this user's", dir)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return "", fmt.Errorf("the jail's helper: %w", err)
	}
	src, err := os.Open(exe)
	if err != nil {
		return "", fmt.Errorf("the jail's helper: %w", err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, ".helper-*")
	if err != nil {
		return "", fmt.Errorf("the jail's helper: %w", err)
	}
	_, err = io.Copy(tmp, src)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o755)
	}
	dst := filepath.Join(dir, "talkide-jail-helper")
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("the jail's helper: %w", err)
	}
	return dst, nil
}

// reachableByOthers reports whether a user other than the owner can reach
// and run path: every directory above it searchable by others, the file
// readable and executable by them.
func reachableByOthers(path string) bool {
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm()&0o005 != 0o005 {
		return false
	}
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == "/" || d == "." {
			return true
		}
	}
}

// receiveListener reads the listener the helper sends on sock, waiting at
// most wait.
func receiveListener(sock *os.File, wait time.Duration) (net.Listener, error) {
	conn, err := net.FileConn(sock)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil, errors.New("not a unix socket")
	}
	_ = uc.SetReadDeadline(time.Now().Add(wait))
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var n, oobn int
	var rerr error
	// MSG_CMSG_CLOEXEC: the received descriptor is never inherited by a
	// process the worker starts meanwhile.
	err = raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
		return rerr != unix.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	if err == nil && n == 0 {
		err = errors.New("end of stream")
	}
	if err != nil {
		return nil, fmt.Errorf("the helper sent nothing (its error output says why): %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("the helper sent no listener (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, fmt.Errorf("the helper sent no listener (%v)", err)
	}
	lf := os.NewFile(uintptr(fds[0]), "jail-listener")
	defer lf.Close()
	return net.FileListener(lf)
}
