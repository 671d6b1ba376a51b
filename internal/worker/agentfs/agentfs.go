// Package agentfs is how the worker, often running as root, touches files
// inside directories an agent owns: a conversation's CLAUDE_CONFIG_DIR (its
// transcripts under projects/), its HOME, its workspace (.mcp.json,
// .claude/) and its tmp dir. The agent can put anything there and change it
// at any moment: a symlink in any path component (to a root-only file, to
// /dev/zero, to a FIFO), a FIFO, a device node, a directory where a file is
// expected, a hard link to a file it cannot read, a 10 GB sparse file. So
// nothing here takes a path the agent controls at face value:
//
//   - every path is resolved beneath an open directory (Dir) with openat2
//     and RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS: no
//     component may be a symbolic link, and ".." or an absolute name never
//     leaves the directory. Where openat2 is missing (Linux before 5.6, or
//     a seccomp profile that refuses it), the same holds by walking the
//     path one component at a time with openat(O_NOFOLLOW|O_DIRECTORY)
//     relative to the previous directory's descriptor;
//   - files are opened O_NOFOLLOW|O_NONBLOCK|O_NOCTTY|O_CLOEXEC, so opening
//     a FIFO or a device never waits, then checked with fstat (on the open
//     descriptor, so a swap after the check changes nothing): a regular
//     file, of the expected owner (which refuses a hard link to someone
//     else's file), within a size bound; reads stop at the bound too;
//   - changes (Remove, ChownTree) act on descriptors of directories opened
//     the same way, never on a path looked up again after a check.
//
// Errors are fs.PathError values holding the name the caller passed and
// one of the sentinel errors below (or fs.ErrNotExist, fs.ErrPermission);
// they never hold a byte of a file's content or a symlink's target, so they
// are safe to show the agent. Category names the kind of failure for logs.
//
// Main types: Dir (OpenRoot, OpenDir, Open, ReadFile, Names, Remove) and
// Limits; ChownTree. It is not a sandbox for the agent (see package
// sandbox) and is not for the worker's own state, which the agent cannot
// reach.
package agentfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Sentinel errors, inside the fs.PathError of a failed operation.
var (
	// ErrSymlink: a component of the path is a symbolic link.
	ErrSymlink = errors.New("a path component is a symbolic link")
	// ErrEscape: the name is absolute or climbs out with "..".
	ErrEscape = errors.New("path leaves its directory")
	// ErrNotRegular: the file is a FIFO, device, socket or directory.
	ErrNotRegular = errors.New("not a regular file")
	// ErrNotDir: a component expected to be a directory is not one.
	ErrNotDir = errors.New("not a directory")
	// ErrTooLarge: the file is over the size bound.
	ErrTooLarge = errors.New("file too large")
	// ErrOwner: the file belongs to another user than the expected one.
	ErrOwner = errors.New("file belongs to another user")
	// ErrTooMany: a directory holds more entries than asked for.
	ErrTooMany = errors.New("too many directory entries")
)

// Category names the kind of an error of this package in one word, for
// logs: symlink, escape, not_regular, not_dir, too_large, owner, too_many,
// not_exist, permission or io.
func Category(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrSymlink):
		return "symlink"
	case errors.Is(err, ErrEscape):
		return "escape"
	case errors.Is(err, ErrNotRegular):
		return "not_regular"
	case errors.Is(err, ErrNotDir):
		return "not_dir"
	case errors.Is(err, ErrTooLarge):
		return "too_large"
	case errors.Is(err, ErrOwner):
		return "owner"
	case errors.Is(err, ErrTooMany):
		return "too_many"
	case errors.Is(err, fs.ErrNotExist):
		return "not_exist"
	case errors.Is(err, fs.ErrPermission):
		return "permission"
	}
	return "io"
}

// AnyUID in Limits.UID accepts a file of any owner.
const AnyUID = -1

// Limits are what a file must satisfy to be read.
type Limits struct {
	// MaxBytes bounds the file's size: a larger file is refused with
	// ErrTooLarge. 0 sets no bound on Open (the caller must bound its
	// reads); ReadFile requires a bound.
	MaxBytes int64
	// UID is the owner the file must have (the agent's uid), or AnyUID.
	// Checking it refuses a hard link the agent made to a file it cannot
	// read. Note that 0 means root.
	UID int
}

// Dir is an open directory that names are resolved beneath. Close it when
// done.
type Dir struct {
	f *os.File
	// walk resolves names one component at a time (openWalk) even where the
	// kernel has openat2; directories opened beneath d inherit it. False
	// outside this package's tests, which set it to check the fallback
	// that runs on kernels without openat2.
	walk bool
}

