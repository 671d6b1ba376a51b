package sandbox

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// UIDRange is a block of numeric user ids, one per conversation, so that
// the agents of two conversations cannot read each other's files,
// transcripts or process environments (and so cannot spend as each other).
//
// A uid is claimed twice: in Dir, on the session volume, so every replica of
// the tenant-env gives a conversation the same uid (its files on the volume
// belong to it); and in HostDir, a directory every worker on the machine
// shares, so two workers of different tenant-envs (each with its own
// session volume) on one host never hand out the same uid. A claim is held
// until Release, which first ends every process of the uid and removes the
// files it may own, so a uid handed out again carries nothing of its
// previous conversation.
type UIDRange struct {
	// First is the first uid; Count how many the range holds.
	First, Count uint32
	// Dir holds one claim file per uid in use (on the session volume, so
	// every replica sees the same claims), named by the uid and holding
	// the owner (a conversation id).
	Dir string
	// HostDir holds the host-wide claims, one file per uid in use on this
	// machine, holding "<volume id> <owner>" (the volume id is a random id
	// kept in Dir). Every worker of the host must use the same HostDir;
	// empty means this worker is the only one on the host.
	HostDir string
	// SweepDirs are the directories outside its own that an agent can write
	// to (world-writable ones such as /tmp); Release removes what the uid
	// owns there. Nil means DefaultSweepDirs.
	SweepDirs []string
}

// DefaultUIDs is the range a worker running as root gives its
// conversations' agents (no account needs to exist for them).
var DefaultUIDs = UIDRange{First: 200000, Count: 100000}

// DefaultHostUIDDir is the host-wide claim directory of every worker on a
// machine ([TALKIDE_HOST_UID_DIR]).
const DefaultHostUIDDir = "/run/talkide/uids"

// DefaultSweepDirs are the world-writable directories of a Linux host.
var DefaultSweepDirs = []string{"/tmp", "/var/tmp", "/dev/shm"}

// Errors of UIDRange methods.
var (
	// ErrNoUID is returned by Claim when every uid of the range is taken.
	ErrNoUID = errors.New("no free agent uid in the range")
	// ErrUIDTaken is returned by Hold when the conversation's uid is claimed
	// by another owner, on the volume or on this host (a conversation of
	// another tenant-env's worker on this machine).
	ErrUIDTaken = errors.New("agent uid claimed by another conversation")
)

// volumeIDFile names the random id of a claim directory (its session
// volume) inside Dir.
const volumeIDFile = "volume-id"

// Claim returns a uid for owner (a conversation id): a free one (or one
// owner claimed before, when the search meets it first; Hold keeps a known
// uid), claimed with exclusive file creations (atomic on
// NFS too) in Dir and HostDir. The search starts at a hash of owner, so
// claims rarely collide. A uid that some process still runs as is skipped.
// Errors: ErrNoUID, ErrUIDTaken (owner's earlier uid is taken on this host),
// or the file system's.
func (r UIDRange) Claim(owner string) (uint32, error) {
	if err := validOwner(owner); err != nil {
		return 0, err
	}
	vol, err := r.volumeID()
	if err != nil {
		return 0, err
	}
	if r.Count == 0 {
		return 0, ErrNoUID
	}
	var h uint32 = 2166136261
	for i := 0; i < len(owner); i++ {
		h = (h ^ uint32(owner[i])) * 16777619
	}
	start := h % r.Count
	for i := uint32(0); i < r.Count; i++ {
		uid := r.First + (start+i)%r.Count
		created, err := claimFile(r.volPath(uid), owner)
		if errors.Is(err, ErrUIDTaken) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if !created {
			// owner's own claim from before: make sure this host has it too.
			if err := r.holdHost(vol, owner, uid); err != nil {
				return 0, err
			}
			return uid, nil
		}
		hostCreated, err := r.claimHost(vol, owner, uid)
		if errors.Is(err, ErrUIDTaken) {
			_ = os.Remove(r.volPath(uid))
			continue
		}
		if err != nil {
			_ = os.Remove(r.volPath(uid))
			return 0, err
		}
		if pids := ProcessesOf(uid); len(pids) > 0 {
			// Someone runs as this uid (a worker without the host claim
			// directory, or a leftover): never share it.
			_ = os.Remove(r.volPath(uid))
			if hostCreated {
				_ = os.Remove(r.hostPath(uid))
			}
			continue
		}
		return uid, nil
	}
	return 0, ErrNoUID
}

