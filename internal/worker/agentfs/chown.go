package agentfs

import (
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// ErrTooDeep: ChownTree met directories nested deeper than it walks.
var ErrTooDeep = errors.New("directory tree too deep")

// maxDepth bounds ChownTree's recursion (one open descriptor per level).
const maxDepth = 128

// ChownTree gives the directory path and everything beneath it to uid:gid,
// unless path already belongs to them (then what is inside is the agent's
// doing and nothing changes). path must be a directory whose parent only
// the worker can change; a symlink in its place is refused. The walk goes by descriptors: each
// entry is opened O_PATH|O_NOFOLLOW relative to its directory's
// descriptor, checked with fstat and changed through that descriptor, so an
// entry swapped for a symbolic link, or a directory for a link to /etc,
// between the listing and the change, changes nothing outside the tree.
// Symbolic links, FIFOs and sockets are changed themselves; a regular file
// with more than one link is left alone (it may be a hard link to a file
// outside the tree), and so are device nodes. The top directory is changed
// last, so a walk that fails is tried again on the next call.
func ChownTree(path string, uid, gid uint32) error {
	top, err := openTop(path)
	if err != nil {
		return err
	}
	defer top.Close()
	var st unix.Stat_t
	if err := unix.Fstat(top.Fd(), &st); err != nil {
		return pathErr("stat", path, mapErrno(err, true))
	}
	if st.Uid == uid && st.Gid == gid {
		return nil
	}
	if err := chownDir(top.Fd(), uid, gid, 0); err != nil {
		return pathErr("chown", path, err)
	}
	if err := unix.Fchown(top.Fd(), int(uid), int(gid)); err != nil {
		return pathErr("chown", path, mapErrno(err, true))
	}
	return nil
}

// ChownDir gives the directory path itself (not what it holds) to
// uid:gid, through a descriptor opened O_NOFOLLOW|O_DIRECTORY: a symlink
// put in its place is refused, never followed to its target.
func ChownDir(path string, uid, gid uint32) error {
	d, err := openTop(path)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Fchown(d.Fd(), int(uid), int(gid)); err != nil {
		return pathErr("chown", path, mapErrno(err, true))
	}
	return nil
}

// chownDir changes the entries of the directory dirfd.
func chownDir(dirfd int, uid, gid uint32, depth int) error {
	if depth >= maxDepth {
		return ErrTooDeep
	}
	// A descriptor of its own for reading the entries.
	fd, err := unix.Openat(dirfd, ".", dirFlags, 0)
	if err != nil {
		return mapErrno(err, true)
	}
	f := os.NewFile(uintptr(fd), ".")
	defer f.Close()
	for {
		names, rerr := f.Readdirnames(256)
		for _, n := range names {
			if err := chownEntry(int(f.Fd()), n, uid, gid, depth); err != nil {
				return err
			}
		}
		if rerr == io.EOF || len(names) == 0 {
			return nil
		}
		if rerr != nil {
			return errors.New("read error")
		}
	}
}

func chownEntry(dirfd int, name string, uid, gid uint32, depth int) error {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil // removed meanwhile
	}
	if err != nil {
		return mapErrno(err, false)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return mapErrno(err, false)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		// The directory this descriptor holds, whatever the name means now.
		if err := chownDir(fd, uid, gid, depth+1); err != nil {
			return err
		}
	case unix.S_IFREG:
		if st.Nlink > 1 {
			return nil
		}
	case unix.S_IFLNK, unix.S_IFIFO, unix.S_IFSOCK:
	default:
		return nil // a device node: never the agent's to have
	}
	if err := unix.Fchownat(fd, "", int(uid), int(gid), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return mapErrno(err, false)
	}
	return nil
}
