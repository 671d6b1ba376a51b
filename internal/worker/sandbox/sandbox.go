// Package sandbox keeps the agent away from the platform's secrets on the
// machine it runs on. The agent (the Claude Code CLI and every command it
// runs) executes whatever a conversation asks for, so it must not be able
// to read the worker's identity token or request keys, the control plane's
// master key, or the API key:
//
//   - Every platform binary makes itself non-dumpable first (package
//     harden), so other processes of the same user cannot read its
//     /proc/<pid>/environ or memory (only a process with CAP_SYS_PTRACE
//     could).
//
//   - A worker running as root (whose agents could otherwise read
//     everything) runs each conversation's agent as a user id of its own,
//     claimed from a UIDRange, or all agents as one User the operator
//     names. It gives the agent its directories (PrepareDir, ChownTree),
//     makes the roots above them searchable but not listable
//     (MakeTraversable), and starts the CLI with the user's credentials
//     (Credential).
//
//   - A Jail (jail.go) runs each agent in namespaces of its own, built by
//     bubblewrap: its processes end with its CLI, it sees only its own
//     processes and its own conversation's directories, and the worker's
//     files (managed settings, MCP configuration) reach it read-only.
//
//   - Cgroups (cgroup.go) give each agent a control group with its Limits
//     (limits.go: memory, processes, CPU weight; disk is measured by
//     MeasureDisk and DeletedOpenBytes, disk.go), counted and killed as a
//     whole. A seccomp filter (seccomp.go) refuses what no measuring could
//     keep up with: reserving disk at once, user namespaces of its own.
//
// With Spec.PrivateNetwork the agent has a network namespace of its own
// (loopback only); the worker serves its local gateway proxy on a listener
// made inside it by the jail's helper (helper.go).
package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/talkide/talkide/internal/worker/agentfs"
)

// User is the account agents run as.
type User struct {
	UID, GID uint32
}

// Nobody is the default agent account of a worker running as root.
var Nobody = User{UID: 65534, GID: 65534}

// ParseUser reads "uid:gid", "uid" (gid = uid) or a user name from the
// password database.
func ParseUser(s string) (User, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return User{}, errors.New("parse agent user: empty")
	}
	if u, g, ok := strings.Cut(s, ":"); ok {
		uid, err1 := strconv.ParseUint(u, 10, 32)
		gid, err2 := strconv.ParseUint(g, 10, 32)
		if err1 != nil || err2 != nil {
			return User{}, fmt.Errorf("parse agent user %q: want uid:gid", s)
		}
		return User{UID: uint32(uid), GID: uint32(gid)}, nil
	}
	if uid, err := strconv.ParseUint(s, 10, 32); err == nil {
		return User{UID: uint32(uid), GID: uint32(uid)}, nil
	}
	pw, err := user.Lookup(s)
	if err != nil {
		return User{}, fmt.Errorf("parse agent user %q: %w", s, err)
	}
	uid, _ := strconv.ParseUint(pw.Uid, 10, 32)
	gid, _ := strconv.ParseUint(pw.Gid, 10, 32)
	return User{UID: uint32(uid), GID: uint32(gid)}, nil
}

// Credential is the process credential of the agent: its uid and gid and no
// supplementary groups.
func (u User) Credential() *syscall.Credential {
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
}

// PrepareDir creates dir (0700) owned by the agent user, and makes sure the
// agent can traverse every directory from top down to dir (adding the
// search bit for others, never read: the agent cannot list what it passes
// through). top is the highest directory that may be changed; above it,
// directories must already be traversable, else an error tells the
// operator which one is not.
func (u User) PrepareDir(top, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// Through a descriptor of dir itself (O_NOFOLLOW): a symlink put in
	// its place is refused, never followed to its target.
	if err := agentfs.ChownDir(dir, u.UID, u.GID); err != nil {
		return fmt.Errorf("give %s to the agent user: %w", dir, err)
	}
	top, _ = filepath.Abs(top)
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		if err := u.traversable(p, strings.HasPrefix(p+"/", top+"/")); err != nil {
			return err
		}
		if p == "/" || p == "." {
			return nil
		}
	}
}

func (u User) traversable(dir string, mayChange bool) error {
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	sys := st.Sys().(*syscall.Stat_t)
	mode := st.Mode().Perm()
	switch {
	case sys.Uid == u.UID && mode&0o100 != 0,
		sys.Gid == u.GID && mode&0o010 != 0,
		mode&0o001 != 0:
		return nil
	case mayChange:
		return os.Chmod(dir, mode|0o001)
	}
	return fmt.Errorf("agent user %d cannot traverse %s (mode %v): make it searchable for others (chmod o+x) or run the worker as a non-root user", u.UID, dir, mode)
}

// ChownTree gives dir and everything under it to u, unless dir already
// belongs to u (then it is left alone: the agent created its contents).
// It walks by descriptors and follows no symlink; see agentfs.ChownTree.
func ChownTree(dir string, u User) error {
	return agentfs.ChownTree(dir, u.UID, u.GID)
}

// MakeTraversable creates dir (0711, owned by the caller) so agents can pass
// through it but not list it, and checks the directories above it up to top
// the same way PrepareDir does.
func MakeTraversable(top, dir string, u User) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	top, _ = filepath.Abs(top)
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		if err := u.traversable(p, strings.HasPrefix(p+"/", top+"/")); err != nil {
			return err
		}
		if p == "/" || p == "." {
			return nil
		}
	}
}