// Hold makes sure owner holds uid, claimed before (a conversation's stored
// uid), on the volume and on this host: it claims either again when its
// file is missing (a conversation moved to another host, or claims made
// before host claims existed). It returns ErrUIDTaken when another owner
// holds uid there; the conversation must not run as it then.
func (r UIDRange) Hold(owner string, uid uint32) error {
	if err := validOwner(owner); err != nil {
		return err
	}
	if uid < r.First || uid-r.First >= r.Count {
		return fmt.Errorf("hold agent uid %d: outside the range %d-%d", uid, r.First, r.First+r.Count-1)
	}
	vol, err := r.volumeID()
	if err != nil {
		return err
	}
	if _, err := claimFile(r.volPath(uid), owner); err != nil {
		return fmt.Errorf("hold agent uid %d: %w", uid, err)
	}
	return r.holdHost(vol, owner, uid)
}

// Release gives owner's uid back: it kills every process running as uid
// (however it detached), removes dirs (the conversation's own directories)
// and whatever the uid owns in SweepDirs, then removes the claims. Only
// then may the uid go to another conversation. Claims held by another
// owner are left alone. It returns an error, and keeps the claims, when a
// process of the uid survives or a file cannot be removed; call it again.
func (r UIDRange) Release(owner string, uid uint32, dirs ...string) error {
	if err := validOwner(owner); err != nil {
		return err
	}
	// Never touch a uid another conversation holds (on the volume or on
	// this host): its processes and files are not owner's.
	vol, err := r.volumeID()
	if err != nil {
		return err
	}
	if other, err := heldByOther(r.volPath(uid), owner); err != nil || other {
		return errors.Join(err, fmt.Errorf("release agent uid %d of %s: %w", uid, owner, ErrUIDTaken))
	}
	if r.HostDir != "" {
		if other, err := heldByOther(r.hostPath(uid), vol+" "+owner); err != nil || other {
			return errors.Join(err, fmt.Errorf("release agent uid %d of %s on this host: %w", uid, owner, ErrUIDTaken))
		}
	}
	if err := KillUID(uid); err != nil {
		return fmt.Errorf("release agent uid %d: %w", uid, err)
	}
	var errs []error
	for _, d := range dirs {
		if err := RemoveTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	sweep := r.SweepDirs
	if sweep == nil {
		sweep = DefaultSweepDirs
	}
	for _, d := range sweep {
		if err := RemoveOwnedBy(d, uid); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("release agent uid %d: remove its files: %w", uid, err)
	}
	if r.HostDir != "" {
		if err := removeIfContent(r.hostPath(uid), vol+" "+owner); err != nil {
			return fmt.Errorf("release agent uid %d: %w", uid, err)
		}
	}
	if err := removeIfContent(r.volPath(uid), owner); err != nil {
		return fmt.Errorf("release agent uid %d: %w", uid, err)
	}
	return nil
}

// Claims returns the volume's claims: uid → owner.
func (r UIDRange) Claims() (map[uint32]string, error) {
	entries, err := os.ReadDir(r.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[uint32]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list agent uid claims: %w", err)
	}
	out := make(map[uint32]string, len(entries))
	for _, e := range entries {
		uid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(r.Dir, e.Name()))
		if err != nil {
			continue
		}
		out[uint32(uid)] = string(b)
	}
	return out, nil
}

func (r UIDRange) volPath(uid uint32) string {
	return filepath.Join(r.Dir, strconv.FormatUint(uint64(uid), 10))
}

func (r UIDRange) hostPath(uid uint32) string {
	return filepath.Join(r.HostDir, strconv.FormatUint(uint64(uid), 10))
}

// claimHost claims uid on this host for (vol, owner); created reports
// whether this call made the claim. Without HostDir it claims nothing.
func (r UIDRange) claimHost(vol, owner string, uid uint32) (created bool, err error) {
	if r.HostDir == "" {
		return false, nil
	}
	if err := os.MkdirAll(r.HostDir, 0o700); err != nil {
		return false, fmt.Errorf("create host uid claims: %w", err)
	}
	return claimFile(r.hostPath(uid), vol+" "+owner)
}

func (r UIDRange) holdHost(vol, owner string, uid uint32) error {
	if _, err := r.claimHost(vol, owner, uid); err != nil {
		if errors.Is(err, ErrUIDTaken) {
			return fmt.Errorf("agent uid %d of %s is in use on this host by another worker's conversation: %w", uid, owner, err)
		}
		return err
	}
	return nil
}

// volumeID returns the random id of Dir's volume, creating Dir and the id
// on first use.
func (r UIDRange) volumeID() (string, error) {
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return "", fmt.Errorf("create agent uid claims: %w", err)
	}
	path := filepath.Join(r.Dir, volumeIDFile)
	var b [16]byte
	_, _ = rand.Read(b[:])
	if _, err := claimFile(path, hex.EncodeToString(b[:])); err != nil && !errors.Is(err, ErrUIDTaken) {
		return "", fmt.Errorf("create volume id: %w", err)
	}
	id, err := os.ReadFile(path)
	if err != nil || len(id) == 0 {
		return "", fmt.Errorf("read volume id %s: %v", path, err)
	}
	return string(id), nil
}