const (
	dirFlags  = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK
	fileFlags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	resolve   = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS
)

// OpenRoot opens path, a directory the worker trusts by its path: one of
// its configured roots (the config, workspace, home or tmp root), whose path
// the operator chose and may hold symlinks. Names beneath it are then
// resolved with none. Never pass a directory the agent can replace; for an
// agent's own top directory open its root and name it beneath.
func OpenRoot(path string) (*Dir, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathErr("open", path, mapErrno(err, true))
	}
	return &Dir{f: os.NewFile(uintptr(fd), path)}, nil
}

// openTop opens the directory path refusing a symlink as its last
// component (ChownTree and ChownDir: the directory itself, never a link's
// target).
func openTop(path string) (*Dir, error) {
	fd, err := unix.Open(path, dirFlags, 0)
	if err == unix.ENOTDIR {
		err = classify(unix.AT_FDCWD, path)
	}
	if err != nil {
		return nil, pathErr("open", path, mapErrno(err, true))
	}
	return &Dir{f: os.NewFile(uintptr(fd), path)}, nil
}

// Close closes the directory.
func (d *Dir) Close() error { return d.f.Close() }

// Fd returns the directory's descriptor, valid until Close.
func (d *Dir) Fd() int { return int(d.f.Fd()) }

// OpenDir opens the directory name beneath d.
func (d *Dir) OpenDir(name string) (*Dir, error) {
	fd, err := d.openBeneath(name, dirFlags)
	if err != nil {
		return nil, pathErr("open", name, mapErrno(err, true))
	}
	return &Dir{f: os.NewFile(uintptr(fd), name), walk: d.walk}, nil
}

// Open opens the regular file name beneath d for reading, checked against
// lim, and returns it with its size. Opening never blocks (a FIFO or a
// device is opened non-blocking, found not regular and closed).
func (d *Dir) Open(name string, lim Limits) (*os.File, int64, error) {
	fd, err := d.openBeneath(name, fileFlags)
	if err != nil {
		return nil, 0, pathErr("open", name, mapErrno(err, false))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, 0, pathErr("stat", name, mapErrno(err, false))
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = ErrNotRegular
	case lim.UID != AnyUID && st.Uid != uint32(lim.UID):
		err = ErrOwner
	case lim.MaxBytes > 0 && st.Size > lim.MaxBytes:
		err = ErrTooLarge
	}
	if err != nil {
		unix.Close(fd)
		return nil, 0, pathErr("open", name, err)
	}
	return os.NewFile(uintptr(fd), name), st.Size, nil
}

// ReadFile reads the regular file name beneath d, checked against lim;
// lim.MaxBytes is required and bounds the read even if the file grows
// after the check.
func (d *Dir) ReadFile(name string, lim Limits) ([]byte, error) {
	if lim.MaxBytes <= 0 {
		return nil, pathErr("read", name, errors.New("agentfs: ReadFile needs Limits.MaxBytes"))
	}
	f, _, err := d.Open(name, lim)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, lim.MaxBytes+1))
	if err != nil {
		return nil, pathErr("read", name, errors.New("read error"))
	}
	if int64(len(b)) > lim.MaxBytes {
		return nil, pathErr("read", name, ErrTooLarge)
	}
	return b, nil
}

// ReadFile reads the regular file name beneath the directory root (see
// OpenRoot and Dir.ReadFile).
func ReadFile(root, name string, lim Limits) ([]byte, error) {
	d, err := OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.ReadFile(name, lim)
}

// Names returns the names of d's entries, at most max of them (more:
// ErrTooMany with the first max).
func (d *Dir) Names(max int) ([]string, error) {
	// A descriptor of its own: reading entries moves the offset.
	fd, err := unix.Openat(d.Fd(), ".", dirFlags, 0)
	if err != nil {
		return nil, pathErr("open", d.f.Name(), mapErrno(err, true))
	}
	f := os.NewFile(uintptr(fd), d.f.Name())
	defer f.Close()
	names, err := f.Readdirnames(max + 1)
	if err != nil && err != io.EOF {
		return nil, pathErr("readdir", d.f.Name(), errors.New("read error"))
	}
	if len(names) > max {
		return names[:max], pathErr("readdir", d.f.Name(), ErrTooMany)
	}
	return names, nil
}

