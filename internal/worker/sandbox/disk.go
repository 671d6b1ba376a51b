package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// DiskUse is what a conversation's directories take on disk.
type DiskUse struct {
	// Bytes allocated on disk (st_blocks × 512; a sparse file counts what
	// it allocated, a preallocated one all it reserved), each inode once.
	Bytes int64
	// Files: the names of files, directories and every other entry,
	// each counted (a hard link is a name of its own: the walk's cost is
	// per name).
	Files int64
	// Unmeasured names, relative to the directory it is under, what the
	// walk could not enter (a directory it may not read, or deeper than
	// MaxDiskDepth) and why; "" when everything was measured. What cannot
	// be measured counts as over any limit: the agent could hide anything
	// there.
	Unmeasured string
	// Stopped: the walk stopped early, once past maxFiles names; Bytes
	// and Files are then what it had counted.
	Stopped bool
}

// MaxDiskDepth is how many directories deep a walk goes (one descriptor is
// open per level). Deeper is counted as unmeasured: real trees (even
// node_modules) stay well under it, and a chain built to be deeper than
// the path limit hides nothing.
const MaxDiskDepth = 256

// diskWalks bounds how many walks run at once, worker-wide: each costs a
// core and up to MaxDiskDepth descriptors.
var diskWalks = make(chan struct{}, 2)

// namesPerRead is how many directory entries a walk reads at a time: its
// memory per level is bounded by it (not by the size of a directory).
const namesPerRead = 128

// MeasureDisk walks dirs (missing ones count 0) and returns what they take.
// It walks by descriptors (openat beneath the directory before, never a
// path looked up again, never a symbolic link followed), so no depth of
// path hides anything from it; its memory is bounded by MaxDiskDepth ×
// namesPerRead names plus one entry per multiply linked file, whatever the
// tree holds. With maxFiles > 0 it stops once past that many names
// (Stopped), which bounds its cost. What it cannot open or stat (a
// directory of dirs included, but for one that does not exist) is
// Unmeasured.
func MeasureDisk(dirs []string, maxFiles int64) DiskUse {
	diskWalks <- struct{}{}
	defer func() { <-diskWalks }()
	w := diskWalk{max: maxFiles, linked: map[[2]uint64]bool{}}
	for _, dir := range dirs {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			w.use.Unmeasured = fmt.Sprintf("%s: %v", dir, err)
			break
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			w.use.Unmeasured = fmt.Sprintf("%s: %v", dir, err)
			break
		}
		w.count(&st)
		w.walk(fd, dir)
		if w.use.Stopped || w.use.Unmeasured != "" {
			break
		}
	}
	return w.use
}

// DiskUsage returns the bytes allocated on disk to the files under dirs,
// counting each inode once (hard links) and following no symbolic link. A
// missing directory counts 0. What it cannot enter is an error naming it
// (the bytes are then those it could count).
func DiskUsage(dirs ...string) (int64, error) {
	u := MeasureDisk(dirs, 0)
	if u.Unmeasured != "" {
		return u.Bytes, fmt.Errorf("not measured: %s", u.Unmeasured)
	}
	return u.Bytes, nil
}

type diskWalk struct {
	max    int64
	use    DiskUse
	linked map[[2]uint64]bool // multiply linked regular files seen
}

// count adds a name of st, and its bytes once per inode; false when the
// inode was seen before.
func (w *diskWalk) count(st *unix.Stat_t) bool {
	w.use.Files++
	if w.max > 0 && w.use.Files > w.max {
		w.use.Stopped = true
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
		k := [2]uint64{st.Dev, st.Ino}
		if w.linked[k] {
			return false
		}
		w.linked[k] = true
	}
	w.use.Bytes += st.Blocks * 512
	return true
}

// level is one open directory of a walk: its descriptor (owned by f), the
// names read from it not yet visited, and its own name.
type level struct {
	f     *os.File
	names []string
	name  string
}

// relPath names the directory at the top of stack relative to the walk's
// root, joined only when a message needs it (a deep chain's names are not
// copied per level).
func relPath(stack []*level, last string) string {
	parts := make([]string, 0, len(stack)+1)
	for _, l := range stack {
		parts = append(parts, l.name)
	}
	return shorten(filepath.Join(append(parts, last)...))
}

// walk counts everything beneath the open directory fd (which it closes),
// depth first, holding one descriptor per level.
func (w *diskWalk) walk(fd int, root string) {
	stack := []*level{{f: os.NewFile(uintptr(fd), root), name: "."}}
	defer func() {
		for _, l := range stack {
			l.f.Close()
		}
	}()
	for len(stack) > 0 && !w.use.Stopped && w.use.Unmeasured == "" {
		top := stack[len(stack)-1]
		if len(top.names) == 0 {
			names, err := top.f.Readdirnames(namesPerRead)
			if err != nil && err != io.EOF {
				w.use.Unmeasured = fmt.Sprintf("%s (%s): %v", relPath(stack, ""), root, unwrapErrno(err))
				return
			}
			if len(names) == 0 {
				top.f.Close()
				stack = stack[:len(stack)-1]
				continue
			}
			top.names = names
		}
		name := top.names[0]
		top.names = top.names[1:]
		dirfd := int(top.f.Fd())
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // gone since it was listed
			}
			w.use.Unmeasured = fmt.Sprintf("%s (%s): %v", relPath(stack, name), root, err)
			return
		}
		if !w.count(&st) || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		if len(stack) >= MaxDiskDepth {
			w.use.Unmeasured = fmt.Sprintf("%s (%s): deeper than %d directories", relPath(stack, name), root, MaxDiskDepth)
			return
		}
		cfd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				continue // replaced since it was looked at
			}
			w.use.Unmeasured = fmt.Sprintf("%s (%s): %v", relPath(stack, name), root, err)
			return
		}
		stack = append(stack, &level{f: os.NewFile(uintptr(cfd), name), name: name})
	}
}

// shorten keeps a name of a deep chain readable in a message.
func shorten(name string) string {
	const max = 160
	if len(name) <= max {
		return name
	}
	return name[:max/2] + "…" + name[len(name)-max/2:]
}

func unwrapErrno(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}