// claimFile creates path holding content, exclusively. It reports
// created=false when path already holds content, and ErrUIDTaken when it
// holds anything else. The content is written before the file gets its
// name (a temp file linked into place), so no reader sees it empty.
func claimFile(path, content string) (created bool, err error) {
	tmp := fmt.Sprintf("%s.tmp-%d-%d", path, os.Getpid(), time.Now().UnixNano())
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return false, err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err == nil {
		return true, nil
	} else if !errors.Is(err, fs.ErrExist) {
		return false, err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		// Released between our link and our read: claim it again.
		return claimFile(path, content)
	}
	if err != nil {
		return false, err
	}
	if string(b) == content {
		return false, nil
	}
	return false, ErrUIDTaken
}

// heldByOther reports whether the claim file path exists with other
// content than content.
func heldByOther(path, content string) (bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return string(b) != content, nil
}

// removeIfContent removes path when it holds content (a claim of ours).
func removeIfContent(path, content string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if string(b) != content {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func validOwner(owner string) error {
	if owner == "" || strings.ContainsAny(owner, " \n/") {
		return fmt.Errorf("agent uid owner %q: want a conversation id", owner)
	}
	return nil
}

// ProcessesOf returns the pids of the live (not zombie) processes whose
// real, effective or saved uid is uid, from /proc.
func ProcessesOf(uid uint32) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := strconv.FormatUint(uint64(uid), 10)
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		var uids []string
		zombie := false
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			switch {
			case bytes.HasPrefix(line, []byte("State:")):
				zombie = bytes.Contains(line, []byte("Z (zombie)")) || bytes.Contains(line, []byte("X (dead)"))
			case bytes.HasPrefix(line, []byte("Uid:")):
				uids = strings.Fields(string(line[len("Uid:"):]))
			}
		}
		if zombie || len(uids) < 3 {
			continue
		}
		if uids[0] == want || uids[1] == want || uids[2] == want {
			pids = append(pids, pid)
		}
	}
	return pids
}

// KillUID ends every process running as uid, however it detached (its own
// session, process group or cleared environment), and returns once none is
// left, or an error naming the survivors. As root it signals them all at
// once with kill(-1, SIGKILL) from a process running as uid, which reaches
// exactly the processes of that uid and, being one kernel operation, leaves
// a forking process no gap to escape through; it then repeats, and also
// signals each pid /proc lists. uid 0 is refused.
func KillUID(uid uint32) error {
	if uid == 0 {
		return errors.New("kill processes of uid 0: refused")
	}
	var pids []int
	for attempt := range 50 {
		pids = ProcessesOf(uid)
		if len(pids) == 0 {
			return nil
		}
		if os.Geteuid() == 0 {
			_ = killAllAs(uid)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		// SIGKILL is delivered at once, but exiting (and leaving /proc)
		// takes the kernel a moment.
		time.Sleep(time.Duration(attempt+1) * 2 * time.Millisecond)
	}
	return fmt.Errorf("processes of uid %d survive SIGKILL: %v", uid, pids)
}

// killAllAs sends SIGKILL to every process of uid: kill(-1) run by a
// short-lived child process with uid's credentials (kill(1) of util-linux
// or procps, else the shell's builtin), which reaches exactly the
// processes that uid may signal: its own. (Switching a thread of the
// worker to uid instead is unsafe: Go may run that goroutine on the main
// thread, whose credentials /proc shows for the whole worker, and cannot
// retire it.)
func killAllAs(uid uint32) error {
	name, args := "/bin/sh", []string{"-c", "kill -KILL -1"}
	if p, err := exec.LookPath("kill"); err == nil {
		name, args = p, []string{"-KILL", "-1"}
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	// kill(-1) from a process that signalled at least one other process
	// succeeds; with nothing left to signal it fails (ESRCH): both are fine.
	_ = cmd.Run()
	return nil
}

// RemoveOwnedBy removes, under dir, every entry uid owns (a directory of
// uid's with all it holds), descending only into directories uid could
// write to without owning them (world-writable ones, like /tmp itself):
// elsewhere Unix permissions kept it from creating anything. Symbolic links
// are removed themselves, never followed; uid's directories go with
// RemoveTree, whatever their depth. A missing dir is no error.
func RemoveOwnedBy(dir string, uid uint32) error {
	st, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			continue // gone meanwhile
		}
		sys, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		switch {
		case sys.Uid == uid:
			if err := RemoveTree(p); err != nil {
				errs = append(errs, err)
			}
		case fi.IsDir() && fi.Mode().Perm()&0o002 != 0:
			if err := RemoveOwnedBy(p, uid); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