// Remove removes the file (or empty directory) name beneath d; a symbolic
// link as its last component is removed itself, one in any other component
// refuses.
func (d *Dir) Remove(name string) error {
	parent, base, err := d.parent(name)
	if err != nil {
		return pathErr("remove", name, err)
	}
	defer parent.Close()
	err = unix.Unlinkat(parent.Fd(), base, 0)
	if err == unix.EISDIR {
		err = unix.Unlinkat(parent.Fd(), base, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return pathErr("remove", name, mapErrno(err, false))
	}
	return nil
}

// parent opens the directory holding name's last component and returns it
// with that component.
func (d *Dir) parent(name string) (*Dir, string, error) {
	if err := checkName(name); err != nil {
		return nil, "", err
	}
	dir, base := ".", name
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		dir, base = name[:i], name[i+1:]
	}
	fd, err := d.openBeneath(dir, dirFlags)
	if err != nil {
		return nil, "", mapErrno(err, true)
	}
	return &Dir{f: os.NewFile(uintptr(fd), dir), walk: d.walk}, base, nil
}

// checkName accepts relative names without empty, "." or ".." components
// (except the name "." itself).
func checkName(name string) error {
	if name == "." {
		return nil
	}
	if name == "" || name[0] == '/' {
		return ErrEscape
	}
	for c := range strings.SplitSeq(name, "/") {
		if c == "" || c == "." || c == ".." {
			return ErrEscape
		}
	}
	return nil
}

// openat2 is used while the kernel has it; probed once.
var haveOpenat2 = sync.OnceValue(func() bool {
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if err != nil {
		return false // ENOSYS (old kernel) or EPERM (a seccomp profile)
	}
	unix.Close(fd)
	return true
})

// openBeneath opens name beneath d following no symbolic link.
func (d *Dir) openBeneath(name string, flags int) (int, error) {
	dirfd := d.Fd()
	if err := checkName(name); err != nil {
		return -1, err
	}
	if !d.walk && haveOpenat2() {
		for range 16 {
			// Without O_NOFOLLOW, which would make a final symlink with
			// O_DIRECTORY report ENOTDIR: RESOLVE_NO_SYMLINKS refuses it
			// with ELOOP.
			fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{Flags: uint64(flags &^ unix.O_NOFOLLOW), Resolve: resolve})
			if err == unix.EAGAIN || err == unix.EINTR {
				continue // a concurrent rename during resolution: try again
			}
			return fd, err
		}
		return -1, unix.EAGAIN
	}
	return openWalk(dirfd, name, flags)
}

// openWalk is openBeneath without openat2: one component at a time, each
// opened O_NOFOLLOW relative to the descriptor of the one before, so no
// component is followed and none can be swapped between check and use.
func openWalk(dirfd int, name string, flags int) (int, error) {
	if name == "." {
		return unix.Openat(dirfd, ".", flags|unix.O_NOFOLLOW, 0)
	}
	parts := strings.Split(name, "/")
	cur := dirfd
	for i, p := range parts {
		f := dirFlags
		if i == len(parts)-1 {
			f = flags | unix.O_NOFOLLOW
		}
		fd, err := unix.Openat(cur, p, f, 0)
		if err == unix.ENOTDIR {
			err = classify(cur, p)
		}
		if cur != dirfd {
			unix.Close(cur)
		}
		if err != nil {
			return -1, err
		}
		cur = fd
	}
	return cur, nil
}

// classify tells why opening name beneath dirfd with O_NOFOLLOW and
// O_DIRECTORY said ENOTDIR: a symlink (ELOOP) or something else. It looks
// at the entry itself and follows nothing.
func classify(dirfd int, name string) error {
	var st unix.Stat_t
	if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return unix.ELOOP
	}
	return unix.ENOTDIR
}

// mapErrno turns an errno of an open into this package's errors. ELOOP is
// what both RESOLVE_NO_SYMLINKS and O_NOFOLLOW report for a link; EXDEV is
// RESOLVE_BENEATH's refusal.
func mapErrno(err error, wantDir bool) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return err
	}
	switch errno {
	case unix.ELOOP:
		return ErrSymlink
	case unix.EXDEV:
		return ErrEscape
	case unix.ENOENT:
		return fs.ErrNotExist
	case unix.ENOTDIR:
		return ErrNotDir
	case unix.ENXIO, unix.EISDIR, unix.ENODEV:
		if wantDir {
			return ErrNotDir
		}
		return ErrNotRegular
	case unix.EACCES, unix.EPERM:
		return fs.ErrPermission
	}
	return fmt.Errorf("errno %d", int(errno))
}

func pathErr(op, name string, err error) error {
	return &fs.PathError{Op: op, Path: name, Err: err}
}
